"""Platform probe: test, on a target, the floating-point assumptions the spec rests on.

Each check runs one platform operation on inputs built on the host and
compares its bits with values known independently of the platform:

- add and mul: crafted pairs whose exact results sit on and next to rounding
  ties, against exact rational arithmetic rounded to nearest-even (RN);
- subnormals: inputs below 2^-126 (a DAZ platform reads them as 0) and
  results below 2^-126 (an FTZ platform writes 0);
- a*b+c: triples where one rounding (a fused multiply-add) and two differ;
- division and square root: random operands against float64 rounded to
  float32, which is correctly rounded because 53 >= 2*24 + 2 (double rounding
  is innocuous then: S. Figueroa, "When is double rounding innocuous?", 1995);
- exp and log: max ulp error against float64 over a fixed sample.

A target is the set of operations one executor offers (numpy, torch on a
device, Triton kernels, the Ascend C host emulation), labelled with where it
ran.  An operation a target cannot run is reported "not run" with the reason.
"""

import json
from dataclasses import asdict, dataclass
from fractions import Fraction

import numpy as np
import torch
from tabulate import tabulate

from . import metrics

PROBE_BACKENDS = ("cpu", "cuda", "ascend")
SEED = 20261202
TRIPLES = 256           # a*b+c triples
PAIRS = 512             # add and mul pairs of each kind
DIV_SQRT_SAMPLES = 1 << 16
EXP_LOG_SAMPLES = 1 << 20

# Per check: the assumption, and what follows for the spec when it holds / fails.
CHECKS = {
    "rne": ("float32 add and mul round to nearest, ties to even",
            "every canonical op is built from add/sub/mul (spec 1-2): the spec's bits are reachable here",
            "no canonical op can match the other backends bit for bit here"),
    "subnormal_inputs": ("subnormal inputs are read as their value (no DAZ)",
                         "subnormal inputs are exact inputs, as spec 11 assumes",
                         "DAZ: inputs below 2^-126 read as 0, so bits differ there (spec 11)"),
    "subnormal_results": ("subnormal results are kept (no FTZ)",
                          "gradual underflow as spec 11 and exp's single rounding into subnormals (spec 5) assume",
                          "FTZ: results below 2^-126 become 0, so bits differ there (spec 11)"),
    "muladd_default": ("a*b+c rounds twice under the platform's default flags",
                       "no contraction even without flags",
                       "the default contracts a*b+c into an FMA: the canonical path needs bitparity's flags (spec 1)"),
    "muladd_flags": ("a*b+c rounds twice under bitparity's flags",
                     "spec 1's 'a*b+c is two roundings' holds with the flags bitparity uses",
                     "bitparity's flags do not stop contraction: no bitwise guarantee"),
    "div": ("native division is correctly rounded",
            "fit for the one division the spec allows, the host-side 1/T (spec 8.1)",
            "why spec 2 keeps native division out: the softmax reciprocal is spec 7's Newton/Dekker"),
    "sqrt": ("native sqrt is correctly rounded",
             "correctly rounded, yet unused: spec 15.2 builds rsqrt from mul/add",
             "why spec 15.2 builds rsqrt from mul/add"),
    "exp": ("native exp is correctly rounded",
            "correct on this sample, still the platform's own: the spec defines exp itself (spec 5)",
            "native exp's bits are the platform's: why spec 5 defines exp from add/mul"),
    "log": ("native log is correctly rounded",
            "correct on this sample, still the platform's own: the spec defines log itself (spec 6)",
            "native log's bits are the platform's: why spec 6 defines log from add/mul"),
}


@dataclass
class Finding:
    check: str
    assumption: str
    operation: str
    where: str
    result: str             # "holds", "fails" or "not run"
    evidence: str
    follows: str
    max_ulp: float = None   # div, sqrt, exp, log: the largest error on the sample, in ulps


# -- exact host arithmetic -------------------------------------------------------

def float32_bits(q):
    """The bit pattern of RN(q), the binary32 value nearest the rational q, ties to even (+-inf
    beyond the range).  Integer arithmetic only, so no floating-point unit, and no FTZ or DAZ
    mode it may be in, takes part."""
    sign = 0x80000000 if q < 0 else 0
    q = abs(Fraction(q))
    if q == 0:
        return sign
    e = q.numerator.bit_length() - q.denominator.bit_length()     # 2^(e-1) < q < 2^(e+1)
    if q < Fraction(2) ** e:
        e -= 1                                                     # 2^e <= q < 2^(e+1)
    e = max(e, -126)                                               # below 2^-126: subnormal spacing
    steps, rest = divmod(q / Fraction(2) ** (e - 23), 1)           # q / spacing of binary32 at q
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and steps % 2 == 1):
        steps += 1
    if steps == 2**24:                                             # rounded up into the next binade
        steps, e = 2**23, e + 1
    if e > 127:
        return sign | 0x7F800000
    if steps < 2**23:                                              # subnormal (then e == -126)
        return sign | int(steps)
    return sign | ((e + 127) << 23) | (int(steps) - 2**23)


def fraction_of_bits(bits):
    """The exact value of a finite binary32 bit pattern."""
    sign = -1 if bits & 0x80000000 else 1
    biased, frac = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if biased == 0:
        return sign * Fraction(frac, 2**149)
    return sign * Fraction(2**23 + frac) * Fraction(2) ** (biased - 150)


def round_to_float32(q):
    """RN(q) as a numpy float32, from float32_bits (so an underflowed negative stays -0.0)."""
    return np.array([float32_bits(q)], dtype=np.uint32).view(np.float32)[0]


def _f32(values):
    return np.asarray(values, dtype=np.float64).astype(np.float32)


def _hex(x):
    return float(x).hex()


# -- inputs: fixed seeds, built on the host --------------------------------------

def _significands(rng, n, low_exp, high_exp):
    """n random normal binary32 values with exponents in [low_exp, high_exp] and both signs."""
    m = rng.integers(2**23, 2**24, n).astype(np.float64) * 2.0**-23
    e = rng.integers(low_exp, high_exp + 1, n)
    s = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return _f32(s * np.ldexp(m, e))


def rne_pairs():
    """(a, b) for add and for mul, each a float32 array, with many exact ties and near-ties.

    add: b is half an ulp of a, three halves, and half an ulp plus or minus 2^-10 ulp.
    mul: b in {1.5, 1.25, 1.75, 1.125} drops one to three bits of a's significand, so about
    half the products of each kind are exact ties.
    """
    rng = np.random.default_rng([SEED, 1])
    a = _significands(rng, PAIRS, -30, 30)
    ulp = np.spacing(np.abs(a)).astype(np.float64)
    sign = np.where(rng.random(PAIRS) < 0.5, -1.0, 1.0)
    add_b = [sign * ulp * k for k in (0.5, 1.5, 0.5 + 2.0**-10, 0.5 - 2.0**-10)]
    add = (np.tile(a, 4), _f32(np.concatenate(add_b)))
    mul_b = [np.full(PAIRS, k) * sign * 2.0 ** rng.integers(-20, 21, PAIRS) for k in (1.5, 1.25, 1.75, 1.125)]
    mul = (np.tile(a, 4), _f32(np.concatenate(mul_b)))
    return add, mul


def subnormal_cases():
    """{"inputs": [(op, a bits, b bits)], "results": [...]}, each exact in binary32.

    inputs: a subnormal times 2^24, or plus 2^-126, is a normal number (DAZ reads the subnormal
    as 0); results: normal operands whose exact product or sum is subnormal (FTZ writes 0).
    Bit patterns, not floats: building a subnormal float on the host would itself be flushed
    when the host is in FTZ/DAZ mode.
    """
    subnormals = (0x00000001, 0x00000003, 0x00000200, 0x007FFFFF, 0x80080000)   # 2^-149 ... -(2^-130)
    two_24, min_normal = 0x4B800000, 0x00800000
    inputs = [("mul", s, two_24) for s in subnormals] + [("add", s, min_normal) for s in subnormals[:4]]
    results = [("mul", 0x1C800000, 0x1C800000),          # 2^-70 * 2^-70 = 2^-140
               ("mul", 0x0DC00000, 0x2B800000),          # 1.5 * 2^-100 * 2^-40
               ("add", 0x00C00000, 0x80800000),          # 1.5 * 2^-126 - 2^-126 = 2^-127
               ("add", 0x01000000, 0x80C00000)]          # 2^-125 - 1.5 * 2^-126 = 2^-127
    return {"inputs": inputs, "results": results}


def muladd_triples():
    """(a, b, c) where RN(RN(a*b) + c) and RN(a*b + c) differ: c = -RN(a*b), plus two classics."""
    rng = np.random.default_rng([SEED, 2])
    a = _significands(rng, TRIPLES, -10, 10)
    b = _significands(rng, TRIPLES, -10, 10)
    with np.errstate(all="ignore"):
        c = -(a * b)
    a = np.concatenate([a, _f32([1 + 2.0**-12, 1 + 2.0**-23])])
    b = np.concatenate([b, _f32([1 + 2.0**-12, 1 - 2.0**-24])])
    c = np.concatenate([c, _f32([-(1 + 2.0**-11), -1.0])])
    fused = np.array([round_to_float32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                      for x, y, z in zip(a, b, c)])
    keep = fused != 0.0                                  # a*b exact in binary32: both give 0
    return a[keep], b[keep], c[keep], fused[keep]


def div_sqrt_samples():
    """(a, b) for division (results in the normal range) and x > 0 for sqrt, float32."""
    rng = np.random.default_rng([SEED, 3])
    a = _significands(rng, DIV_SQRT_SAMPLES, -40, 40)
    b = _significands(rng, DIV_SQRT_SAMPLES, -40, 40)
    x = np.abs(_significands(rng, DIV_SQRT_SAMPLES, -126, 127))
    return a, b, x


def exp_log_samples():
    """exp inputs uniform over [-87.3, 88.7] (normal results); log inputs uniform over positive
    normal bit patterns."""
    rng = np.random.default_rng([SEED, 4])
    x_exp = rng.uniform(-87.3, 88.7, EXP_LOG_SAMPLES).astype(np.float32)
    x_log = rng.integers(0x00800000, 0x7F800000, EXP_LOG_SAMPLES, dtype=np.int64).astype(np.uint32)
    return x_exp, x_log.view(np.float32)


# -- checks: each takes a platform operation on float32 numpy arrays and returns ----
# -- (holds, evidence, max ulp error or None) -------------------------------------------

def _same_bits(got, want):
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float64).astype(np.float32)
    return got.view(np.uint32) == want.view(np.uint32)


def check_rne(add, mul):
    (aa, ab), (ma, mb) = rne_pairs()
    lines, ok = [], True
    for name, fn, a, b, exact in (("sums", add, aa, ab, lambda x, y: x + y),
                                  ("products", mul, ma, mb, lambda x, y: x * y)):
        q = [exact(Fraction(float(x)), Fraction(float(y))) for x, y in zip(a, b)]
        want = np.array([round_to_float32(v) for v in q])
        ties = sum(1 for v in q if _is_tie(v))
        got = fn(a, b)
        bad = np.flatnonzero(~_same_bits(got, want))
        if bad.size:
            i = bad[0]
            ok = False
            lines.append(f"{bad.size}/{a.size} {name} not RN ({ties} ties), e.g. {_hex(a[i])} {name[0]} {_hex(b[i])} "
                         f"= {_hex(got[i])}, RN gives {_hex(want[i])}")
        else:
            lines.append(f"{a.size} {name} ({ties} exact ties) all RN")
    return ok, "; ".join(lines), None


def _is_tie(q):
    if q == 0:
        return False
    q = abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if q < Fraction(2) ** e:
        e -= 1
    steps = q / Fraction(2) ** (max(e, -126) - 23)
    return steps - (steps.numerator // steps.denominator) == Fraction(1, 2)


def check_subnormals(kind, add, mul):
    cases = subnormal_cases()[kind]
    fns = {"add": (add, lambda x, y: x + y), "mul": (mul, lambda x, y: x * y)}
    wrong = []
    for op, a, b in cases:
        fn, exact = fns[op]
        want = float32_bits(exact(fraction_of_bits(a), fraction_of_bits(b)))
        got = fn(*(np.array([v], np.uint32).view(np.float32) for v in (a, b)))
        got = int(np.asarray(got, np.float32).view(np.uint32)[0])
        if got != want:
            wrong.append(f"0x{a:08x} {'+' if op == 'add' else '*'} 0x{b:08x} = 0x{got:08x}, want 0x{want:08x}")
    if wrong:
        return False, f"{len(wrong)}/{len(cases)} wrong, e.g. {wrong[0]}", None
    return True, f"{len(cases)}/{len(cases)} exact", None


def check_muladd(muladd):
    a, b, c, fused = muladd_triples()
    with np.errstate(all="ignore"):
        two = (a * b) + c                     # numpy: two ufuncs, two roundings
    got = muladd(a, b, c)
    n_two = int(_same_bits(got, two).sum())
    n_fused = int(_same_bits(got, fused).sum())
    if n_two == a.size:
        return True, f"{a.size}/{a.size} triples rounded twice (fused would differ on every one)", None
    return False, f"{n_fused}/{a.size} triples fused (one rounding), {n_two} rounded twice", None


def check_correctly_rounded(got, exact64):
    """Bits of got against RN(exact64), where exact64 is float64 whose rounding to binary32 is RN."""
    want = exact64.astype(np.float32)
    bad = ~_same_bits(got, want)
    err = metrics.ulp_error(np.asarray(got, np.float64), exact64)
    worst = float(err.max())
    if bad.any():
        return False, f"{int(bad.sum())}/{got.size} not correctly rounded, max {worst:.3g} ulp", worst
    return True, f"{got.size}/{got.size} correctly rounded (max {worst:.3g} ulp)", worst


def check_div(div):
    a, b, _ = div_sqrt_samples()
    return check_correctly_rounded(div(a, b), a.astype(np.float64) / b.astype(np.float64))


def check_sqrt(sqrt):
    _, _, x = div_sqrt_samples()
    return check_correctly_rounded(sqrt(x), np.sqrt(x.astype(np.float64)))


def check_elementary(name, fn):
    x = exp_log_samples()[0 if name == "exp" else 1]
    ref = getattr(np, name)(x.astype(np.float64))
    err = metrics.ulp_error(np.asarray(fn(x), np.float64), ref)
    worst = int(np.argmax(err))
    text = (f"max {err[worst]:.3g} ulp at x = {_hex(x[worst])}; {int((err > 0.5).sum())}/{x.size} "
            f"not correctly rounded")
    return bool(err[worst] <= 0.5), text, float(err[worst])


# -- targets ------------------------------------------------------------------------

@dataclass
class Target:
    """One executor's operations on float32 numpy arrays.  Each entry of ops maps a check to
    a list of (operation label, callable or the reason it cannot run)."""
    where: str
    ops: dict


def cpu_model():
    """The CPU model name, with the widest vector extension the kernel reports."""
    from .report import cpu_name, cpuinfo

    flags = cpuinfo().get("flags", "").split()
    widest = next((f for f in ("avx512f", "avx2", "sse2") if f in flags), None)
    return f"{cpu_name()}{f', {widest.upper()}' if widest else ''}"


def _numpy_target():
    def muladd(a, b, c):
        return a * b + c

    return Target(f"numpy {np.__version__} float32 ufuncs on the host CPU ({cpu_model()})", {
        "rne": [("np.add, np.multiply", (np.add, np.multiply))],
        "muladd_default": [("a * b + c", muladd)],
        "div": [("np.divide", np.divide)],
        "sqrt": [("np.sqrt", np.sqrt)],
        "exp": [("np.exp", np.exp)],
        "log": [("np.log", np.log)],
    })


def _torch_target(device, where):
    def wrap(fn):
        def run(*arrays):
            tensors = [torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(device) for a in arrays]
            return fn(*tensors).cpu().numpy()
        return run

    return Target(where, {
        "rne": [("torch.add, torch.mul", (wrap(torch.add), wrap(torch.mul)))],
        "muladd_default": [("a * b + c (eager: two kernels)", wrap(lambda a, b, c: a * b + c)),
                           ("torch.addcmul(c, a, b) (one kernel)", wrap(lambda a, b, c: torch.addcmul(c, a, b)))],
        "div": [("torch.div", wrap(torch.div))],
        "sqrt": [("torch.sqrt", wrap(torch.sqrt))],
        "exp": [("torch.exp", wrap(torch.exp))],
        "log": [("torch.log", wrap(torch.log))],
    })


def _triton_target():
    from ..backends.cuda import probe as kernels
    import triton

    if triton.knobs.runtime.interpret:
        where = "Triton interpreter (numpy underneath): says nothing about the GPU"
    else:
        where = f"Triton {triton.__version__} kernels on {torch.cuda.get_device_name()}"

    def binary(op):
        return lambda a, b: kernels.binary(op, a, b)

    def unary(op):
        return lambda x: kernels.unary(op, x)

    return Target(where, {
        "rne": [("a + b, a * b", (binary("add"), binary("mul")))],
        "muladd_default": [("a * b + c, Triton default options", lambda a, b, c: kernels.muladd(a, b, c, True))],
        "muladd_flags": [("a * b + c, enable_fp_fusion=False",
                          lambda a, b, c: kernels.muladd(a, b, c, False))],
        "div": [("a / b", binary("div")), ("tl.math.div_rn", binary("div_rn"))],
        "sqrt": [("tl.sqrt", unary("sqrt")), ("tl.sqrt_rn", unary("sqrt_rn"))],
        "exp": [("tl.exp", unary("exp"))],
        "log": [("tl.log", unary("log"))],
    })


EMULATION_LACKS = ("outside the Ascend C API subset the host emulation models (it has no vendor "
                   "Div/Sqrt/Exp/Ln/FusedMulAdd); on an NPU the probe runs torch_npu's ops")


def _ascend_targets():
    from ..backends import ascend

    if ascend.npu_ops.npu_present():
        return [_torch_target("npu", f"torch_npu ops on {torch.npu.get_device_name()}")]
    from ..backends.ascend import host_emulation
    where = "Ascend C host emulation (g++ float32 on the host CPU): says nothing about the NPU"

    def binary(op):
        return lambda a, b: host_emulation.probe_binary(op, np.asarray(a), np.asarray(b)).numpy()

    return [Target(where, {
        "rne": [("AscendC::Add, AscendC::Mul", (binary("add"), binary("mul")))],
        "muladd_default": [("FusedMulAdd", EMULATION_LACKS)],
        "div": [("Div", EMULATION_LACKS)],
        "sqrt": [("Sqrt", EMULATION_LACKS)],
        "exp": [("Exp", EMULATION_LACKS)],
        "log": [("Ln", EMULATION_LACKS)],
    })]


def targets(backend):
    """The targets `bitparity probe --backend backend` runs on, here and now."""
    if backend not in PROBE_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(PROBE_BACKENDS)}; got {backend!r}")
    if backend == "cpu":
        return [_numpy_target(), _torch_target("cpu", f"torch {torch.__version__} CPU ops on the host CPU "
                                                      f"({cpu_model()})")]
    if backend == "cuda":
        found = [_triton_target()]
        if torch.cuda.is_available():
            found.append(_torch_target("cuda", f"torch {torch.__version__} CUDA ops on {torch.cuda.get_device_name()}"))
        return found
    return _ascend_targets()


# -- running ------------------------------------------------------------------------

def _run_check(check, fn):
    if check == "rne":
        return check_rne(*fn)
    if check.startswith("subnormal"):
        return check_subnormals(check.split("_")[1], *fn)
    if check.startswith("muladd"):
        return check_muladd(fn)
    if check == "div":
        return check_div(fn)
    if check == "sqrt":
        return check_sqrt(fn)
    return check_elementary(check, fn)


def _entries(target):
    """(check, operation, callable or reason) in CHECKS order; add/mul also serve the subnormal checks."""
    for check in CHECKS:
        source = "rne" if check.startswith("subnormal") else check
        for label, fn in target.ops.get(source, ()):
            yield check, label, fn


def probe(backend="cpu"):
    """Run every check on every target of backend; a list of Finding."""
    findings = []
    for target in targets(backend):
        for check, label, fn in _entries(target):
            assumption, if_holds, if_fails = CHECKS[check]
            if isinstance(fn, str):
                findings.append(Finding(check, assumption, label, target.where, "not run", fn, ""))
                continue
            with np.errstate(all="ignore"):
                holds, evidence, max_ulp = _run_check(check, fn)
            findings.append(Finding(check, assumption, label, target.where, "holds" if holds else "fails",
                                    evidence, if_holds if holds else if_fails, max_ulp))
    return findings


HEADERS = ("assumption", "operation", "ran on", "result", "evidence", "what follows for the spec")


def render(findings, fmt, backend):
    if fmt == "json":
        return json.dumps({"backend": backend, "findings": [asdict(f) for f in findings]}, indent=2)
    rows = [(f.assumption, f.operation, f.where, f.result, f.evidence, f.follows) for f in findings]
    return tabulate(rows, headers=HEADERS, tablefmt="github" if fmt == "markdown" else "simple")
