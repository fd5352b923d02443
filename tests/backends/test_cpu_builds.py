"""Each instruction-set build of the cpu backend, one by one: the numpy backend's bits, no FMA, any thread count.

The registry only ever calls the widest build this CPU runs; here every build
it can run (baseline, AVX2, AVX-512F) is called directly through the backend
contract, on inputs where the reduction structure changes shape (lengths
across one lane block, 1024, and one and two segments, 16384) and the
numerics are hard (wide dynamic range, ties, peaked rows, fully masked rows,
NaN, +-inf, +-0).  The numpy backend's result for each call is computed once
and shared by every build and thread count.
"""

import functools
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from bitparity.backends import cpu
from bitparity.backends import numpy as reference
from bitparity.compare import cases
from bitparity.compare.metrics import canonical_bits

LEVELS = tuple(range(cpu.isa_level() + 1))
# 49153: four segments, the fewest whose partial tree ((p0 + p1) + (p2 + p3)) is not a running sum
LENGTHS = (1, 63, 1025, 16385, 49153)
SCALES = (1.0, float(np.float32(1.0) / np.float32(0.7)))
F32 = np.float32
PPO_AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def f32(value):
    return float(F32(value))


def _rl_values(rows, n, seed, specials):
    """Unit-scale values with +-0 entries and a few of magnitude 1e3; with specials, also 1e30, NaN and +-inf
    (which make most row statistics NaN, so the finite variant is what checks the order of their sums)."""
    rng = np.random.default_rng([seed, rows, n])
    x = rng.standard_normal((rows, n))
    k = rng.random((rows, n))
    x = np.where(k < 0.02, rng.choice([-1.0, 1.0], (rows, n)) * (1e30 if specials else 1e3), x)
    x[(k > 0.989) & (k < 0.995)] = 0.0
    x[k >= 0.995] = -0.0
    if specials:
        x[(k > 0.98) & (k < 0.983)] = np.nan
        x[(k > 0.983) & (k < 0.986)] = np.inf
        x[(k > 0.986) & (k < 0.989)] = -np.inf
    return torch.from_numpy(x.astype(F32))


def _rl_mask(rows, n, seed):
    """Random masks; when there are more than three rows: row 0 fully masked, row 1 a single counted
    entry, row 2 all counted."""
    m = torch.from_numpy(np.random.default_rng([seed, rows, n, 1]).random((rows, n)) < 0.6)
    if rows > 3:
        m[0] = False
        m[1] = False
        m[1, n // 2] = True
        m[2] = True
    return m


def _kl_inputs():
    """logp = 0 and ref = d over d in [-3, 3] densely (the series/direct switch at |d| = 1), then specials."""
    d = np.concatenate([np.linspace(-3.0, 3.0, 20001),
                        [1.0, -1.0, np.nextafter(1.0, 0.0), -np.nextafter(1.0, 0.0), 1e-7, -1e-7, 1e-30, 0.0, -0.0,
                         20.0, 25.0, -25.0, 88.7, 89.0, 100.0, -104.0, -200.0, np.inf, -np.inf, np.nan]])
    ref = torch.from_numpy(d.astype(F32))
    logp = torch.from_numpy(np.random.default_rng(5).standard_normal(ref.numel()).astype(F32) * 1e-3)
    return logp, ref + logp


def _gradient(shape, seed):
    """An upstream gradient (spec 26) of random signs with +-0, +-inf and NaN entries."""
    rng = np.random.default_rng([seed, *shape, 2])
    g = rng.standard_normal(shape)
    k = rng.random(shape)
    g[k < 0.01] = 0.0
    g[(k >= 0.01) & (k < 0.02)] = -0.0
    g[(k >= 0.02) & (k < 0.023)] = np.inf
    g[(k >= 0.023) & (k < 0.026)] = -np.inf
    g[(k >= 0.026) & (k < 0.029)] = np.nan
    return torch.from_numpy(g.astype(F32))


BACKWARD_OPS = ("logsumexp_backward", "log_softmax_backward", "softmax_backward", "entropy_backward",
                "token_logprobs_backward", "masked_mean_backward", "masked_whiten_backward", "kl_penalty_backward",
                "ppo_policy_loss_backward")


def _add_backward_calls(out):
    """The backward (spec 26) of each differentiable op on its forward's calls, with gradients from _gradient;
    log_softmax, softmax and entropy's backward read the numpy backend's forward output."""
    for i, (label, args) in enumerate(out["logsumexp"]):
        x = args[0]
        out["logsumexp_backward"].append((label, (*args, _gradient((x.shape[0],), i))))
    for i, (label, args) in enumerate(out["log_softmax"]):
        out["log_softmax_backward"].append((label, (reference.log_softmax(*args), *args[1:],
                                                    _gradient(tuple(args[0].shape), i))))
    for i, (label, args) in enumerate(out["softmax"]):
        out["softmax_backward"].append((label, (reference.softmax(*args), *args[1:],
                                                _gradient(tuple(args[0].shape), i))))
    for i, (label, args) in enumerate(out["entropy"]):
        out["entropy_backward"].append((label, (*args, reference.entropy(*args), _gradient((args[0].shape[0],), i))))
    for i, (label, args) in enumerate(out["token_logprobs"]):
        out["token_logprobs_backward"].append((label, (*args, _gradient((args[0].shape[0],), i))))
    for i, (label, (x, m)) in enumerate(out["masked_mean"]):
        out["masked_mean_backward"].append((label, (m, _gradient((x.shape[0],), i))))
    for i, (label, args) in enumerate(out["masked_whiten"]):
        out["masked_whiten_backward"].append((label, (*args, _gradient(tuple(args[0].shape), i))))
    for i, (label, args) in enumerate(out["kl_penalty"]):
        out["kl_penalty_backward"].append((label, (*args, _gradient(tuple(args[0].shape), i))))
    for i, (label, args) in enumerate(out["ppo_policy_loss"]):
        for g in (0.37, -0.0, np.nan) if i % 4 == 0 else (-1.5,):
            out["ppo_policy_loss_backward"].append((f"{label} g={g}", (*args, torch.tensor([g], dtype=torch.float32))))
    empty = torch.zeros(3, 5, dtype=torch.bool)
    for agg in PPO_AGGS:
        x = _rl_values(3, 5, 9, specials=False)
        out["ppo_policy_loss_backward"].append((f"all masked {agg}", (x, x, x, empty, 0.8, 1.2, None, None, agg,
                                                                      torch.ones(1))))


@functools.cache
def calls():
    """op -> [(label, contract arguments)]."""
    out = {op: [] for op in ("sum", "logsumexp", "log_softmax", "softmax", "entropy", "token_logprobs",
                             "exp", "log", "masked_mean", "masked_whiten", "kl_penalty", "gae", "ppo_policy_loss",
                             *BACKWARD_OPS)}
    for n in LENGTHS:
        x, mask = cases.make_batch(6, n, seed=n)       # one row of each kind; the masked row is fully masked
        tokens = cases.make_tokens(x, seed=n)
        out["sum"] += [(f"n={n} mask={m is not None}", (x, m)) for m in (None, mask)]
        for value in SCALES:
            scale = torch.full((x.shape[0],), value)           # the contract's per-row scale
            for op in ("logsumexp", "log_softmax", "softmax", "entropy"):
                out[op] += [(f"n={n} mask={m is not None} scale={value}", (x, m, scale)) for m in (None, mask)]
            out["token_logprobs"].append((f"n={n} scale={value}", (x, tokens, scale)))
    for op in ("exp", "log"):
        out[op].append(("n=100015", (cases.make_elementwise(op, 100000),)))

    for rows, n in ((6, 1025), (3, 16385), (1, 49153)):
        m = _rl_mask(rows, n, seed=n)
        for specials in (True, False):
            x = _rl_values(rows, n, n, specials)
            out["masked_mean"].append((f"[{rows}, {n}] specials={specials}", (x, m)))
            for shift in (True, False):
                for unbiased in (True, False):
                    for eps in (f32(1e-8), 1.0):
                        for eps_mode in ("add", "clamp"):
                            out["masked_whiten"].append((f"[{rows}, {n}] specials={specials} shift={shift} "
                                                         f"unbiased={unbiased} eps={eps} eps_mode={eps_mode}",
                                                         (x, m, shift, unbiased, eps, eps_mode)))

    logp, ref = _kl_inputs()
    for kind in ("k1", "k2", "k3", "abs"):
        for clamp, log_ratio_clamp in ((None, None), (10.0, 20.0), (f32(0.1), None), (None, 0.5), (0.0, 0.0)):
            out["kl_penalty"].append((f"{kind} clamp={clamp} log_ratio_clamp={log_ratio_clamp}",
                                      (logp, ref, kind, clamp, log_ratio_clamp)))

    b, t = 5, 2100
    rewards, values = _rl_values(b, t, 1, specials=True), _rl_values(b, t, 2, specials=False)
    bootstrap = torch.tensor([0.0, 1.5, -2.0, np.inf, 0.25], dtype=torch.float32)
    prefix = torch.arange(t)[None, :] < torch.tensor([t, 1, 700, t // 2, t - 1])[:, None]
    for mask_name, mask in (("right-padded", prefix), ("random", _rl_mask(b, t, seed=3))):
        for gamma, lam in ((1.0, 1.0), (0.99, 0.95), (0.0, 1.0), (0.5, 0.0)):
            g = F32(gamma)
            for mode in ("carry", "zero"):
                out["gae"].append((f"{mask_name} gamma={gamma} lam={lam} {mode}",
                                   (rewards, values, mask, bootstrap, float(g), float(g * F32(lam)), mode)))

    b, t = 4, 12289                                    # the token mean and clip fraction span four segments
    mask = _rl_mask(b, t, seed=7)
    for specials in (True, False):
        logp = -_rl_values(b, t, 4, specials).abs()
        old_logp = logp + _rl_values(b, t, 5, specials=False) * 0.1
        advantages = _rl_values(b, t, 6, specials) * 3.0
        for agg in PPO_AGGS:
            for low, high, dual_clip, ratio_clamp in ((0.2, 0.2, None, 20.0), (0.2, 0.28, 3.0, 20.0),
                                                      (0.2, 0.2, None, None), (0.5, 1.0, 1.5, 0.5)):
                contract = (f32(F32(1) - F32(low)), f32(F32(1) + F32(high)), dual_clip, ratio_clamp, agg)
                out["ppo_policy_loss"].append((f"{agg} specials={specials} clip=({low}, {high}) "
                                               f"dual={dual_clip} ratio_clamp={ratio_clamp}",
                                               (logp, old_logp, advantages, mask, *contract)))
    _add_backward_calls(out)
    return out


@functools.cache
def want(op, i):
    """The numpy backend's result for calls()[op][i], as canonical bits; ppo's two 0-d results as 0-d."""
    got = getattr(reference, op)(*calls()[op][i][1])
    got = got if isinstance(got, tuple) else (got,)
    if op == "ppo_policy_loss":
        got = tuple(g.reshape(()) for g in got)
    return tuple(canonical_bits(g) for g in got)


def assert_calls_match(op, fn):
    """fn(*args) gives the numpy backend's bits for every call of op; reports every mismatching call."""
    failures = []
    for i, (label, args) in enumerate(calls()[op]):
        got = fn(*args)
        got = got if isinstance(got, tuple) else (got,)
        for k, (g, w) in enumerate(zip(got, want(op, i))):
            gb = canonical_bits(g)
            if gb.shape != w.shape:
                failures.append(f"{label} result {k}: shape {tuple(gb.shape)}, want {tuple(w.shape)}")
            elif not torch.equal(gb, w):
                bad = (gb != w).nonzero()
                failures.append(f"{label} result {k}: {bad.shape[0]} of {w.numel()} differ, first at "
                                f"{bad[0].tolist() if bad.numel() else '()'}")
    assert not failures, f"{op}: " + "; ".join(failures)


OPS = ("sum", "logsumexp", "log_softmax", "softmax", "entropy", "token_logprobs", "exp", "log",
       "masked_mean", "masked_whiten", "kl_penalty", "gae", "ppo_policy_loss") + BACKWARD_OPS


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("level", LEVELS, ids=lambda level: cpu.ISA_BUILDS[level][0])
def test_build_gives_canonical_bits(level, op):
    assert_calls_match(op, getattr(cpu.build(level), op))


FMA = re.compile(r"\bvfn?m(add|sub)\w*", re.IGNORECASE)   # every FMA3/FMA4 form, fmaddsub/fmsubadd included


@pytest.mark.parametrize("level", LEVELS, ids=lambda level: cpu.ISA_BUILDS[level][0])
def test_build_has_no_fma_instruction(level):
    # objdump ships in binutils with the assembler and linker gcc needs to build the backend at all,
    # so its absence means a broken toolchain, not a machine the check does not apply to.
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.fail("objdump not found on PATH: install binutils; the no-FMA check needs the disassembly")
    build = cpu.build(level)
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(build.path)],
                          capture_output=True, text=True, check=True).stdout
    assert all(f"<bp_{op}>:" in text for op in ("log_softmax", "gae", "philox", "sample")), \
        "disassembly lacks the exported ops"
    fused = sorted({m.group(0) for m in FMA.finditer(text)})
    assert not fused, f"{build.isa} build {build.path} contains FMA instructions: {fused}"
    # The build is the ISA it claims: gcc vectorised into that width's registers.
    register = {"AVX2": "%ymm", "AVX-512F": "%zmm"}.get(build.isa)
    assert register is None or register in text, f"{build.isa} build uses no {register} register"


SAMPLING_OPS = ("philox", "topk", "filter_logits", "sample")


def _sampling_rows(n, seed):
    """[8, n] logits that reach each path of the cpu backend's search: random rows (with top-p and without
    top-k, more than 1024 kept tokens: the bucketed top-p search), logits on a grid of 8 values (ties at
    every top-k and top-p boundary), signed zeros, a wide range, -inf entries, an all -inf row, a NaN row
    and a +inf row."""
    rng = np.random.default_rng([seed, n])
    x = (rng.standard_normal((8, n)) * 3).astype(F32)
    x[1] = rng.integers(-4, 4, n) * F32(0.5)
    x[2] = np.where(rng.random(n) < 0.5, F32(0.0), F32(-0.0))
    x[3] = (rng.standard_cauchy(n) * 10).astype(F32)
    x[4, rng.random(n) < 0.3] = -np.inf
    x[5] = -np.inf
    x[6, n // 2] = np.nan
    x[7, n // 3] = np.inf
    return torch.from_numpy(x)


def _top_p_tie_row():
    """A row [0, 0, -1 x 5] and a top_p for which the mass above the value -1 (2.0: two exponentials of exactly
    1) equals thr = top_p * Z exactly, so only the strict A(v) < thr of spec 21 removes the -1 tokens."""
    from bitparity.reference import canonical
    x = np.array([[0, 0, -1, -1, -1, -1, -1]], dtype=F32)
    z = canonical.canonical_sum(canonical.exp(x))[0]
    top_p = next(p for p in (F32(2) / z, np.nextafter(F32(2) / z, F32(0)), np.nextafter(F32(2) / z, F32(1)))
                 if p * z == F32(2))
    return torch.from_numpy(x), f32(top_p)


@functools.cache
def sampling_calls():
    """op -> [(label, contract arguments)] for the selection and sampling ops."""
    rng = np.random.default_rng(11)
    out = {"philox": [("random words", (torch.from_numpy(rng.integers(0, 2**32, (999, 4), dtype=np.int64)),
                                        torch.from_numpy(rng.integers(0, 2**32, (999, 2), dtype=np.int64))))],
           "topk": [], "filter_logits": [], "sample": []}
    for n in (7, 1025, 49153):
        x = _sampling_rows(n, 1)
        for k in sorted({1, min(50, n), n}):
            out["topk"].append((f"n={n} k={k}", (x, k)))
        for top_k, top_p, min_p in ((0, 0.9, 0.0), (50, 0.9, 0.0), (0, 0.5, 0.1), (3, 1.0, 0.0), (0, 1.0, 0.0),
                                    (n - 1, 0.999, 0.0)):
            params = (torch.full((8,), f32(F32(1) / F32(0.7))), torch.full((8,), top_k, dtype=torch.int64),
                      torch.full((8,), f32(top_p)), torch.full((8,), f32(min_p)))
            label = f"n={n} top_k={top_k} top_p={top_p} min_p={min_p}"
            out["filter_logits"].append((label, (x, *params)))
            greedy = torch.tensor([False] * 7 + [True]) if top_k == 0 else torch.zeros(8, dtype=torch.bool)
            seeds = torch.from_numpy(rng.integers(-2**63, 2**63 - 1, 8, dtype=np.int64))
            positions = torch.from_numpy(rng.integers(0, 2**40, 8, dtype=np.int64))
            out["sample"].append((label, (x, *params, greedy, seeds, positions)))
    x, top_p = _top_p_tie_row()
    params = (torch.ones(1), torch.zeros(1, dtype=torch.int64), torch.full((1,), top_p), torch.zeros(1))
    out["filter_logits"].append(("top-p tie: A(v) == thr", (x, *params)))
    for seed in range(8):    # the race picks one of the two kept tokens, or a removed one if the tie were kept
        out["sample"].append((f"top-p tie: A(v) == thr, seed {seed}", (x, *params, torch.zeros(1, dtype=torch.bool),
                                                                        torch.tensor([seed]), torch.tensor([0]))))
    return out


@functools.cache
def sampling_want(op, i):
    got = getattr(reference, op)(*sampling_calls()[op][i][1])
    return got if isinstance(got, tuple) else (got,)


def assert_sampling_calls_match(op, fn):
    """fn(*args) gives the numpy backend's tokens, indices and words exactly, and its values' canonical bits."""
    failures = []
    for i, (label, args) in enumerate(sampling_calls()[op]):
        got = fn(*args)
        for k, (g, w) in enumerate(zip(got if isinstance(got, tuple) else (got,), sampling_want(op, i))):
            same = torch.equal(canonical_bits(g), canonical_bits(w)) if w.is_floating_point() else torch.equal(g, w)
            if not same:
                failures.append(f"{label} result {k}")
    assert not failures, f"{op}: " + "; ".join(failures)


@pytest.mark.parametrize("op", SAMPLING_OPS)
@pytest.mark.parametrize("level", LEVELS, ids=lambda level: cpu.ISA_BUILDS[level][0])
def test_build_gives_canonical_selection_and_samples(level, op):
    assert_sampling_calls_match(op, getattr(cpu.build(level), op))


MODEL_OPS = ("linear", "rms_norm", "rotary", "attention", "silu_mul")


@functools.cache
def model_calls():
    """op -> [(label, contract arguments)] for the model building blocks, at sizes past one lane block and one
    segment (K, D, Tk = 1100 and 49153 or 16390), with panels of outputs that end part-way (N = 33, D = 20)."""
    rng = np.random.default_rng(13)

    def randn(*shape):
        return torch.from_numpy(rng.standard_normal(shape).astype(F32))

    out = {op: [] for op in MODEL_OPS}
    # linear: K = 1 to 64 (one depth-first tree, its top lanes empty), 65 to 1024 (several subtrees), past one
    # lane block (chunks) and one segment (the last one 1 term, or 100: 2 subtrees); M and N off the 4-row
    # blocks and 16-output panels
    specials = torch.tensor([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e38])
    for m, k, n in ((5, 1100, 33), (3, 49153, 4), (1, 64, 40), (7, 1, 17), (6, 3, 5), (9, 31, 16), (4, 33, 31),
                    (13, 64, 47), (2, 1023, 3), (5, 1025, 18), (3, 16484, 2)):
        x, w = randn(m, k), randn(n, k)
        x[0, :7] = specials[:k]
        out["linear"] += [(f"[{m}, {k}] x [{n}, {k}] bias={b}", (x, w, randn(n) if b else None)) for b in (False, True)]
    for rows, d in ((6, 1100), (2, 49153)):
        out["rms_norm"].append((f"[{rows}, {d}]", (randn(rows, d), randn(d), f32(1e-6))))
        h = d // 2
        out["rotary"].append((f"[{rows}, {2 * h}]", (randn(rows, 2 * h), randn(rows, h), randn(rows, h))))
    for g, tq, tk, d, causal in ((2, 3, 1100, 20, True), (2, 4, 1100, 20, False), (1, 2, 16390, 4, True)):
        q, k, v = randn(g, tq, d), randn(g, tk, d), randn(g, tk, d)
        lengths = torch.tensor([tk, tk - 5][:g])
        out["attention"].append((f"G={g} Tq={tq} Tk={tk} D={d} causal={causal}",
                                 (q, k, v, lengths, causal, f32(1.0 / np.sqrt(d)))))
    gate = torch.cat([randn(100000) * 8, torch.tensor([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 88.0, -200.0])])
    out["silu_mul"].append(("n=100008", (gate, randn(gate.numel()))))
    return out


@functools.cache
def model_want(op, i):
    return canonical_bits(getattr(reference, op)(*model_calls()[op][i][1]))


def assert_model_calls_match(op, fn):
    failures = [label for i, (label, args) in enumerate(model_calls()[op])
                if not torch.equal(canonical_bits(fn(*args)), model_want(op, i))]
    assert not failures, f"{op}: " + "; ".join(failures)


@pytest.mark.parametrize("op", MODEL_OPS)
@pytest.mark.parametrize("level", LEVELS, ids=lambda level: cpu.ISA_BUILDS[level][0])
def test_build_gives_canonical_model_ops(level, op):
    assert_model_calls_match(op, getattr(cpu.build(level), op))


@pytest.fixture
def restore_threads(monkeypatch):
    # Every call takes the thread count asked for, however small its work (the backend runs small calls on one thread).
    # and every helper thread joins, even when the load says the cores are busy (parallel.c).
    monkeypatch.setattr(cpu, "_PARALLEL_WORK", 0)
    threads = torch.get_num_threads()
    cpu.build()._lib.bp_set_eager_helpers(1)
    yield
    cpu.build()._lib.bp_set_eager_helpers(0)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("op", OPS)
def test_thread_count_changes_no_bit(op, restore_threads):
    # 3 threads on 6, 5, 3 or 1 rows (or segments) splits them unevenly, and more threads than cores.
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        assert_calls_match(op, getattr(cpu.build(), op))


@pytest.mark.parametrize("op", SAMPLING_OPS)
def test_thread_count_changes_no_selection_or_sample(op, restore_threads):
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        assert_sampling_calls_match(op, getattr(cpu.build(), op))


@pytest.mark.parametrize("op", MODEL_OPS)
def test_thread_count_changes_no_model_op_bit(op, restore_threads):
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        assert_model_calls_match(op, getattr(cpu.build(), op))
