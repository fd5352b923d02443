"""bitparity.distributed on gloo over 127.0.0.1: 1, 2 and 4 ranks give the single-process bits (spec 28).

Each world runs in its own spawned processes with a bounded join; the parent computes the single-process
ops on the global batch and compares bit patterns. Rows are split unevenly on purpose.
"""

import datetime
import functools
import math
import multiprocessing
import os
import queue
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist

import bitparity
from bitparity import autograd as _autograd
from bitparity import distributed
from bitparity.backends import resolve as _resolve

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
        if world == 1:
            out["table"] = {(index, backend): _outcome(lambda: row[0](backend))
                            for index, row in enumerate(TABLE) for backend in TABLE_BACKENDS}
        if world > 1:
            out["faults"] = _faults(rank, world)
            out["fold"] = _fold(rank, world)
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


def _outcome(call):
    try:
        call()
    except (TypeError, ValueError) as error:
        return type(error).__name__, str(error)
    return "no error", ""


def _params(shapes, dtype=torch.float32, device="cpu", sparse=False):
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype, device=device))
        p.grad = torch.ones(shape, dtype=dtype, device=device)
        p.grad = p.grad.to_sparse() if sparse else p.grad
        params.append(p)
    return params


# scenario: (rank 0 .. W-2's call, the last rank's call), each run on every rank before the next; each rank
# records what it raised, and the group must still work afterwards (the positive control _fold runs last).
def _fault_calls(x, mask, logp):
    fold, mean = distributed.fold_gradients, distributed.masked_mean
    return {
        "shape": (lambda: fold(_params([[4]])), lambda: fold(_params([[3]]))),
        "order": (lambda: fold(_params([[4], [3]])), lambda: fold(_params([[3], [4]]))),
        "count": (lambda: fold(_params([[4], [3]])), lambda: fold(_params([[4]]))),
        "empty": (lambda: fold(_params([[4]])), lambda: fold([])),
        "dtype": (lambda: fold(_params([[4]])), lambda: fold(_params([[4]], torch.bfloat16))),
        "meta_param": (lambda: fold(_params([[4]])), lambda: fold(_params([[4]], device="meta"))),
        "sparse_grad": (lambda: fold(_params([[4]])), lambda: fold(_params([[4]], sparse=True))),
        "meta_x": (lambda: mean(x, mask), lambda: mean(x.to("meta"), mask)),
        "sparse_x": (lambda: mean(x, mask), lambda: mean(x.to_sparse(), mask)),
        "mask_not_tensor": (lambda: mean(x, mask), lambda: mean(x, mask.tolist())),
        "whiten_dtype": (lambda: distributed.masked_whiten(x, mask),
                         lambda: distributed.masked_whiten(x.to(torch.bfloat16), mask)),
        "option": (lambda: distributed.ppo_policy_loss(logp, logp, x, mask, clip_low=0.2),
                   lambda: distributed.ppo_policy_loss(logp, logp, x, mask, clip_low=0.3)),
    }


FAULTS = {   # scenario: (exception, fragments; {last} is the last rank)
    "shape": ("ValueError", ["params[0]'s dtype, shape and device type must be the same on every rank",
                             "rank 0 has ('torch.float32', (4,), 'cpu'), rank {last} has ('torch.float32', (3,)"]),
    "order": ("ValueError", ["params[0]'s dtype, shape and device type", "rank {last} has ('torch.float32', (3,)"]),
    "count": ("ValueError", ["the number of parameters in params must be the same on every rank; rank 0 has 2, "
                             "rank {last} has 1"]),
    "empty": ("ValueError", ["the number of parameters in params", "rank 0 has 1, rank {last} has 0"]),
    "dtype": ("ValueError", ["params[0]'s dtype", "rank {last} has ('torch.bfloat16'"]),
    "meta_param": ("ValueError", ["params[0] on rank {last} must hold data; got a tensor on the meta device"]),
    "sparse_grad": ("TypeError", ["params[0].grad on rank {last} must be a dense (strided) tensor; got layout "
                                  "torch.sparse_coo"]),
    "meta_x": ("ValueError", ["masked_mean: x on rank {last} must hold data"]),
    "sparse_x": ("TypeError", ["masked_mean: x on rank {last} must be a dense (strided) tensor"]),
    "mask_not_tensor": ("TypeError", ["masked_mean: mask on rank {last} must be a torch.Tensor; got list"]),
    "whiten_dtype": ("ValueError", ["masked_whiten: x's dtype, trailing shape and device type must be the same",
                                    "rank {last} has ('torch.bfloat16'"]),
    "option": ("ValueError", ["ppo_policy_loss: clip_low must be the same on every rank; rank 0 has 0.2, "
                              "rank {last} has 0.3"]),
}


def _table_inputs():
    x, mask, logp, old_logp = _global_batch()
    return x[:2], mask[:2], logp[:2], old_logp[:2]


def _with_grad(p, grad):
    p.grad = grad
    return p


def _mean(backend, **changed):
    x, mask, _, _ = _table_inputs()
    kwargs = {"x": x, "mask": mask, **changed}
    return distributed.masked_mean(kwargs["x"], kwargs["mask"], backend=backend)


def _whiten(backend, **changed):
    x, mask, _, _ = _table_inputs()
    return distributed.masked_whiten(x, mask, backend=backend, **changed)


def _loss(backend, **changed):
    x, mask, logp, old_logp = _table_inputs()
    kwargs = {"logp": logp, "old_logp": old_logp, "advantages": x, "mask": mask, **changed}
    return distributed.ppo_policy_loss(**kwargs, backend=backend)


TABLE_BACKENDS = ("numpy", "cpu", "ascend", "cuda")    # every row raises before a kernel runs
TABLE = [  # (call on a backend, exception, message fragment naming the argument), on one rank (world 1)
    (lambda b: _mean(b, x=[1.0]), TypeError, "masked_mean: x on rank 0 must be a torch.Tensor; got list"),
    (lambda b: _mean(b, x=torch.tensor(1.0)), ValueError, "x on rank 0 must have at least one dimension"),
    (lambda b: _mean(b, x=torch.ones(2, T, dtype=torch.complex64)), TypeError, "x on rank 0 must have dtype one of"),
    (lambda b: _mean(b, x=torch.ones(2, T, device="meta")), ValueError, "x on rank 0 must hold data"),
    (lambda b: _mean(b, mask=torch.ones(2, T).to_sparse()), TypeError, "mask on rank 0 must be a dense (strided)"),
    (lambda b: _mean(b, mask=torch.ones(3, T, dtype=torch.bool)), ValueError,
     "x, mask must have the same number of rows on rank 0; got [2, 3]"),
    (lambda b: _mean(b, mask=torch.ones(2, T)), TypeError, "mask must have dtype torch.bool"),
    (lambda b: _mean(b, x=torch.ones(2, T, dtype=torch.int64)), TypeError, "x must be float32, bfloat16 or float16"),
    (lambda b: _whiten(b, eps=0.0), ValueError, "eps must be finite and in (0.0, inf)"),
    (lambda b: _whiten(b, eps=1e-45), ValueError, "eps must round to a normal float32"),
    (lambda b: _whiten(b, eps_mode="max"), ValueError, "eps_mode must be one of"),
    (lambda b: _whiten(b, shift_mean="yes"), TypeError, "shift_mean must be a bool"),
    (lambda b: _loss(b, logp=torch.zeros(2, T, 1)), ValueError, "logp must have shape [B, T]"),
    (lambda b: _loss(b, advantages=torch.zeros(2, T + 1)), ValueError, "advantages must have the shape of logp"),
    (lambda b: _loss(b, mask=torch.ones(2, T, dtype=torch.int64)), TypeError, "mask must have dtype torch.bool"),
    (lambda b: _loss(b, clip_low=1.0), ValueError, "clip_low must be in [0, 1)"),
    (lambda b: _loss(b, clip_high=math.nan), ValueError, "clip_high must be finite"),
    (lambda b: _loss(b, dual_clip=0.5), ValueError, "dual_clip must be finite and in (1.0, inf)"),
    (lambda b: _loss(b, ratio_clamp=0.0), ValueError, "ratio_clamp must be finite"),
    (lambda b: _loss(b, agg="sum"), ValueError, "agg must be one of"),
    (lambda b: distributed.fold_gradients(5, backend=b), TypeError,
     "params on rank 0 must be a tensor or an iterable of tensors; got int"),
    (lambda b: distributed.fold_gradients([torch.zeros(3, dtype=torch.float64)], backend=b), TypeError,
     "params[0] on rank 0 must have dtype one of torch.float32, torch.bfloat16, torch.float16; got torch.float64"),
    (lambda b: distributed.fold_gradients([torch.zeros(3), "w"], backend=b), TypeError,
     "params[1] on rank 0 must be a torch.Tensor; got str"),
    (lambda b: distributed.fold_gradients(_params([[3]], device="meta"), backend=b), ValueError,
     "params[0] on rank 0 must hold data"),
    (lambda b: distributed.fold_gradients(_params([[3]], sparse=True), backend=b), TypeError,
     "params[0].grad on rank 0 must be a dense (strided) tensor"),
    (lambda b: distributed.fold_gradients([_with_grad(torch.zeros(3, requires_grad=True), torch.ones(3)),
                                           torch.zeros(2, device="meta")], backend=b), ValueError,
     "params[1] on rank 0 must hold data"),
]


def _faults(rank, world):
    """{scenario: (exception name, message)} of this rank, the last rank passing what the others do not."""
    x, mask, logp, _ = _global_batch()
    calls = _fault_calls(x[:2], mask[:2], logp[:2])
    return {name: _outcome(pair[rank == world - 1]) for name, pair in calls.items()}


def _rank_gradients(rank, shapes):
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(shape, generator=g) * 10 ** (rank - 1) for shape in shapes]


FOLD_SHAPES = ([5, 3], [7], [1])


def _fold(rank, world):
    """The positive control after the faults: fold_gradients still runs, the last parameter without a gradient
    on rank 0 (it counts as -0.0 there)."""
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in FOLD_SHAPES]
    for p, grad in zip(params, _rank_gradients(rank, FOLD_SHAPES)):
        p.grad = grad
    if rank == 0:
        params[-1].grad = None
    distributed.fold_gradients(params, backend="cpu")
    return [_bits(p.grad) for p in params]


@functools.lru_cache(maxsize=None)
def _run(world):
    ctx = multiprocessing.get_context("spawn")
    results, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_worker, args=(rank, world, port, results), daemon=True) for rank in range(world)]
    for p in procs:
        p.start()
    got, waited = {}, 0
    try:
        while len(got) < world:
            try:
                rank, out = results.get(timeout=1)
                got[rank] = out
            except queue.Empty:
                waited += 1
                # A rank that died without reporting (a SIGABRT in gloo) fails the test now, not at JOIN_S.
                dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode not in (None, 0)]
                if dead or waited >= JOIN_S:
                    pytest.fail(f"world {world}: only ranks {sorted(got)} reported within {waited} s; "
                                f"exit codes {[p.exitcode for p in procs]}")
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
        assert "x's dtype, trailing shape and device type must be the same on every rank" in out["mismatch_error"], \
            (rank, out)


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("scenario", sorted(FAULTS))
def test_bad_arguments_raise_the_same_error_on_every_rank(size, scenario):
    """Mismatched parameter lists (shape, order, count, dtype, none), meta and sparse tensors, a non-tensor and
    a differing option on the last rank only: every rank raises the same named error, none aborts or hangs."""
    kind, fragments = FAULTS[scenario]
    outcomes = {rank: out["faults"][scenario] for rank, out in _run(size).items()}
    assert len(outcomes) == size and len(set(outcomes.values())) == 1, outcomes
    name, message = outcomes[0]
    assert name == kind, message
    for fragment in fragments:
        assert fragment.format(last=size - 1) in message, message


@pytest.mark.parametrize("backend", TABLE_BACKENDS)
@pytest.mark.parametrize("index", range(len(TABLE)))
def test_a_bad_argument_is_named(index, backend):
    """One row of the table: run in the one-rank world's process, so the group is initialised."""
    _, kind, fragment = TABLE[index]
    name, message = _run(1)[0]["table"][(index, backend)]
    assert name == kind.__name__ and fragment in message, (name, message)


@pytest.mark.parametrize("size", [2, 4])
def test_fold_gradients_is_the_row_fold_of_the_ranks_after_the_faults(size):
    rows = [_rank_gradients(rank, FOLD_SHAPES) for rank in range(size)]
    rows[0][-1] = torch.full(FOLD_SHAPES[-1], -0.0)                  # rank 0 has no gradient there
    want = [_bits(_autograd.row_fold(_resolve("cpu", torch.device("cpu")),
                                     torch.stack([r[i].reshape(-1) for r in rows])).reshape(FOLD_SHAPES[i]))
            for i in range(len(FOLD_SHAPES))]
    naive = [_bits(sum(r[i] for r in rows)) for i in range(len(FOLD_SHAPES))]  # torch's left-to-right adds
    for rank, out in _run(size).items():
        for i, bits in enumerate(want):
            np.testing.assert_array_equal(out["fold"][i], bits, err_msg=f"params[{i}] rank {rank}")
    if size == 4:                                                     # the control: the order shows in the bits
        assert any(not np.array_equal(w, n) for w, n in zip(want, naive))


def test_dead_rank_fails_the_others_clearly():
    assert "bitparity.distributed.masked_mean" in _run(2)[0]["dead_rank_error"]


def test_uninitialised_group_is_named():
    with pytest.raises(ValueError, match="not initialised"):
        distributed.masked_mean(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool))
