"""bitparity.parallel.moe on gloo over 127.0.0.1 (spec 31.4): experts over 1, 2 and 4 ranks give the single-process
bits of bitparity.moe (computed in the parent), forward and backward: this rank's output rows and dx, the whole
router gradient on every rank, and each rank's experts' gate/up/down gradients.

The global batch has T = 75 tokens (three gradient blocks of spec 29.2, which straddle ranks), split unevenly and
with a rank holding none; the router makes expert 0 every token's first choice and expert 3 nobody's, so experts get
all, some and none of the tokens. Both routing modes (norm_topk_prob). One world per size, every check in it.
"""

import functools

import numpy as np
import pytest
import torch
import torch.distributed as dist

import bitparity
from bitparity import parallel
from tests.conftest import _checked
from tests.parallel import world as worlds

SPLITS = {1: [75], 2: [41, 34], 4: [20, 0, 37, 18]}          # tokens per rank
E, D, I, K = 4, 12, 6, 2
WORLD_BACKENDS = ("numpy", "cpu")
# One small case on each of the other two canonical backends, in the world of 2: (tokens, split, k, backward).
# The Triton interpreter takes about 0.8 s per linear call here (a forward and backward of 5 tokens makes 40), so
# cuda runs the forward of 3 tokens with k = 1; its backward's ops are the ones tests/backends compare.
SMALL = {"ascend": (5, [3, 2], 2, True), "cuda": (3, [2, 1], 1, False)}
MODES = (True, False)
GRADS = ("x", "router", "gate", "up", "down")


def _problem(tokens=75, dtype=torch.float32):
    """(x [T, D], router [E, D], gate [E, I, D], up [E, I, D], down [E, D, I] in dtype, upstream g [T, D])."""
    gen = torch.Generator().manual_seed(31)
    x = torch.randn(tokens, D, generator=gen)
    x[:, 0] = 2.0 + torch.rand(tokens, generator=gen)               # a common positive feature ...
    router = torch.randn(E, D, generator=gen) * 0.3
    router[0, 0], router[3, 0] = 4.0, -4.0                           # ... that expert 0 always wins, expert 3 never
    gate, up = torch.randn(E, I, D, generator=gen) * 0.4, torch.randn(E, I, D, generator=gen) * 0.4
    down = torch.randn(E, D, I, generator=gen) * 0.4
    return (*(t.to(dtype) for t in (x, router, gate, up, down)), torch.randn(tokens, D, generator=gen))


def _bits(t):
    """int32 patterns as a numpy array: a rank's tensors would reach the parent through shared memory that dies with
    the rank's process, numpy arrays are pickled whole."""
    t = t.detach().to(torch.float32)
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t).view(torch.int32).numpy().copy()


def _results(out, g, leaves, backward):
    """{"out": bits} and, after out.backward(g), {"x", "router", "gate", "up", "down": their gradients' bits}."""
    if not backward:
        return {"out": _bits(out)}
    out.backward(g)
    return {"out": _bits(out), **{name: _bits(t.grad) for name, t in zip(GRADS, leaves)}}


def _single(backend, norm, tokens=75, k=K, backward=True, dtype=torch.float32):
    """The single-process bits in the parent."""
    x, router, gate, up, down, g = _problem(tokens, dtype)
    leaves = [t.clone().requires_grad_(backward) for t in (x, router, gate, up, down)]
    return _results(bitparity.moe(*leaves, k, norm_topk_prob=norm, backend=backend), g, leaves, backward)


def _expert_parallel(rank, world, split, backend, norm, tokens=75, k=K, backward=True, dtype=torch.float32):
    """This rank's parallel.moe bits."""
    x, router, gate, up, down, g = _problem(tokens, dtype)
    start = sum(split[:rank])
    mine = slice(start, start + split[rank])
    first, stop = parallel.expert_range(E, world, rank)
    leaves = [t.clone().requires_grad_(backward) for t in (x[mine], router, gate[first:stop], up[first:stop],
                                                           down[first:stop])]
    out = parallel.moe(*leaves, k, norm_topk_prob=norm, backend=backend)
    return _results(out, g[mine], leaves, backward)


def _float_sum_of_partials(rank, world, split):
    """Negative control: each rank's single-process gradients of every weight from its own tokens, added across
    ranks by torch's all_reduce (float), as a data-parallel trainer without spec 28.1's fold would."""
    x, router, gate, up, down, g = _problem()
    start = sum(split[:rank])
    weights = [t.clone().requires_grad_(True) for t in (router, gate, up, down)]
    mine = slice(start, start + split[rank])
    if split[rank]:
        bitparity.moe(x[mine], *weights, K, backend="cpu").backward(g[mine])
    grads = torch.cat([(w.grad if w.grad is not None else torch.zeros_like(w)).reshape(-1) for w in weights])
    dist.all_reduce(grads)
    return _bits(grads)


def _call_errors(rank, world):
    """(type, message) of bad calls, each made on every rank (the group keeps working after each)."""
    x, router, gate, up, down, _ = _problem(8)
    first, stop = parallel.expert_range(E, world, rank)
    mine = (x, router, gate[first:stop], up[first:stop], down[first:stop])
    last = rank == world - 1
    odd_router = torch.randn(3, D)                                    # 3 experts over 2 or 4 ranks
    wide_gate = torch.randn(stop - first, I + 1, D)
    calls = {
        "experts": lambda: parallel.moe(x, odd_router, gate[:1], up[:1], down[:1], 1, backend="cpu"),
        "gate_shape": lambda: parallel.moe(*mine[:2], wide_gate if last else mine[2], *mine[3:], K, backend="cpu"),
        "router_values": lambda: parallel.moe(x, router + float(last), *mine[2:], K, backend="cpu"),
        "k": lambda: parallel.moe(*mine, K + int(last), backend="cpu"),
        "k_range": lambda: parallel.moe(*mine, E + 1, backend="cpu"),
    }
    return {name: worlds.outcome(call) for name, call in calls.items()}


def _rank(rank, world):
    """Every check of one world, on this rank."""
    split = SPLITS[world]
    out = {(backend, norm): _expert_parallel(rank, world, split, backend, norm)
           for backend in WORLD_BACKENDS for norm in MODES}
    out["float_sum"] = _float_sum_of_partials(rank, world, split)
    if world > 1:
        out["errors"] = _call_errors(rank, world)
    if world == 2:
        out.update({("small", backend): _expert_parallel(rank, world, split, backend, False, tokens, k, backward)
                    for backend, (tokens, split, k, backward) in SMALL.items()})
        out["bfloat16"] = _expert_parallel(rank, world, split, "cpu", True, dtype=torch.bfloat16)
    return out


@pytest.fixture(scope="module")
def results():
    for backend in (*WORLD_BACKENDS, *SMALL):
        _checked(backend)
    return {world: worlds.run(_rank, world) for world in SPLITS}


@functools.lru_cache(maxsize=None)
def _reference(backend, norm, tokens=75, k=K, backward=True, dtype=torch.float32):
    return _single(backend, norm, tokens, k, backward, dtype)


def _expected(ref, rank, world, split):
    """This rank's slice of the single-process bits."""
    start = sum(split[:rank])
    first, stop = parallel.expert_range(E, world, rank)
    rows = slice(start, start + split[rank])
    want = {"out": ref["out"][rows]}
    if "x" in ref:
        want.update({"x": ref["x"][rows], "router": ref["router"],
                     **{name: ref[name][first:stop] for name in ("gate", "up", "down")}})
    return want


def _assert_same(got, want, where):
    assert got.keys() == want.keys(), where
    for name in want:
        assert np.array_equal(got[name], want[name]), f"{where}: {name} differs from the single process"


@pytest.mark.parametrize("world", sorted(SPLITS))
@pytest.mark.parametrize("norm", MODES)
@pytest.mark.parametrize("backend", WORLD_BACKENDS)
def test_expert_parallel_moe_gives_the_single_process_bits(results, world, norm, backend):
    ref = _reference(backend, norm)
    for rank, got in enumerate(results[world]):
        _assert_same(got[(backend, norm)], _expected(ref, rank, world, SPLITS[world]), f"world {world} rank {rank}")


def test_the_batch_exercises_every_routing_case():
    """The test's premise: expert 0 chosen by every token, expert 3 by none, the others by some; gradients of an
    unchosen expert are -0.0, and blocks of 32 tokens straddle the ranks of every split."""
    x, router, *_ = _problem()
    chosen = bitparity.topk(bitparity.linear(x, router), K)[1]
    counts = torch.bincount(chosen.reshape(-1), minlength=E).tolist()
    assert counts[0] == 75 and counts[3] == 0 and 0 < counts[1] < 75 and 0 < counts[2] < 75
    assert (_reference("cpu", True)["gate"][3] == _bits(torch.tensor(-0.0))).all()
    for split in (SPLITS[2], SPLITS[4]):
        assert any(sum(split[:r]) % 32 for r in range(1, len(split)) if split[r])


@pytest.mark.parametrize("backend", sorted(SMALL))
def test_expert_parallel_moe_on_the_other_backends(results, backend):
    tokens, split, k, backward = SMALL[backend]
    ref = _reference(backend, False, tokens, k, backward)
    for rank, got in enumerate(results[2]):
        _assert_same(got[("small", backend)], _expected(ref, rank, 2, split), f"{backend} rank {rank}")


def test_bfloat16_weights_and_tokens_give_the_single_process_bits(results):
    """A bf16 model's block (hf.py passes bf16 tensors): upcast exactly; the gradients reach the bf16 leaves rounded
    once, as bitparity.moe's do."""
    ref = _reference("cpu", True, dtype=torch.bfloat16)
    for rank, got in enumerate(results[2]):
        _assert_same(got["bfloat16"], _expected(ref, rank, 2, SPLITS[2]), f"bfloat16 rank {rank}")


def test_float_all_reduce_of_partial_gradients_depends_on_the_world_size(results):
    """Negative control: the float sum of per-rank gradients is the single process's at one rank, not at two."""
    one, two = results[1][0]["float_sum"], results[2][0]["float_sum"]
    assert np.array_equal(one, np.concatenate([_reference("cpu", True)[n].reshape(-1) for n in GRADS[1:]]))
    assert not np.array_equal(one, two)


ERRORS = {   # name: (exception, fragments; {last} is the last rank, {w} the world size)
    "experts": ("ValueError", ["bitparity.parallel.moe: router's E = 3 experts must be divisible by the group's "
                               "size {w}"]),
    "gate_shape": ("ValueError", ["bitparity.parallel.moe: gate on rank {last} must have shape",
                                  f"I = {I} from rank 0's gate", f"got (", f"{I + 1}, {D})"]),
    "router_values": ("ValueError", ["bitparity.parallel.moe: router's values (it is replicated: the same bits on "
                                     "every rank) must be the same on every rank", "rank {last} has"]),
    "k": ("ValueError", [f"bitparity.parallel.moe: k must be the same on every rank; rank 0 has {K}, rank {{last}} "
                         f"has {K + 1}"]),
    "k_range": ("ValueError", [f"bitparity.parallel.moe: k must be in [1, {E}] (router's E experts); got {E + 1}"]),
}


@pytest.mark.parametrize("world", [2, 4])
def test_bad_calls_raise_the_same_error_on_every_rank(results, world):
    errors = [got["errors"] for got in results[world]]
    for name, (kind, fragments) in ERRORS.items():
        assert all(e[name] == errors[0][name] for e in errors), f"{name}: ranks disagree: {[e[name] for e in errors]}"
        got_kind, message = errors[0][name]
        assert got_kind == kind, (name, message)
        for fragment in fragments:
            assert fragment.format(last=world - 1, w=world) in message, (name, message)


@pytest.mark.parametrize("args, kind, fragment", [
    ((6, 4, 0), ValueError, "num_experts = 6 must be divisible by world_size = 4"),
    ((8, 4, 4), ValueError, "rank must be in [0, 3]"),
    ((8, 0, 0), ValueError, "world_size must be in [1, inf]"),
    ((8.0, 4, 0), TypeError, "num_experts must be an integer"),
])
def test_expert_range_refuses(args, kind, fragment):
    with pytest.raises(kind, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        parallel.expert_range(*args)


def test_expert_range_places_consecutive_experts():
    assert [parallel.expert_range(8, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
