"""The comparison layer: what `bitparity compare` reports, and the CLI around it."""

import json
import math

import pytest
import torch

from bitparity import SPEC_VERSION, cli
from bitparity.compare import cases, grad_cases, metrics, report, run, timing
from bitparity.compare.run import compare
from tests.reference.test_canonical import ACCURACY_BOUNDS


@pytest.fixture(scope="module")
def results():
    return {(r.op, r.backend): r for r in compare(backends=("numpy", "native"), progress=False,
                                                   ops_=("log_softmax", "token_logprobs", "exp")).results}


def test_canonical_agrees_with_itself_and_is_within_its_bound(results):
    for op in ("log_softmax", "token_logprobs"):
        r = results[(op, "numpy")]
        assert r.exact_percent == 100.0 and r.logdiff == 0.0
        assert 0.0 < r.max_ulp <= ACCURACY_BOUNDS[op]
    assert results[("exp", "numpy")].max_ulp <= 1.0


def test_native_is_measured_against_the_same_cases(results):
    for op in ("log_softmax", "token_logprobs", "exp"):
        native, canonical = results[(op, "native")], results[(op, "numpy")]
        assert native.elements == canonical.elements > 0
        assert native.median_ms > 0 and native.ratio_to_native == pytest.approx(1.0, rel=0.5)
    # Torch's CPU log_softmax differs from the canonical bits somewhere in the suite, and the
    # logdiff says by how much; a fully masked row (NaN in torch, -inf here) counts as infinite.
    assert results[("log_softmax", "native")].exact_percent < 100.0
    assert results[("log_softmax", "native")].logdiff > 0.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: cuda compiles its kernels and runs every case")
def test_the_interpreter_runs_its_stated_subset_untimed():
    result = compare(backends=("numpy", "cuda"), ops_=("exp", "silu_mul"), progress=False)
    assert result.subsets == {"cuda": run.INTERPRETER_RULE}
    small = {c.name for c in cases.suite("quick", ["exp", "silu_mul"])
             if max(math.prod(s) for s in c.shapes.values()) <= run.INTERPRETER_MAX_ELEMENTS}
    assert 0 < len(small) < len(result.cases)
    assert {c["name"] for c in result.cases if "cuda" in c["digests"]} == small
    assert all(c["digests"]["cuda"] == c["digests"]["numpy"] for c in result.cases if "cuda" in c["digests"])
    by = {(r.op, r.backend): r for r in result.results}
    assert sum(by[(op, "cuda")].cases for op in ("exp", "silu_mul")) == len(small)
    for op in ("exp", "silu_mul"):
        assert by[(op, "cuda")].timing is None and by[(op, "numpy")].timing.runs >= run.TIMING["min_runs"]
    assert f"- cuda ran {len(small)} of {len(result.cases)} cases: Triton interpreter" in report.table(
        report.document(result))


def test_the_interpreter_subset_keeps_every_kind_and_filter_setting_of_the_small_cases():
    suite = cases.suite("quick")
    small = [c for c in suite if max(math.prod(s) for s in c.shapes.values()) <= run.INTERPRETER_MAX_ELEMENTS]
    picked = run.interpreter_subset(suite)
    assert picked <= {c.name for c in small}
    assert {c.op for c in suite} == {c.op for c in small if c.name in picked}       # every op keeps cases
    assert all(c.name in picked for c in small if c.op not in run.INTERPRETER_THINNED)
    for op in run.INTERPRETER_THINNED:          # names are op/setting/kind/shape
        settings_kinds = [c.name.split("/")[1:3] for c in small if c.op == op]
        kept = [c.name.split("/")[1:3] for c in small if c.op == op and c.name in picked]
        assert len(kept) < len(settings_kinds)
        for i in (0, 1):
            assert {sk[i] for sk in kept} == {sk[i] for sk in settings_kinds}, op


def test_an_unavailable_backend_is_skipped_and_the_report_says_why(monkeypatch):
    monkeypatch.setattr(run, "availability", lambda b: (False, "cannot be imported: no triton") if b == "cuda"
                        else (True, "here"))
    result = compare(backends=("numpy", "cuda", "native"), ops_=("exp",), progress=False)
    assert result.backends == ["numpy", "native"] and result.skipped == {"cuda": "cannot be imported: no triton"}
    doc = report.document(result)
    assert doc["skipped"] == [{"name": "cuda", "reason": "cannot be imported: no triton"}]
    assert "- skipped cuda: cannot be imported: no triton" in report.table(doc)


def test_a_busy_machine_is_warned_of_on_stderr_and_in_the_report(monkeypatch, capsys):
    monkeypatch.setattr(timing, "NOISY_SPREAD", -1.0)       # every spread exceeds it: the run reads as busy
    result = compare(backends=("numpy", "native"), ops_=("exp",))
    err = capsys.readouterr().err
    assert "compare quick: agreement [" in err and "compare quick: timing [" in err
    assert len(result.warnings) == 1 and result.warnings[0].startswith("the machine looks busy")
    assert f"bitparity compare: warning: {result.warnings[0]}" in err
    assert f"- WARNING: {result.warnings[0]}" in report.table(report.document(result))


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert cli.main(["compare", "--backend", "numpy", "--backend", "native", "--op", "exp", "--op", "sum",
                     "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| exp" in printed and "max ulp vs f64" in printed and "how / why not" in printed
    report = json.loads(out.read_text())          # --json is the older name of --out
    assert report["spec_version"] == SPEC_VERSION
    assert {(r["op"], r["backend"]) for r in report["results"]} == {
        (op, b) for op in ("exp", "sum") for b in ("numpy", "native")}


def test_cli_lists_backends(capsys):
    assert cli.main(["backends"]) == 0
    assert "numpy" in capsys.readouterr().out


@pytest.fixture(scope="module")
def gradient_results():
    ops_ = ("log_softmax.backward", "masked_whiten.backward", "linear.backward", "AdamW.step")
    result = compare(backends=("numpy", "cpu", "native"), ops_=ops_, progress=False)
    return result, {(r.op, r.backend): r for r in result.results}


def test_compare_shows_backward_rows_with_their_ulp_against_float64_and_cost_against_torch_autograd(
        gradient_results):
    result, by = gradient_results
    # spec 26.12's tested bounds for the softmax family and masked_whiten hold on the float32 cases; bfloat16
    # gradients are measured at bfloat16's resolution, so they too are within a few of its ulps
    assert 0 < by[("log_softmax.backward", "numpy")].max_ulp <= 1.0
    assert 0 < by[("masked_whiten.backward", "numpy")].max_ulp <= 2.0
    # AdamW in spec 29.14's units: a few on ordinary gradients; its specials case holds a gradient whose v = c2 g^2
    # (about 1e74) is beyond float32, where the binary32 state cannot follow the float64 meaning
    case = next(c for c in grad_cases.suite("quick", ["AdamW.step"]) if "/default/" in c.name)
    inputs = case.inputs()
    ref, got = run.grad_reference(case, inputs), case.run("numpy", inputs)
    errors = [metrics.unit_error(got[t].numpy(), ref[t][0], ref[t][2]).max() for t in case.tensors]
    assert 0 < max(errors) < 16 and by[("AdamW.step", "numpy")].max_ulp >= max(errors)
    for op in ("log_softmax.backward", "masked_whiten.backward", "linear.backward", "AdamW.step"):
        canonical, cpu, native = by[(op, "numpy")], by[(op, "cpu")], by[(op, "native")]
        assert canonical.exact_percent == cpu.exact_percent == 100.0 and native.elements == cpu.elements > 0
        assert cpu.timing.runs >= run.TIMING["min_runs"] and native.ratio_to_native == 1.0
        assert cpu.ratio_to_native == pytest.approx(cpu.timing.median_ms / native.timing.median_ms)
    assert by[("log_softmax.backward", "native")].exact_percent < 100.0      # torch autograd's bits differ
    table = report.table(report.document(result))
    assert "| linear.backward" in table and "spec 29.14's" in table


def test_gradient_case_records_hold_each_tensors_digest(gradient_results):
    result, _ = gradient_results
    record = next(c for c in result.cases if c["name"] == "linear.backward/bias/3x1100x17")
    assert list(record["tensors"]["cpu"]) == ["dx", "dweight", "dbias"]
    assert record["tensors"]["cpu"] == record["tensors"]["numpy"] != record["tensors"]["native"]
    assert record["digests"]["cpu"] == record["digests"]["numpy"]


def test_the_interpreter_runs_one_case_per_gradient_op_but_the_stated_skips():
    suite = grad_cases.suite("quick")
    picked = run.interpreter_subset(suite)
    ops_ = {c.op for c in suite if c.name in picked}
    assert ops_ == set(grad_cases.GRAD_OPS) - set(grad_cases.INTERPRETER_SKIPS)
    assert len(picked) == len(ops_)
