"""scripts/gpu_check.py and scripts/npu_check.py: run end to end on this CPU through the backends'
test doubles, as CI runs them, so that the prepared hardware runs cannot rot."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bitparity.backends.ascend import npu_ops
from bitparity.compare import device_check, grad_cases
from bitparity.compare.run import OPS

ROOT = Path(__file__).resolve().parent.parent
# On the hardware the checks run for real (python scripts/gpu_check.py, scripts/npu_check.py), and the
# test doubles refuse to run, so these CPU runs of them are skipped there.
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run scripts/gpu_check.py on it instead")
NO_NPU = pytest.mark.skipif(npu_ops.npu_present(), reason="an NPU is here: run scripts/npu_check.py on it instead")


def _run_script(script, flag, out):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), flag, "--small", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def _check_document(doc, md, where, bench_where, gradient_ops):
    assert all(step["status"] == "ok" for step in doc["steps"].values()), doc["steps"]
    verified = doc["steps"]["verify"]["value"]
    assert all(r["match"] for r in verified) and {r["op"] for r in verified} == set(OPS) | set(gradient_ops)
    assert {"dx", "dweight"} <= {r["tensor"] for r in verified if r["op"] == "linear.backward"}   # each tensor
    assert all(where in f["where"] for f in doc["steps"]["probe"]["value"])
    bench = doc["steps"]["bench"]["value"]
    timed = (*OPS, *device_check.SMALL_GRAD_BENCH)
    assert {(r["op"], r["backend"]) for r in bench} == {(op, b) for op in timed for b in ("native", doc["backend"])}
    assert {r["where"] for r in bench if r["backend"] != "native"} == {bench_where}
    assert f"{len(verified)}/{len(verified)} digests match (forward cases and gradient tensors)." in md
    assert "## 2. Probe" in md and "## 3. Benchmark" in md and "### Targets" in md
    rl = doc["steps"]["rl_check"]["value"]
    assert rl["ok"] and rl["digest"] == rl["expected_digest"] and rl["logprob"]["max_abs_diff"] == 0.0
    assert "## 4. RL step (spec §25)" in md and "equal." in md
    train = doc["steps"]["train"]["value"]
    assert train["ok"] and train["equal"] == train["tensors"] == 9 and "## 5. Training (spec §29)" in md
    hf = doc["steps"]["hf_rl_check"]["value"]           # --small: the first request, against numpy's digest
    assert hf["ok"] and hf["model"] == "qwen3_moe" and hf["digest"] == hf["expected_digest"]
    assert hf["logprob"]["bitwise_equal"] == hf["logprob"]["tokens"] > 0
    assert "## 6. RL step on a patched Hugging Face model (spec §25.7, `--model qwen3_moe`)" in md


@NO_GPU
def test_gpu_check_interpret_small_runs_end_to_end(tmp_path):
    proc = _run_script("gpu_check.py", "--interpret", tmp_path)
    assert "exit status 0" in proc.stdout
    doc = json.loads((tmp_path / "gpu-check.json").read_text())
    # The interpreter verifies one case of each gradient op but the stated skips (compare's subset).
    md = (tmp_path / "gpu-check.md").read_text()
    _check_document(doc, md, "Triton interpreter", "Triton interpreter (CPU)",
                    set(grad_cases.GRAD_OPS) - set(grad_cases.INTERPRETER_SKIPS))
    # Issue 24's linear benchmark: the interpreter against torch's CPU matmul, labelled as a test double.
    linear = doc["steps"]["linear"]["value"]
    assert {(r["pass"], r["impl"], r["where"]) for r in linear} == {
        (p, i, "Triton interpreter (CPU)" if i == "bitparity" else "torch") for p in ("forward", "forward+backward")
        for i in ("bitparity", "torch bf16", "torch float32")}
    assert all(r["device"] == "cpu" and r["clock"] == "perf_counter" for r in linear)
    assert "## 3.1. linear against torch's matmul (issue 24)" in md and "it says nothing about a GPU" in md


@NO_NPU
def test_npu_check_emulation_small_runs_end_to_end(tmp_path):
    _run_script("npu_check.py", "--emulation", tmp_path)
    doc = json.loads((tmp_path / "npu-check.json").read_text())
    _check_document(doc, (tmp_path / "npu-check.md").read_text(), "host emulation", "host emulation (CPU)",
                    grad_cases.GRAD_OPS)
    assert "linear" not in doc["steps"]                  # issue 24's benchmark is the GPU run's (LINEAR_BENCH_BACKENDS)


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    return gpu_check


@NO_GPU
def test_gpu_check_without_a_gpu_asks_for_the_interpreter(tmp_path):
    with pytest.raises(SystemExit, match="no GPU here .* --interpret runs the Triton interpreter"):
        _gpu_check().main(["--out", str(tmp_path)])


def test_gpu_check_refuses_the_interpreter_on_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit, match="a GPU is present .* --interpret is for machines without one"):
        _gpu_check().main(["--interpret", "--out", str(tmp_path)])


def _steps(verify_rows=None, failed=(), rl_ok=True, train_ok=True, hf_ok=True):
    steps = {name: {"status": "ok", "value": []} for name in ("environment", "probe", "bench")}
    steps["rl_check"] = {"status": "ok", "value": {"ok": rl_ok}}
    steps["train"] = {"status": "ok", "value": {"ok": train_ok}}
    steps["hf_rl_check"] = {"status": "ok", "value": {"ok": hf_ok}}
    steps["verify"] = ({"status": "error", "error": "Traceback"} if verify_rows is None
                       else {"status": "ok", "value": verify_rows})
    for name in failed:
        steps[name] = {"status": "error", "error": "Traceback"}
    return steps


def test_exit_status_says_whether_every_digest_matched():
    match = {"name": "a", "op": "exp", "match": True, "max_ulp": None, "first_diff": None}
    corrupted = dict(match, name="b", match=False, max_ulp=1.0, first_diff=7)
    assert device_check.exit_status(_steps([match])) == 0
    assert device_check.exit_status(_steps([match, corrupted])) == 1
    assert device_check.exit_status(_steps(None)) == 1
    assert device_check.exit_status(_steps([match], failed=("probe",))) == 2
    assert device_check.exit_status(_steps([match], rl_ok=False)) == 1           # the RL step's digest or bits differ
    assert device_check.exit_status(_steps([match], failed=("rl_check",))) == 2
    assert device_check.exit_status(_steps([match], train_ok=False)) == 1        # the trained bits differ
    assert device_check.exit_status(_steps([match], hf_ok=False)) == 1           # the patched HF step differs
    assert device_check.exit_status(_steps([match], failed=("hf_rl_check",))) == 2
    gradient = dict(match, name="c", op="linear.backward", tensor="dweight", match=False, max_ulp=2.0, first_diff=3)
    assert device_check.exit_status(_steps([match, gradient])) == 1              # a gradient tensor differs


def test_targets_against_the_issue():
    def row(op, backend, ratio, fraction):
        return {"op": op, "shape": [64, 151936], "backend": backend, "ratio_to_native": ratio,
                "fraction_of_copy": fraction}
    found = device_check.targets([row("log_softmax", "native", 1.0, 0.9), row("log_softmax", "cuda", 0.9, 0.85),
                                  row("gae", "cuda", 1 / 40, 0.5)])
    assert [(t.split(":")[0], ok) for t, _, ok in found] == [
        ("log_softmax 64x151936", True), ("log_softmax 64x151936", True),
        ("gae 64x151936", False), ("gae 64x151936", False)]
