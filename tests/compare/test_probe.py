"""`bitparity probe`: its exact rounding, its checks' power to fail, and its CPU facts against
values measured here by other means."""

import json
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from bitparity.backends.ascend import npu_ops
from bitparity.cli import main
from bitparity.compare import probe


def _findings(tmp_path, backend):
    out = tmp_path / f"probe-{backend}.json"
    assert main(["probe", "--backend", backend, "--format", "json", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["backend"] == backend
    return report["findings"]


def _one(findings, operation, check=None):
    rows = [f for f in findings if f["operation"] == operation and (check is None or f["check"] == check)]
    assert len(rows) == 1, rows
    return rows[0]


@pytest.mark.parametrize("q, want", [
    (1 + Fraction(1, 2**24), 1.0),                                      # tie, to the even neighbour below
    (1 + Fraction(3, 2**24), 1 + 2.0**-22),                             # tie, to the even neighbour above
    (1 + Fraction(1, 2**24) + Fraction(1, 2**60), 1 + 2.0**-23),        # just past the tie
    (-(1 + Fraction(1, 2**24)), -1.0),
    (Fraction(1, 2**150), 0.0),                                         # half the least subnormal: to 0 (even)
    (Fraction(3, 2**151), 2.0**-149),
    (Fraction(2**128) - Fraction(2**103), math.inf),                    # max + half an ulp: the tie rounds up
    (Fraction(2**128) - Fraction(2**103) - 1, float(np.finfo(np.float32).max)),
])
def test_round_to_float32_known_values(q, want):
    assert probe.round_to_float32(q) == want


def test_round_to_float32_agrees_with_the_fpu_on_float64_values():
    # A float64 value rounds to binary32 once in numpy's cast, so there the two must agree.
    rng = np.random.default_rng(5)
    values = rng.standard_normal(2000) * 2.0 ** rng.integers(-140, 120, 2000)
    got = np.array([probe.round_to_float32(Fraction(float(v))) for v in values])
    with np.errstate(over="ignore"):
        assert np.array_equal(got, values.astype(np.float32).astype(np.float64))


def test_rne_pairs_contain_ties_on_both_ops():
    (aa, ab), (ma, mb) = probe.rne_pairs()
    assert sum(probe._is_tie(Fraction(float(a)) + Fraction(float(b))) for a, b in zip(aa, ab)) >= 500
    assert sum(probe._is_tie(Fraction(float(a)) * Fraction(float(b))) for a, b in zip(ma, mb)) >= 200


# -- each check fails on an operation that breaks its assumption -----------------------

def _truncating(op):
    """op in float64, then rounded toward zero to binary32: right except on ties and near them."""
    def run(a, b):
        exact = op(a.astype(np.float64), b.astype(np.float64))
        near = exact.astype(np.float32)
        too_far = np.abs(near.astype(np.float64)) > np.abs(exact)
        return np.where(too_far, np.nextafter(near, np.float32(0)), near)
    return run


def _flush(op):
    def run(a, b):
        tiny = np.finfo(np.float32).tiny
        a, b = (np.where(np.abs(v) < tiny, np.float32(0), v) for v in (a, b))
        out = op(a, b)
        return np.where(np.abs(out) < tiny, np.float32(0), out)
    return run


def test_checks_fail_on_operations_that_break_their_assumption():
    assert not probe.check_rne(_truncating(np.add), np.multiply)[0]
    assert not probe.check_rne(np.add, _truncating(np.multiply))[0]
    assert not probe.check_subnormals("inputs", _flush(np.add), _flush(np.multiply))[0]
    assert not probe.check_subnormals("results", _flush(np.add), _flush(np.multiply))[0]
    fused = lambda a, b, c: np.array([probe.round_to_float32(Fraction(float(x)) * Fraction(float(y))
                                                             + Fraction(float(z))) for x, y, z in zip(a, b, c)])
    holds, evidence, _ = probe.check_muladd(fused)
    assert not holds and evidence.startswith(f"{probe.muladd_triples()[0].size}/")
    assert not probe.check_div(lambda a, b: a * (np.float32(1) / b))[0]
    assert not probe.check_sqrt(lambda x: (x.astype(np.float64) ** 0.5 * (1 + 2.0**-22)).astype(np.float32))[0]
    # ...and hold on the correctly rounded operations
    assert probe.check_elementary("exp", lambda x: np.exp(x.astype(np.float64)).astype(np.float32))[0]
    assert probe.check_elementary("log", lambda x: np.log(x.astype(np.float64)).astype(np.float32))[0]


# -- the CPU facts, each measured again here by another method ------------------------------

def _ulp_errors_by_libm(fn, x, f32):
    """|f32 - fn(x)| in binary32 ulps of the libm double result, element by element in Python."""
    errors = []
    for xi, yi in zip(x.tolist(), f32.tolist()):
        ref = fn(xi)
        _, e = math.frexp(ref)                     # |ref| in [2^(e-1), 2^e): binary32 ulp 2^(e-24)
        errors.append(abs(yi - ref) / math.ldexp(1.0, max(e, -125) - 24))
    return np.array(errors)


@pytest.fixture(scope="module")
def cpu_findings(tmp_path_factory):
    return _findings(tmp_path_factory.mktemp("probe"), "cpu")


@pytest.mark.parametrize("name", ["exp", "log"])
def test_numpy_exp_and_log_ulp_error_matches_an_independent_measurement(cpu_findings, name):
    x = probe.exp_log_samples()[0 if name == "exp" else 1]
    errors = _ulp_errors_by_libm(getattr(math, name), x, getattr(np, name)(x))
    row = _one(cpu_findings, f"np.{name}")
    assert row["max_ulp"] == pytest.approx(errors.max(), rel=1e-6)
    # numpy's SIMD float32 exp/log are not correctly rounded (the design brief: exp up to 2.4 ulp)
    assert row["result"] == "fails" and 1.0 < errors.max() < 4.0


def test_fma_facts_on_the_cpu(cpu_findings):
    # The classic triple: a*b = 1 + 2^-11 + 2^-24 is a tie that rounds to 1 + 2^-11, so two
    # roundings give 0 and one rounding gives 2^-24.
    a = b = 1 + 2.0**-12
    c = -(1 + 2.0**-11)
    f32 = np.float32
    assert f32(a) * f32(b) + f32(c) == 0.0                        # numpy: two ufuncs, no contraction
    fused = torch.addcmul(torch.tensor([c]), torch.tensor([a]), torch.tensor([b])).item()
    assert _one(cpu_findings, "a * b + c")["result"] == "holds"
    assert _one(cpu_findings, "a * b + c (eager: two kernels)")["result"] == "holds"
    assert _one(cpu_findings, "torch.addcmul(c, a, b) (one kernel)")["result"] == (
        "fails" if fused == 2.0**-24 else "holds")


def test_numpy_division_and_sqrt_are_correctly_rounded(cpu_findings):
    # x86 divss/sqrtss are IEEE-754 operations: correctly rounded, so at most half an ulp.
    for op in ("np.divide", "np.sqrt"):
        row = _one(cpu_findings, op)
        assert row["result"] == "holds" and row["max_ulp"] <= 0.5


def test_subnormals_kept_by_default_and_flushed_under_set_flush_denormal(cpu_findings):
    for f in cpu_findings:
        if f["check"].startswith("subnormal"):
            assert f["result"] == "holds", f
    targets = probe.targets("cpu")
    try:
        assert torch.set_flush_denormal(True)            # x86 with SSE3: FTZ and DAZ on
        assert np.float32(2.0**-70) * np.float32(2.0**-70) == 0.0        # flushed, seen independently
        for target in targets:
            add, mul = target.ops["rne"][0][1]
            for kind in ("inputs", "results"):
                holds, evidence, _ = probe.check_subnormals(kind, add, mul)
                assert not holds, (target.where, kind, evidence)
    finally:
        torch.set_flush_denormal(False)
    assert np.float32(2.0**-70) * np.float32(2.0**-70) == np.float32(2.0**-140)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: `bitparity probe --backend cuda` runs on it "
                                                      "(scripts/gpu_check.py) instead of the interpreter")
def test_probe_cuda_says_it_ran_in_the_interpreter(tmp_path):
    cuda = _findings(tmp_path, "cuda")
    assert {f["where"] for f in cuda} == {"Triton interpreter (numpy underneath): says nothing about the GPU"}
    # the interpreter is numpy: both launches of a*b+c round twice, and tl.exp is numpy's exp
    assert _one(cuda, "a * b + c, enable_fp_fusion=False")["result"] == "holds"
    assert _one(cuda, "tl.exp")["max_ulp"] == pytest.approx(
        probe.check_elementary("exp", np.exp)[2])


@pytest.mark.skipif(npu_ops.npu_present(), reason="an NPU is here: `bitparity probe --backend ascend` runs on it "
                                                  "(scripts/npu_check.py) instead of the host emulation")
def test_probe_ascend_says_it_ran_in_the_host_emulation(tmp_path):
    ascend = _findings(tmp_path, "ascend")
    assert all("host emulation" in f["where"] and "says nothing about the NPU" in f["where"] for f in ascend)
    assert {f["check"] for f in ascend if f["result"] == "holds"} == {"rne", "subnormal_inputs", "subnormal_results"}
    assert {f["result"] for f in ascend if f["check"] not in ("rne", "subnormal_inputs", "subnormal_results")} == {
        "not run"}


def test_probe_rejects_an_unknown_backend(capsys):
    with pytest.raises(SystemExit):
        main(["probe", "--backend", "gpu"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="backend must be one of cpu, cuda, ascend"):
        probe.probe("gpu")


def test_probe_table_and_markdown_render(capsys):
    findings = [probe.Finding("div", "native division is correctly rounded", "a / b", "here", "holds", "ok",
                              "fine", 0.5)]
    assert "| native division is correctly rounded |" in probe.render(findings, "markdown", "cpu")
    assert "native division is correctly rounded" in probe.render(findings, "table", "cpu")
