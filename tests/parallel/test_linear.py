"""The tensor-parallel linear (spec 31.1, 31.2) on gloo over 127.0.0.1: at 1, 2 and 4 ranks, column- and
row-parallel, forward and backward (dx, dW, db) give the bits of the single-process bitparity.linear and its
autograd, computed here in the parent, on numpy and cpu (every case) and cuda (Triton interpreter) and ascend
(host emulation) (one small case at 2 ranks).

The inputs are adversarial for a sharded sum: a row whose shards' partial sums cancel to a tiny result, rows
whose largest exponent lies on one rank only, subnormal rows, all-zero shards and rows, NaN and inf in one rank's
shard, 37 token rows (a whole gradient block of 32 and a short one), uneven K shards, and bfloat16 inputs.
Negative control: torch's float all_reduce of per-rank float partials differs between 1 and 2 (and 4) ranks on the
same inputs.
"""

import numpy as np
import pytest
import torch
import torch.distributed as dist

import bitparity
from bitparity import parallel
from bitparity.backends import resolve
from bitparity.parallel import linear as tp_linear
from bitparity.reference import canonical
from tests.parallel import world as world_runner
from tests.parallel.world import outcome

M, K, N = 37, 24, 8
K_SPLITS = {1: [24], 2: [10, 14], 4: [3, 9, 1, 11]}       # uneven row-parallel shards of K
BACKENDS = ("numpy", "cpu")
SMALL_BACKENDS = ("cuda", "ascend")                      # one small case each, at 2 ranks
SMALL = (5, 8, 4)                                        # M, K, N of that case


def _adversarial(rows, red, cols, seed, specials):
    """a [rows, red], b [cols, red] whose products reduce over `red`, the dimension the ranks shard: row 0 of a
    against row 0 of b cancels across the halves of red to a tiny result; a's row 1 and b's row 2 have their
    largest exponent at one end only; a's row 2 is subnormal; a's row 3 is zero in its first half, row 4 all
    zero, b's row 1 all zero. With specials: +inf in the last quarter of a's row 5, NaN at the start of b's
    row 3, +inf and -inf at the two ends of a's row 6 (NaN against positive b), -inf in a's row 7 (NaN where b's
    entry is 0)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(rows, red, generator=g) * torch.exp2(torch.randint(-6, 7, (rows, red), generator=g).float())
    b = torch.randn(cols, red, generator=g)
    half = red // 2
    a[0] = 1.0
    big = torch.randn(half, generator=g).abs() * 2.0 ** 20
    b[0, :half], b[0, half:2 * half] = big, -big.flip(0)
    b[0, 1] += 2.0 ** -9
    a[1] = torch.randn(red, generator=g)
    a[1, -1] = 2.0 ** 40
    b[2, 0] = -(2.0 ** 33)
    a[2] = torch.randn(red, generator=g) * 2.0 ** -135
    a[3, :half] = 0.0
    a[4] = 0.0
    b[1] = 0.0
    if specials:
        a[5, red - 1 - red // 8] = float("inf")
        b[3, 0] = float("nan")
        b[4] = b[4].abs() + 0.5
        a[6, 0], a[6, -1] = float("inf"), float("-inf")
        a[7, 1] = float("-inf")
        b[5, 1] = 0.0
    return a, b


def _case(name):
    """(x [rows..., K], weight [N, K], bias [N], g [rows..., N]) for row- and column-parallel; "bf16" is the
    adversarial case with x, weight and bias rounded to bfloat16 (upcast exactly inside)."""
    if name == "bf16":
        return {layout: (x.bfloat16(), w.bfloat16(), b.bfloat16(), g)
                for layout, (x, w, b, g) in _case("adversarial").items()}
    m, k, n = SMALL if name == "small" else (M, K, N)
    specials = name == "specials"
    x, w = _adversarial(m, k, n, 1, specials)                        # row-parallel: the reduction is K
    gt, w_col = _adversarial(m, n, k, 2, specials)                   # column-parallel's dx: the reduction is N
    gen = torch.Generator().manual_seed(3)
    bias = torch.randn(n, generator=gen)
    g_row = torch.randn(m, n, generator=gen) * 1e3
    x_col = torch.randn(m, k, generator=gen)
    if name == "specials":
        x, g_row, x_col, gt = (t.reshape(1, m, -1) for t in (x, g_row, x_col, gt))   # leading dimensions
    return {"row": (x, w, bias, g_row), "column": (x_col, w_col.t().contiguous(), bias, gt)}


CASES = ("adversarial", "specials")


def _bits(t):
    t = t.detach().to(torch.float32)
    # numpy, not a tensor: a tensor crosses the result queue as shared memory that dies with the rank
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t).view(torch.int32).numpy().copy()


def _k_slices(world):
    starts = np.cumsum([0] + K_SPLITS[world])
    return [slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]


def _n_slices(world, n):
    return [slice(*parallel.shard_range(n, world, r)) for r in range(world)]


def _leaf(t):
    return t.clone().requires_grad_(True)


def _sharded(layout, rank, world, tensors, backend):
    """(y, dx, dW, db) of this rank's call, each as bits."""
    x, w, b, g = tensors
    if layout == "row":
        ks = _k_slices(world)[rank] if x.shape[-1] == K else slice(*parallel.shard_range(x.shape[-1], world, rank))
        xr, wr, br = _leaf(x[..., ks]), _leaf(w[:, ks]), _leaf(b)
        y = parallel.row_parallel_linear(xr, wr, br, backend=backend)
        y.backward(g)
    else:
        ns = _n_slices(world, w.shape[0])[rank]
        xr, wr, br = _leaf(x), _leaf(w[ns]), _leaf(b[ns])
        y = parallel.column_parallel_linear(xr, wr, br, backend=backend)
        y.backward(g[..., ns])
    return tuple(_bits(t) for t in (y, xr.grad, wr.grad, br.grad))


def _errors(rank, world):
    """What each rank raises when the last rank's shard does not fit, or disagrees with rank 0's."""
    last = rank == world - 1
    x, w = torch.ones(3, 4), torch.ones(2, 4)
    row, col = parallel.row_parallel_linear, parallel.column_parallel_linear
    out = {"row_k": outcome(lambda: row(x, torch.ones(2, 5) if last else w, backend="cpu")),
           "col_bias": outcome(lambda: col(x, w, torch.ones(3) if last else torch.ones(2), backend="cpu"))}
    out["native"] = outcome(lambda: row(x, w, backend="native"))
    wide = torch.zeros(1).expand(2, 1 << 26)                         # K_r = 2^26 without the memory
    out["k_total"] = outcome(lambda: row(wide[:1], wide, backend="cpu"))
    if world > 1:
        out["row_n"] = outcome(lambda: row(x, torch.ones(3, 4) if last else w, backend="cpu"))
        out["col_x"] = outcome(lambda: col(torch.ones(4, 4) if last else x, w, backend="cpu"))
        out["row_x"] = outcome(lambda: row(torch.ones(4, 4) if last else x, w, backend="cpu"))
    out["after"] = _bits(row(x, w, backend="cpu"))                      # the group still works
    return out


def _tp_world(rank, world):
    out = {}
    for backend in BACKENDS:
        for name in CASES:
            for layout, tensors in _case(name).items():
                out[backend, name, layout] = _sharded(layout, rank, world, tensors, backend)
    for layout, tensors in _case("bf16").items():
        out["cpu", "bf16", layout] = _sharded(layout, rank, world, tensors, "cpu")
    if world == 2:
        for backend in SMALL_BACKENDS:
            for layout, tensors in _case("small").items():
                out[backend, "small", layout] = _sharded(layout, rank, world, tensors, backend)
    # Negative control: per-rank float partials (the single-process linear of each shard) summed by all_reduce.
    x, w, _, _ = _case("adversarial")["row"]
    ks = _k_slices(world)[rank]
    partial = bitparity.linear(x[:, ks], w[:, ks], backend="cpu")
    dist.all_reduce(partial)
    out["float_all_reduce"] = _bits(partial)
    out["errors"] = _errors(rank, world)
    return out


@pytest.fixture(scope="module", params=(1, 2, 4))
def tp(request):
    return request.param, world_runner.run(_tp_world, request.param)


def _single(layout, tensors, backend):
    x, w, b, g = (_leaf(t) for t in tensors)
    y = bitparity.linear(x, w, b, backend=backend)
    y.backward(g)
    return y, x.grad, w.grad, b.grad


def _expected(layout, rank, world, tensors, backend):
    """The slice of the single-process (y, dx, dW, db) that rank holds."""
    y, dx, dw, db = _single(layout, tensors, backend)
    if layout == "row":
        k = tensors[0].shape[-1]
        ks = _k_slices(world)[rank] if k == K else slice(*parallel.shard_range(k, world, rank))
        return tuple(_bits(t) for t in (y, dx[..., ks], dw[:, ks], db))
    ns = _n_slices(world, tensors[1].shape[0])[rank]
    return tuple(_bits(t) for t in (y[..., ns], dx, dw[ns], db[ns]))


def test_ranks_give_the_single_process_bits(tp):
    world, results = tp
    keys = [(b, c, l) for b in BACKENDS for c in CASES for l in ("row", "column")]
    keys += [("cpu", "bf16", l) for l in ("row", "column")]
    keys += [(b, "small", l) for b in SMALL_BACKENDS for l in ("row", "column")] if world == 2 else []
    for backend, name, layout in keys:
        tensors = _case(name)[layout]
        for rank, result in enumerate(results):
            want = _expected(layout, rank, world, tensors, backend)
            for what, got, expected in zip(("y", "dx", "dW", "db"), result[backend, name, layout], want):
                assert np.array_equal(got, expected), (backend, name, layout, rank, what)


def test_the_adversarial_case_is_adversarial():
    """The inputs do what the module docstring says: float32 partials per shard lose the cancelled row, the
    single-process result there is tiny and exact-ish, and the specials case yields NaN and inf outputs."""
    x, w, _, _ = _case("adversarial")["row"]
    y = bitparity.linear(x, w, backend="cpu")
    exact = (x.double() @ w.double().t())[0, 0]
    assert abs(exact.item()) < 2.0 ** -6 and y[0, 0].item() == pytest.approx(exact.item(), rel=1e-6)
    assert x[1].abs().argmax().item() == K - 1 and w[2].abs().argmax().item() == 0
    xs, ws, _, _ = _case("specials")["row"]
    ys = bitparity.linear(xs.reshape(-1, K), ws, backend="cpu")
    assert torch.isnan(ys).any() and torch.isposinf(ys).any() and torch.isneginf(ys).any()


def test_float_all_reduce_is_not_the_single_process_bits(tp):
    world, results = tp
    x, w, _, _ = _case("adversarial")["row"]
    single = _bits(bitparity.linear(x, w, backend="cpu"))
    for result in results:
        if world == 1:
            assert np.array_equal(result["float_all_reduce"], single)
        else:
            assert not np.array_equal(result["float_all_reduce"], single)


def test_a_shard_that_does_not_fit_gives_every_rank_the_same_error(tp):
    world, results = tp
    last = world - 1
    fragments = {
        "row_k": ("ValueError", f"bitparity.parallel.row_parallel_linear: weight on rank {last} must have shape "
                                f"[N, K] with N >= 1 and K = x.shape[-1] = 4"),
        "col_bias": ("ValueError", f"bitparity.parallel.column_parallel_linear: bias on rank {last} must have "
                                   f"shape [2]"),
        "native": ("ValueError", "bitparity.parallel.row_parallel_linear: backend 'native' has no exact integer "
                                 "product"),
        "k_total": ("ValueError", f"the sharded dimension totals {world << 26} over the ranks; the exact sum "
                                  f"needs fewer than 2^26"),
        "row_n": ("ValueError", f"weight.shape[0] must be the same on every rank; rank 0 has 2, rank {last} has 3"),
        "row_x": ("ValueError", f"x's shape except its last dimension must be the same on every rank; rank 0 has "
                                f"(3,), rank {last} has (4,)"),
        "col_x": ("ValueError", f"x's shape must be the same on every rank; rank 0 has (3, 4), rank {last} has "
                                f"(4, 4)"),
    }
    for name in results[0]["errors"]:
        if name == "after":
            continue
        kinds = {r["errors"][name] for r in results}
        assert len(kinds) == 1, (name, kinds)                          # the same error on every rank
        kind, message = kinds.pop()
        assert kind == fragments[name][0] and fragments[name][1] in message, (name, message)
    want = _bits(bitparity.linear(torch.ones(3, 4 * world), torch.ones(2, 4 * world), backend="cpu"))
    assert all(np.array_equal(r["errors"]["after"], want) for r in results)


def test_round_is_canonical_round_scaled():
    """The rounding of the summed limbs (torch int64) against reference/canonical.py's round_scaled: random
    integers of every length, exponents across the subnormal, normal and overflow ranges, and exact ties."""
    rng = np.random.default_rng(0)
    hi = rng.integers(-(1 << 61), 1 << 61, 4000) >> rng.integers(0, 62, 4000)
    lo = rng.integers(0, 1 << 30, 4000)
    lo[:500] = 1 << 29                                                  # ties below the window's last bit
    hi[500:1000] = 0
    p = rng.integers(-260, 100, 4000)
    want = canonical.round_scaled(hi, lo, p).view(np.int32)
    got = tp_linear._round(torch.from_numpy(hi), torch.from_numpy(lo), torch.from_numpy(p)).view(torch.int32)
    assert np.array_equal(got.numpy(), want)


@pytest.mark.parametrize("backend", ("cpu", "cuda", "ascend"))
def test_linear_exact_is_the_reference_integer(backend):
    """Each backend's linear_exact (its own integer path) gives the reference's exact integer, limb for limb, on
    the adversarial inputs with NaN and inf rows (which contribute 0); the Triton interpreter takes the small
    shapes."""
    name = "small" if backend == "cuda" else "specials"
    for x, w, _, _ in _case(name).values():
        x = x.reshape(-1, x.shape[-1])
        want = resolve("numpy", x.device).linear_exact(x, w)
        assert torch.equal(resolve(backend, x.device).linear_exact(x, w), want)


@pytest.mark.parametrize("backend", ("cpu",))
def test_linear_exact_matches_the_reference_past_one_chunk(backend):
    """cpu's linear_exact (its int8 GEMMs, K cut into int32 chunks) equals the reference's exact integer for K
    beyond one chunk (131071 terms), with the largest digits everywhere."""
    k = 131075
    x = torch.full((2, k), -3.0)
    w = torch.full((3, k), 1.5)
    x[1, ::3] = 7.0
    want = resolve("numpy", x.device).linear_exact(x, w)
    assert torch.equal(resolve(backend, x.device).linear_exact(x, w), want)


def test_shard_range():
    assert [parallel.shard_range(12, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert parallel.shard_range(0, 2, 1) == (0, 0)
    with pytest.raises(ValueError, match="size must be a non-negative multiple of world_size 4; got 10"):
        parallel.shard_range(10, 4, 0)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\); got 2"):
        parallel.shard_range(4, 2, 2)
    with pytest.raises(TypeError, match="world_size must be an int; got float"):
        parallel.shard_range(4, 2.0, 0)
