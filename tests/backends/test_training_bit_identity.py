"""The training kernels (spec 29): every canonical backend gives the numpy backend's bits, called through the contract.

Each of the seven contract names (docs/backend-contract.md, "Training (spec 29)") is called, as ops.py and
autograd.py call it, on one table of small cases where the order shows: row folds over R = 1, 3, 4, 5, 8, 17
rows, over sparse positions that do not start at 0 and arrive in any order, segments without rows or sharing
positions, no rows at all, F = 1100 (column blocks of the cpu and ascend folds ending part-way); weight gradients
from one product to K = 300 (two ascend k tiles) with panels and tiles ending part-way; attention causal and not,
with kv_lengths < Tk (NaN and inf past them, never read), Tq = Tk = 1, Tq < Tk, Tq > Tk, D = 16, 20 and 64, one
to three groups, keys past one lane block (Tk = 1100) and queries past one (Tq = 1030, the per-key sums);
special values (NaN, +-inf, +-0, subnormals, overflowing squares) in every op. The numpy backend's result of each
case is computed once and shared by every backend, build, thread count, core count and tile; floats are compared
as int32 bits after NaN canonicalisation.

Then the moe block's routing without renormalisation (norm_topk_prob=False, spec 24.6 and 29.7) through the
public API and autograd: its output and the gradients of x and all four weights, on cases with k = 1, k = E and
an expert no token chooses, against the numpy backend's bits; and a negative control: True gives other bits.

Then what only one backend has: every cpu ISA build and thread count, one emulated ascend core and the ascend
kernels' UB limits, the cuda row fold's block and its product tiles shrunk. Negative controls show the cases
tell orders apart: a row fold added left to right, torch's g^T x and torch's autograd of rms_norm all differ.
"""

import functools

import numpy as np
import pytest
import torch

import bitparity as bp
from bitparity.backends import _module, cpu
from bitparity.backends.ascend import host_emulation
from bitparity.backends.cuda import layout
from bitparity.compare.metrics import canonical_bits

F32 = np.float32
OPS = ("fold_rows", "weight_grad", "rms_norm_backward", "silu_mul_backward", "attention_backward", "adamw_step",
       "sgd_step")
SPECIALS = (np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e38)
CPU_LEVELS = tuple(range(cpu.isa_level() + 1))
# The Triton interpreter takes about 20 s over the causal 1030 x 1030 attention, two thirds of this file. The
# ascend kernel skips the chunks of queries before a key's first counted one (the keys from 1024 on skip one);
# cuda's key kernel masks every chunk by i >= first (attention.py), so for it the non-causal Tq = 1030 case
# already takes the per-key sums past one lane block.
CUDA_OMITTED = {"attention_backward": ("G=1 Tq=1030 Tk=1030 D=4 causal=True kv_lengths=[1030]",)}


def f32(value):
    return float(F32(value))


def _values(rng, *shape, specials=False):
    """Normal values over eight decades (so that each order of the same additions rounds differently), and with
    specials, SPECIALS along the last axis of the first row."""
    x = rng.standard_normal(shape) * 10.0 ** rng.integers(-4, 4, shape)
    if specials:
        x.reshape(-1, shape[-1])[0, :len(SPECIALS)] = SPECIALS[:shape[-1]]
    return torch.from_numpy(x.astype(F32))


def _index(values):
    return torch.tensor(values, dtype=torch.int64)


def _dense(rows):
    """One segment, row i at position i."""
    return torch.zeros(rows, dtype=torch.int64), torch.arange(rows)


def _fold_calls(rng):
    out = []
    for rows in (1, 3, 5, 8, 17):
        out.append((f"R={rows}", (_values(rng, rows, 7, specials=rows == 5), *_dense(rows), rows, 1)))
    # The tree pairs (1e8 + 1) + (-1e8 + 1) = 1e8 - 1e8 = 0, where adding in sequence gives 1.
    out.append(("cancellation", (torch.tensor([[1e8], [1.0], [-1e8], [1.0]]), *_dense(4), 4, 1)))
    # Five segments (segment 3 has no row), positions shuffled with gaps within 40 slots.
    segments = torch.from_numpy(rng.choice([0, 1, 2, 4], 23))
    positions = torch.from_numpy(rng.permutation(40)[:23])
    out.append(("segments, sparse shuffled positions, F=1100", (_values(rng, 23, 1100), segments, positions, 40, 5)))
    # Segments 2 and 3 both hold position 22, segment 3 only there (the last leaf), segment 1 no row; a row of -0.0.
    c = _values(rng, 13, 5)
    c[4] = -0.0
    out.append(("segments sharing a position", (c, _index([0, 2, 0, 4, 2, 0, 3, 4, 2, 0, 4, 4, 2]),
                                                _index([5, 1, 6, 2, 22, 17, 22, 3, 9, 7, 0, 20, 10]), 23, 5)))
    # One segment at positions 6 ... 27 of 29, unordered; a column of -0.0 leaves and one of mixed zero signs.
    c = _values(rng, 9, 4)
    c[:, 0] = -0.0
    c[::2, 1] = 0.0
    c[1::2, 1] = -0.0
    out.append(("sparse positions from 6, zero signs",
                (c, torch.zeros(9, dtype=torch.int64), torch.from_numpy(rng.permutation(22)[:9] + 6), 29, 1)))
    out.append(("no rows", (torch.empty(0, 3), _index([]), _index([]), 4, 2)))
    return out


def _weight_grad_calls(rng):
    out = [("one product", (_values(rng, 1, 1), _values(rng, 1, 1), torch.arange(1), 1))]
    for m in (1, 3, 5, 8, 17):
        # K = 37, N = 9: cpu panels of 16 and tiles of 4, an ascend tile of 9 rows of n by 40 columns of k, each
        # ending part-way
        out.append((f"M={m}", (_values(rng, m, 37, specials=m == 5), _values(rng, m, 9), torch.arange(m), m)))
    # K = 300: ascend k tiles of 256 and 44; N = 6 > 1024 / 256 = 4 rows of n per tile
    out.append(("M=7 K=300 N=6", (_values(rng, 7, 300), _values(rng, 7, 6), torch.arange(7), 7)))
    # Spec 29.2's blocks of 32 rows: four blocks, the last of 4 rows, one holding specials; and 40 rows spread
    # over 200 positions, blocks without rows between them (-0.0 leaves of the fold)
    out.append(("M=100 blocks", (_values(rng, 100, 37, specials=True), _values(rng, 100, 9), torch.arange(100), 100)))
    positions = torch.from_numpy(np.sort(rng.choice(np.arange(200), 40, replace=False)))
    out.append(("M=40 blocks in 200", (_values(rng, 40, 6), _values(rng, 40, 3), positions, 200)))
    # An expert's rows in a MoE: the tokens that chose it, from position 3 to the last of rows.
    for m, rows in ((6, 20), (11, 1000)):
        positions = torch.from_numpy(np.append(np.sort(rng.choice(np.arange(3, rows - 1), m - 1, replace=False)),
                                               rows - 1))
        out.append((f"M={m} sparse in {rows}",
                    (_values(rng, m, 20), _values(rng, m, 5, specials=m == 6), positions, rows)))
    return out


def _rms_norm_calls(rng):
    out = [("[1, 1]", (_values(rng, 1, 1), _values(rng, 1), f32(1e-6), _values(rng, 1, 1)))]
    for rows, d in ((5, 33), (3, 64), (2, 1100)):
        x = _values(rng, rows, d)
        x[0] = 0.0                                   # ms = 0: r = rsqrt(eps)
        x[1, :3] = torch.tensor([1e20, -3e19, 7.0])  # squares overflow: r = 0
        out.append((f"[{rows}, {d}]", (x, _values(rng, d), f32(1e-6), _values(rng, rows, d))))
    x = _values(rng, 4, 8)
    x[0, 1], x[1, 2], x[2, 3] = np.inf, np.nan, -np.inf
    out.append(("specials", (x, _values(rng, 8), f32(1e-5), _values(rng, 4, 8, specials=True))))
    # Signed zeros, an infinity, a NaN, subnormal squares, squares overflowing to inf, large finite squares.
    x = torch.tensor([[0.0, -0.0, 0.0, 0.0], [np.inf, 1.0, 1.0, 1.0], [np.nan, 1.0, 2.0, 3.0],
                      [1e-40, -1e-40, 1e-39, 0.0], [3e38, 3e38, 1.0, -1.0], [1e18, -2e18, 3e17, 1.0]])
    out.append(("special rows", (x, torch.tensor([1.0, -2.0, 0.5, 3.0]), f32(1e-6), _values(rng, 6, 4))))
    return out


def _silu_mul_calls(rng):
    # 1100 elements: two element tiles of the ascend kernel; the gates around exp's overflow and underflow
    gate = torch.cat([torch.from_numpy((rng.standard_normal(1100) * 8).astype(F32)),
                      torch.tensor([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e-3, 1.0, -1.0, 20.0, -20.0,
                                    87.0, -87.0, 88.0, -88.0, 100.0, -100.0, 200.0, -200.0, 3e38, -3e38])])
    n = gate.numel()
    return [(f"n={n}", (gate, _values(rng, n), _values(rng, n))),
            ("up and upstream specials",
             (gate, _values(rng, n, specials=True), torch.from_numpy(np.resize(np.array(SPECIALS, F32), n))))]


def _attention_calls(rng):
    out = []
    # (groups, Tq, Tk, D, causal, kv_lengths)
    for groups, tq, tk, d, causal, lengths in ((1, 1, 1, 16, False, [1]), (1, 5, 5, 16, True, [5]),
                                               (1, 1, 12, 64, True, [10]), (2, 3, 7, 64, True, [7, 4]),
                                               (3, 4, 9, 16, False, [9, 6, 1]), (2, 6, 3, 20, False, [3, 2]),
                                               (1, 2, 1100, 16, True, [1050]), (1, 1030, 2, 4, False, [2]),
                                               (1, 1030, 1030, 4, True, [1030])):
        q, k, v = (torch.from_numpy(rng.standard_normal((groups, t, d)).astype(F32)) for t in (tq, tk, tk))
        g = _values(rng, groups, tq, d)
        for i, length in enumerate(lengths):         # cache slots past kv_lengths hold garbage, never read
            k[i, length:] = np.nan
            v[i, length:] = np.inf
        out.append((f"G={groups} Tq={tq} Tk={tk} D={d} causal={causal} kv_lengths={lengths}",
                    (q, k, v, torch.tensor(lengths), causal, f32(1.0 / np.sqrt(d)), g)))
    return out


def _adamw_calls(rng):
    n = 1100
    w, g, m = _values(rng, n), _values(rng, n, specials=True), _values(rng, n)
    v = torch.from_numpy(np.abs(rng.standard_normal(n) * 10.0 ** rng.integers(-12, 2, n)).astype(F32))
    v[:5] = torch.tensor([0.0, 1e-40, 1e-30, 3e38, np.inf])  # v = 0 (den = eps), subnormal, tiny, huge, inf
    m[len(SPECIALS)] = np.nan
    out = []
    for t, decay in ((1, None), (7, f32(1.0 - 1e-3 * 0.1))):
        bc1, bc2 = 1.0 - 0.9 ** t, 1.0 - 0.999 ** t
        host = (f32(0.9), f32(1 - 0.9), f32(0.999), f32(1 - 0.999), f32(1 / np.sqrt(bc2)), f32(1e-8), f32(1e-3 / bc1))
        out.append((f"step {t} decay={decay}", (w, g, m, v, decay, *host)))
    # spec 29.12's scaled square (g * g overflows from 2^64; the term c2 * g^2 from about 5.8e20) and recip's
    # ends (spec 29.11): den = eps32 = 2^-126, den >= 2^127 (e = 127), +inf, NaN
    big = torch.tensor([2.0 ** 64, -2.0 ** 64, np.nextafter(F32(2.0 ** 64), F32(0)), 1e20, -1e20, 5e20, 5.9e20,
                        7e20, 3e38, np.inf, -np.inf, np.nan, 1.0, 0.0], dtype=torch.float32)
    g_big = big.repeat(-(-n // big.numel()))[:n]
    for eps in (2.0 ** -126, 3e38):
        host = (f32(0.9), f32(1 - 0.9), f32(0.999), f32(1 - 0.999), f32(1 / np.sqrt(1 - 0.999)), f32(eps),
                f32(1e-3 / (1 - 0.9)))
        out.append((f"overflowing squares eps={eps}", (w, g_big, m, v, None, *host)))
    return out


def _sgd_calls(rng):
    n = 1100
    w, g, buf = _values(rng, n), _values(rng, n, specials=True), _values(rng, n)
    buf[len(SPECIALS)] = np.nan
    out = [("plain", (w, g, None, f32(0.01), 0.0, 1.0, 0.0, False)),
           ("weight decay without momentum", (w, g, None, f32(0.01), 0.0, 1.0, f32(1e-2), False))]
    for first in (True, False):
        for momentum, dampening, weight_decay, nesterov in ((0.9, 0.0, 0.0, False), (0.9, 0.1, 1e-2, False),
                                                            (0.5, 0.0, 1e-4, True)):
            out.append((f"first={first} momentum={momentum} dampening={dampening} weight_decay={weight_decay} "
                        f"nesterov={nesterov}",
                        (w, g, None if first else buf, f32(0.01), f32(momentum), f32(1.0 - dampening),
                         f32(weight_decay), nesterov)))
    return out


@functools.cache
def calls():
    """op -> [(label, contract arguments)]."""
    rng = np.random.default_rng(29)
    return {"fold_rows": _fold_calls(rng), "weight_grad": _weight_grad_calls(rng),
            "rms_norm_backward": _rms_norm_calls(rng), "silu_mul_backward": _silu_mul_calls(rng),
            "attention_backward": _attention_calls(rng), "adamw_step": _adamw_calls(rng), "sgd_step": _sgd_calls(rng)}


def _case(op, label):
    """(i, arguments) of the call of op labelled label."""
    i = [name for name, _ in calls()[op]].index(label)
    return i, calls()[op][i][1]


def _results(result):
    return result if isinstance(result, tuple) else (result,)


@functools.cache
def want(op, i):
    """The numpy backend's results of call i of op as canonical bits, None (sgd's buffer without momentum) kept."""
    return tuple(None if r is None else canonical_bits(r)
                 for r in _results(getattr(_module("numpy"), op)(*calls()[op][i][1])))


def assert_calls_match(op, fn, omitted=()):
    """fn(*args) gives, for every call of op but those labelled in omitted, float32 results of the numpy backend's
    shapes and bits (and None where it gives None); reports every mismatching call."""
    failures = []
    for i, (label, args) in enumerate(calls()[op]):
        if label in omitted:
            continue
        got, expected = _results(fn(*args)), want(op, i)
        if len(got) != len(expected):
            failures.append(f"{label}: {len(got)} results, want {len(expected)}")
        for k, (g, w) in enumerate(zip(got, expected)):
            same = g is None if w is None else (g is not None and g.dtype == torch.float32 and g.shape == w.shape
                                                 and torch.equal(canonical_bits(g), w))
            if not same:
                failures.append(f"{label} result {k}")
    assert not failures, f"{op}: " + "; ".join(failures)


@pytest.mark.parametrize("op", OPS)
def test_training_op_matches_numpy(backend, op):
    assert_calls_match(op, getattr(_module(backend), op), CUDA_OMITTED.get(op, ()) if backend == "cuda" else ())


# -- moe without renormalisation: the composite's forward and backward -------------------------------

# (tokens, D, I, experts, top_k): k = 2 of 5 with expert 4 never chosen (its logits far below), k = E, k = 1
MOE_CASES = ((9, 12, 5, 5, 2), (4, 8, 3, 3, 3), (6, 8, 3, 4, 1))


@functools.cache
def _moe_inputs(case):
    """(x, router, gate, up, down), upstream gradient; unit normal, the expert weights scaled by 0.3."""
    m, d, inter, experts, _ = case
    rng = np.random.default_rng(list(case))
    x, router = (torch.from_numpy(rng.standard_normal(shape).astype(F32)) for shape in ((m, d), (experts, d)))
    if experts == 5:                 # logits near 6 for experts 0-3, near -6 for expert 4: never chosen, p_4 > 0
        x[:, 0], router[:, 0] = 3.0, torch.tensor([2.0, 2.0, 2.0, 2.0, -2.0])
        router[:, 1:] *= 0.3
    weights = [torch.from_numpy((rng.standard_normal(shape) * 0.3).astype(F32))
               for shape in ((experts, inter, d), (experts, inter, d), (experts, d, inter))]
    return (x, router, *weights), torch.from_numpy(rng.standard_normal((m, d)).astype(F32))


def moe_bits(backend, case, norm_topk_prob=False):
    """(out, dx, drouter, dgate, dup, ddown) of bitparity.moe on backend, as int32 bits."""
    inputs, g = _moe_inputs(case)
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = bp.moe(*leaves, case[-1], norm_topk_prob=norm_topk_prob, backend=backend)
    out.backward(g)
    return tuple(t.detach().view(torch.int32) for t in (out, *(leaf.grad for leaf in leaves)))


@functools.cache
def moe_want(case, norm_topk_prob=False):
    return moe_bits("numpy", case, norm_topk_prob)


@pytest.mark.parametrize("case", MOE_CASES, ids=lambda c: "M={} D={} I={} E={} k={}".format(*c))
def test_moe_without_renormalisation_matches_numpy(backend, case):
    names = ("out", "dx", "drouter", "dgate", "dup", "ddown")
    got = moe_bits(backend, case)
    assert [name for name, a, b in zip(names, got, moe_want(case)) if not torch.equal(a, b)] == []


def test_moe_without_renormalisation_differs_from_the_default():
    """norm_topk_prob=False is a different block: other output bits and other router gradients (for k < E); an
    expert no token chose still gets a router gradient (the softmax over all experts reads its logit), and -0.0
    in its own weights."""
    case = MOE_CASES[0]
    plain, normalised = moe_want(case), moe_want(case, True)
    for i in (0, 1, 2):                                          # out, dx, drouter
        assert not torch.equal(plain[i], normalised[i])
    assert (normalised[2][4].view(torch.float32) == 0).all() and (plain[2][4].view(torch.float32) != 0).all()
    negative_zero = torch.tensor(-0.0).view(torch.int32)
    assert all((grad[4] == negative_zero).all() for grad in plain[3:])


# -- What one backend has ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("level", CPU_LEVELS, ids=lambda level: cpu.ISA_BUILDS[level][0])
def test_every_cpu_build_gives_the_numpy_bits(level, op):
    assert_calls_match(op, getattr(cpu.build(level), op))


@pytest.fixture
def eager(monkeypatch):
    # Every call asks for threads however small its work, and every helper it asks for joins (parallel.h), so the
    # split over threads is exercised whatever the machine's load.
    monkeypatch.setattr(cpu, "_PARALLEL_WORK", 0)
    lib = cpu.build()._lib
    threads = torch.get_num_threads()
    lib.bp_set_eager_helpers(1)
    yield
    lib.bp_set_eager_helpers(0)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("op", OPS)
def test_cpu_thread_count_changes_no_bit(op, eager):
    for threads in (1, 2):
        torch.set_num_threads(threads)
        assert_calls_match(op, getattr(cpu, op))


@pytest.mark.parametrize("op", OPS)
def test_one_ascend_core_gives_the_numpy_bits(op, monkeypatch):
    """One emulated AI core takes every row, tile or query (and key) in turn: the 40 cores' bits."""
    monkeypatch.setattr(host_emulation, "BLOCKS", 1)
    assert_calls_match(op, getattr(_module("ascend"), op))


def test_ascend_ub_limits_are_refused():
    """The row fold keeps at most 25 subtrees in UB (rows <= MAX_ROW; the 2.0.0 weight gradient folds its blocks
    on the host, backends/linear_grad.py, so it has no such limit); the attention backward's per-key sums keep
    one partial row per segment of queries (Tq <= ATTENTION_MAX_KEYS)."""
    ascend = _module("ascend")
    rows = host_emulation.FOLD_MAX_ROWS + 1
    with pytest.raises(ValueError, match=f"at most {host_emulation.FOLD_MAX_ROWS} rows"):
        ascend.fold_rows(torch.ones(1, 1), _index([0]), _index([rows - 1]), rows, 1)
    tq = host_emulation.ATTENTION_MAX_KEYS + 1
    q = torch.zeros(1, tq, 1)
    with pytest.raises(ValueError, match=f"at most {host_emulation.ATTENTION_MAX_KEYS} keys and queries"):
        ascend.attention_backward(q, torch.zeros(1, 2, 1), torch.zeros(1, 2, 1), _index([2]), False, 1.0, q)


@pytest.mark.parametrize("op", ("fold_rows", "weight_grad"))
@pytest.mark.parametrize("block", (1, 4))
def test_cuda_fold_block_changes_no_bit(block, op, monkeypatch):
    """The cuda row fold's block (leaf positions per block, layout.fold_tile) of 1 and 4 puts every level, or all
    but two, on the stack above the blocks (fold.py), where the interpreter's 256 folds most cases in one block."""
    monkeypatch.setattr(layout, "INTERPRETER_FOLD_BLOCK", block)
    assert_calls_match(op, getattr(_module("cuda"), op))


def test_cuda_one_product_per_tile_changes_no_bit(monkeypatch):
    """layout.INTERPRETER_PRODUCTS = 1: one query or key per program, attention's dims one per pass, weight_grad's
    outputs one per program."""
    monkeypatch.setattr(layout, "INTERPRETER_PRODUCTS", 1)
    cuda, reference = _module("cuda"), _module("numpy")
    rng = np.random.default_rng(9)
    q, k, v, g = (_values(rng, 2, t, 2) for t in (1, 2, 2, 1))
    attention = (q, k, v, _index([2, 1]), True, f32(1 / np.sqrt(2)), g)
    grad = (_values(rng, 5, 3), _values(rng, 5, 2), torch.arange(5), 5)
    for op, args in (("attention_backward", attention), ("weight_grad", grad)):
        for got, expected in zip(_results(getattr(cuda, op)(*args)), _results(getattr(reference, op)(*args)),
                                 strict=True):
            assert torch.equal(canonical_bits(got), canonical_bits(expected)), op


# -- Negative controls: the cases tell orders apart ---------------------------------------------------

def test_a_segment_without_rows_folds_to_negative_zero():
    """spec 29.1: a segment with no row is -0.0, the sum of no leaf, which every backend gives (the table above)."""
    negative_zero = canonical_bits(torch.tensor(-0.0))
    assert (want("fold_rows", _case("fold_rows", "no rows")[0])[0] == negative_zero).all()
    assert (want("fold_rows", _case("fold_rows", "segments sharing a position")[0])[0][1] == negative_zero).all()


def test_row_fold_left_to_right_differs():
    """Adding the rows in sequence (torch's .grad += g over micro-batches) is not the row fold: 1 instead of 0 on
    the cancellation, and other bits on some random case."""
    differs = {}
    for i, (label, (c, segments, positions, rows, n_segments)) in enumerate(calls()["fold_rows"]):
        if n_segments != 1 or c.shape[0] < 3:
            continue
        ordered = c[torch.argsort(positions)]
        running = ordered[0].clone()
        for row in ordered[1:]:
            running = running + row
        differs[label] = not torch.equal(canonical_bits(running), want("fold_rows", i)[0][0])
    assert differs.pop("cancellation") and any(differs.values())


def test_torch_weight_gradient_differs():
    """torch's own gradient, g^T x, adds the rows in its own order."""
    i, (x, g, _, _) = _case("weight_grad", "M=17")
    assert not torch.equal(canonical_bits(g.t() @ x), want("weight_grad", i)[0])


def test_torch_autograd_rms_norm_gradient_differs():
    """torch's autograd of rms_norm (mean, rsqrt, its own reductions) gives other bits."""
    i, (x, weight, eps, g) = _case("rms_norm_backward", "[5, 33]")
    x = x.clone().requires_grad_()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    (dx,) = torch.autograd.grad(y, x, g)
    assert not torch.equal(canonical_bits(dx), want("rms_norm_backward", i)[0])
