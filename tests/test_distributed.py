"""bitparity.distributed on gloo over 127.0.0.1: 1, 2 and 4 ranks give the single-process bits (spec 28).

Each world runs in its own spawned processes with a bounded join; the parent computes the single-process
ops on the global batch and compares bit patterns. Rows are split unevenly on purpose.
"""

import datetime
import functools
import multiprocessing
import os
import queue
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist

import bitparity
from bitparity import distributed

SPLITS = {1: [9], 2: [4, 5], 4: [3, 0, 4, 2]}     # rows per rank (one with none); 9 sequences of T = 300 > 1,024 lanes
T = 300
AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
JOIN_S = 120


def _global_batch():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(9, T, generator=g) * 3 + 0.5
    mask = torch.rand(9, T, generator=g) < 0.8
    mask[2] = False                                                   # an empty sequence (seq-mean modes skip it)
    logp = -torch.rand(9, T, generator=g) * 4
    old_logp = logp + torch.randn(9, T, generator=g) * 0.3
    return x, mask, logp, old_logp


def _bits(t):
    t = t.detach().to(torch.float32)
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t).view(torch.int32).numpy().copy()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    try:
        x, mask, logp, old_logp = _global_batch()
        start = sum(SPLITS[world][:rank])
        mine = slice(start, start + SPLITS[world][rank])
        out = {"mean": _bits(distributed.masked_mean(x[mine], mask[mine], backend="cpu")),
               "whiten": _bits(distributed.masked_whiten(x[mine], mask[mine], backend="cpu")),
               "whiten_clamp": _bits(distributed.masked_whiten(x[mine], mask[mine], unbiased=False, eps_mode="clamp",
                                                               backend="cpu"))}
        for agg in AGGS:
            local = logp[mine].clone().requires_grad_(True)
            loss, frac = distributed.ppo_policy_loss(local, old_logp[mine], x[mine], mask[mine], agg=agg,
                                                     backend="cpu")
            loss.backward()
            out[agg] = (_bits(loss), _bits(frac), _bits(local.grad))
        # Negative control: torch's all-reduce of local canonical sums is not the single-process order.
        local_sum = (bitparity.sum(x[mine], mask[mine], backend="cpu").sum().reshape(1) if SPLITS[world][rank]
                     else torch.zeros(1))
        total = torch.cat([local_sum, mask[mine].sum().reshape(1).to(torch.float32)])
        dist.all_reduce(total)
        out["allreduce_mean"] = _bits(total[0] / total[1])
        try:
            wrong = x[mine] if rank == 0 else torch.zeros(SPLITS[world][rank], T + 1)
            distributed.masked_mean(wrong, mask[mine] if rank == 0 else torch.ones(wrong.shape, dtype=torch.bool))
        except ValueError as error:
            out["mismatch_error"] = str(error)
        if world == 2:
            dist.barrier()
            if rank == 1:                                                 # a rank that dies
                results.put((rank, out))
                results.close()
                results.join_thread()
                os._exit(0)
            try:
                distributed.masked_mean(x[mine], mask[mine])
            except RuntimeError as error:
                out["dead_rank_error"] = str(error)
        results.put((rank, out))
    finally:
        if world != 2:
            dist.destroy_process_group()


@functools.lru_cache(maxsize=None)
def _run(world):
    ctx = multiprocessing.get_context("spawn")
    results, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_worker, args=(rank, world, port, results), daemon=True) for rank in range(world)]
    for p in procs:
        p.start()
    got = {}
    try:
        while len(got) < world:
            rank, out = results.get(timeout=JOIN_S)
            got[rank] = out
    except queue.Empty:
        pytest.fail(f"world {world}: only ranks {sorted(got)} reported within {JOIN_S} s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return got


@pytest.fixture(scope="module", params=sorted(SPLITS))
def world(request):
    return request.param, _run(request.param)


def test_reductions_match_one_process(world):
    size, got = world
    x, mask, logp, old_logp = _global_batch()
    want_mean = _bits(bitparity.masked_mean(x, mask, backend="cpu"))
    want = {"whiten": _bits(bitparity.masked_whiten(x, mask, backend="cpu")),
            "whiten_clamp": _bits(bitparity.masked_whiten(x, mask, unbiased=False, eps_mode="clamp", backend="cpu"))}
    rows = np.cumsum([0] + SPLITS[size])
    for rank, out in got.items():
        np.testing.assert_array_equal(out["mean"], want_mean)
        for name, bits in want.items():
            np.testing.assert_array_equal(out[name], bits[rows[rank]:rows[rank + 1]], err_msg=f"{name} rank {rank}")


def test_ppo_loss_and_gradient_match_one_process(world):
    size, got = world
    x, mask, logp, old_logp = _global_batch()
    rows = np.cumsum([0] + SPLITS[size])
    for agg in AGGS:
        full = logp.clone().requires_grad_(True)
        loss, frac = bitparity.ppo_policy_loss(full, old_logp, x, mask, agg=agg, backend="cpu")
        loss.backward()
        for rank, out in got.items():
            got_loss, got_frac, got_grad = out[agg]
            np.testing.assert_array_equal(got_loss, _bits(loss), err_msg=f"{agg} rank {rank}")
            np.testing.assert_array_equal(got_frac, _bits(frac))
            np.testing.assert_array_equal(got_grad, _bits(full.grad)[rows[rank]:rows[rank + 1]])


def test_torch_all_reduce_is_not_world_size_invariant():
    """The negative control: summing per-rank partials with all_reduce changes bits with the world size."""
    x, mask, _, _ = _global_batch()
    single = _bits(bitparity.masked_mean(x, mask, backend="cpu"))
    assert not np.array_equal(_run(4)[0]["allreduce_mean"], single)


@pytest.mark.parametrize("size", [2, 4])
def test_mismatched_shapes_raise_on_every_rank(size):
    for rank, out in _run(size).items():
        assert "x must have the same dtype and trailing shape on every rank" in out["mismatch_error"], (rank, out)


def test_dead_rank_fails_the_others_clearly():
    assert "bitparity.distributed.masked_mean" in _run(2)[0]["dead_rank_error"]


def test_uninitialised_group_is_named():
    with pytest.raises(ValueError, match="not initialised"):
        distributed.masked_mean(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool))
