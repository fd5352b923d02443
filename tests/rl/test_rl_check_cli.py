"""`bitparity rl-check`: its report and JSON, its exit status (1 on any mismatch of a canonical backend, 2 on
bad input), the digest that docs/spec.md §25 publishes, and --native's numbers against a recomputation from
the step's own tensors."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from bitparity import cli
from bitparity.rl import check
from tests.models.test_tiny_moe import SMALL

SPEC = Path(__file__).resolve().parents[2] / "docs" / "spec.md"


@pytest.fixture
def captured(monkeypatch):
    """Runs rl-check keeps the (Rollout, StepResult) pairs of its last check() here."""
    runs = {}
    original = check.check

    def keeping(*args, **kwargs):
        doc, done = original(*args, **kwargs)
        runs.update(done)
        return doc, done
    monkeypatch.setattr(check, "check", keeping)
    return runs


def _recomputed(a, b, mask):
    """max |a - b| in float64 and the fraction of equal bit patterns, from the tensors alone."""
    a, b, m = a.numpy(), b.numpy(), mask.numpy()
    return float(np.abs(a.astype(np.float64) - b)[m].max()), float((a.view(np.int32) == b.view(np.int32))[m].mean())


def test_rl_check_reports_zero_logdiff_and_the_spec_digest(tmp_path, capsys, captured):
    out = tmp_path / "rl.json"
    assert cli.main(["rl-check", "--backend", "numpy", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert {"spec_version", "backend", "seed", "config", "max_batch", "trainer_layout", "settings", "requests",
            "steps", "decode_batch_sizes", "logprob", "value", "loss", "clip_fraction", "ratio_exactly_one",
            "digest", "consistent"} <= doc.keys()
    result = captured["numpy"][1]
    assert doc["logprob"] == {"max_abs_diff": 0.0, "bitwise_equal": int(result.mask.sum()),
                              "tokens": int(result.mask.sum()), "percent": 100.0}
    assert doc["value"]["bitwise_equal"] == doc["value"]["tokens"] and doc["ratio_exactly_one"] and doc["consistent"]
    assert doc["requests"] == 12 and len(doc["decode_batch_sizes"]) >= 5 and "native" not in doc
    assert doc["loss"] == float(result.loss)
    published = re.search(r"rl-check` digest, seed 0, numpy: `([0-9a-f]{64})`", SPEC.read_text()).group(1)
    assert doc["digest"] == published == check.PUBLISHED_DIGESTS[0] and doc["matches_published"]
    assert "spec §25.6's digest for seed 0: matches" in text
    assert f"digest (sha256): {published}" in text and "PPO ratio exactly 1 on every token: yes" in text


def test_native_numbers_are_what_its_tensors_show(tmp_path, capsys, captured, monkeypatch):
    monkeypatch.setattr(check, "ModelConfig", lambda: SMALL)           # a smaller model and sweep than the command's
    monkeypatch.setattr(check, "NATIVE_BATCH_CAPS", (1, None))
    monkeypatch.setattr(check, "NATIVE_MICRO_BATCHES", (2, None))
    out = tmp_path / "rl.json"
    assert cli.main(["rl-check", "--native", "--seed", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    native = json.loads(out.read_text())["native"]
    result = captured["native"][1]
    for key, a, b in (("logprob", result.logp_train, result.logp_rollout),
                      ("value", result.values_train, result.values_rollout)):
        largest, equal = _recomputed(a, b, result.mask)
        assert native[key]["max_abs_diff"] == largest
        assert native[key]["percent"] == pytest.approx(100 * equal, abs=1e-9)
    assert [(r["max_batch"], r["micro_batch"]) for r in native["sweep"]] == [(1, 2), (1, "all"), ("all", 2),
                                                                          ("all", "all")]
    # One sweep row recomputed from a fresh native run of its own schedule and layout.
    policy, reference = check.models("native", 3, SMALL)
    done = check.rollout(policy, check.default_requests(3, vocab=SMALL.vocab), max_batch=1, temperature=0.7)
    again = check.rl_step(policy, reference, done, check.TrainerLayout(micro_batch=2))
    largest, equal = _recomputed(again.logp_train, again.logp_rollout, again.mask)
    assert native["sweep"][0]["max_abs_logp_diff"] == largest
    assert native["sweep"][0]["logp_equal_percent"] == pytest.approx(100 * equal, abs=1e-9)
    assert "native, by rollout batch cap and trainer micro-batch" in text


def test_a_mismatch_on_a_canonical_backend_exits_1(capsys, monkeypatch):
    original = check.rl_step

    def one_ulp_off(*args, **kwargs):
        result = original(*args, **kwargs)
        result.logp_train.view(torch.int32)[0, 0] += 1
        return result
    monkeypatch.setattr(check, "rl_step", one_ulp_off)
    monkeypatch.setattr(check, "ModelConfig", lambda: SMALL)
    assert cli.main(["rl-check", "--seed", "3"]) == 1          # a seed without a published digest: only the ulp counts
    equal, tokens = re.search(r"log-prob\s+\|\s+[0-9.e-]+\s+\|\s+(\d+)/(\d+)", capsys.readouterr().out).groups()
    assert int(equal) == int(tokens) - 1


@pytest.mark.parametrize("argv,words", [
    (["--seed", "-1"], ["--seed must be in [0, 2**31)", "-1"]),
    (["--json", "/nonexistent-folder/rl.json"], ["--json", "no folder"]),
    (["--backend", "native", "--world-size", "2", "--steps", "2"], ["--backend native", "--world-size"]),
])
def test_bad_input_exits_2(argv, words, capsys):
    assert cli.main(["rl-check", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bitparity rl-check: ") and all(w in err for w in words), err


@pytest.mark.parametrize("backend", ["cpu", "ascend"])
def test_the_compiled_backends_give_the_published_digest(backend):
    # The default step (12 requests, the default model) on the C backend and the Ascend emulation; the Triton
    # interpreter takes 44 s for it, so CI checks cuda on the first 3 requests against numpy
    # (tests/test_device_checks.py, through scripts/gpu_check.py's rl_check step).
    doc, _ = check.check(backend, 0)
    assert doc["consistent"] and doc["matches_published"], doc["digest"]


def test_rollout_correction_reports_the_mismatch_metrics(tmp_path, capsys, captured, monkeypatch):
    """Zero on the canonical backend; on native, what its own tensors show (max |dlogp|, differing fraction)."""
    monkeypatch.setattr(check, "ModelConfig", lambda: SMALL)
    monkeypatch.setattr(check, "NATIVE_BATCH_CAPS", (None,))
    monkeypatch.setattr(check, "NATIVE_MICRO_BATCHES", (None,))
    out = tmp_path / "rl.json"
    assert cli.main(["rl-check", "--native", "--seed", "3", "--rollout-correction", "token,mask,1.0001,0.9999",
                     "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["mismatch"] == {"max_abs_logp_diff": 0.0, "mean_k3_kl": 0.0, "frac_logp_differ": 0.0,
                               "frac_rejected": 0.0}
    result = captured["native"][1]
    a, b, m = result.logp_train.numpy(), result.logp_rollout.numpy(), result.mask.numpy()
    native = doc["native"]["mismatch"]
    assert native["max_abs_logp_diff"] == float(np.abs(a - b)[m].max())
    assert native["frac_logp_differ"] == pytest.approx(float((a != b)[m].mean()), rel=1e-6)
    ratio = np.exp(a.astype(np.float64) - b)[m]
    assert native["frac_rejected"] == pytest.approx(float(((ratio > 1.0001) | (ratio < 0.9999)).mean()), abs=0.01)
    assert "mismatch metrics (spec 27.2)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["rl-check", "--rollout-correction", "token,truncate"])


@pytest.fixture
def nothing_runs(monkeypatch):
    """check.check and check.train_check fail the test if called: a refusal must come before the RL step."""
    for name in ("check", "train_check"):
        monkeypatch.setattr(check, name, lambda *a, **k: pytest.fail("the RL step ran despite a bad argument"))


@pytest.mark.parametrize("value, words", [
    ("token,mask,0", "THRESHOLD must be finite and in (0.0, inf); got 0.0"),
    ("token,mask,nan", "THRESHOLD must be finite and in (0.0, inf); got nan"),
    ("token,truncate,inf", "THRESHOLD must be finite"),
    ("token,mask,-2", "THRESHOLD must be finite and in (0.0, inf); got -2.0"),
    ("token,mask,1e-40", "THRESHOLD must round to a normal float32"),
    ("sequence,mask,2,3", "LOW must be <= THRESHOLD after rounding to float32"),
    ("token,mask,2,0", "LOW must be finite and in (0.0, inf); got 0.0"),
    ("token,mask,2,1e39", "LOW must round to a normal float32"),
    ("token,mask,two", "THRESHOLD and LOW must be numbers"),
    ("token,clip,2", "LEVEL must be one of"),
    ("token,mask", "expected LEVEL,MODE,THRESHOLD[,LOW]"),
])
def test_a_bad_rollout_correction_is_refused_while_parsing(value, words, capsys, nothing_runs):
    """argparse's error (status 2, its one 'error:' line) before anything runs; it used to be a traceback and
    status 1 after the whole RL step."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["rl-check", "--rollout-correction", value])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("bitparity rl-check: error: argument --rollout-correction: ") and words in error, error


@pytest.mark.parametrize("argv, words", [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--steps", "-3"], "--steps must be >= 1"),
    (["--micro-batch", "3", "--steps", "2"], "--micro-batch a power of two"),
    (["--micro-batch", "0"], "--micro-batch a power of two"),
    (["--world-size", "3", "--steps", "2"], "--world-size must be 1, 2, 4 or 8"),
    (["--world-size", "0"], "--world-size must be 1, 2, 4 or 8"),
    (["--seed", str(2**31)], "--seed must be in [0, 2**31)"),
    (["--rollout-correction", "token,mask,2", "--steps", "2"], "--rollout-correction reports one step"),
    (["--rollout-correction", "token,mask,2", "--world-size", "2"], "--rollout-correction reports one step"),
])
def test_bad_numbers_exit_2_before_anything_runs(argv, words, capsys, nothing_runs):
    assert cli.main(["rl-check", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bitparity rl-check: ") and words in err and err.count("\n") == 1, err
