"""`bitparity compare --out/--plots/--format` and `bitparity diff`, end to end through the CLI."""

import contextlib
import copy
import io
import json
import re

import numpy as np
import pytest

from bitparity import SPEC_VERSION, cli
from bitparity.compare import cases, golden, grad_cases, report, schema
from bitparity.compare.run import GRAD_BUDGET_S, TIMING

BACKENDS = ("numpy", "cpu", "ascend", "native")
OPS = ("log_softmax", "masked_whiten")
GRAD_OPS = ("rms_norm.backward", "SGD.step")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One small compare: two ops on the CPU-side backends, with its document and plots."""
    d = tmp_path_factory.mktemp("run")
    argv = ["compare", "--quick", "--format", "markdown", "--out", str(d / "run.json"), "--plots", str(d / "plots")]
    for b in BACKENDS:
        argv += ["--backend", b]
    for op in OPS + GRAD_OPS:
        argv += ["--op", op]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert cli.main(argv) == 0
    return {"dir": d, "doc": json.loads((d / "run.json").read_text()), "markdown": out.getvalue(), "err": err.getvalue()}


def test_run_document_is_valid_and_self_describing(run):
    doc = schema.validate(run["doc"])
    assert doc["spec_version"] == SPEC_VERSION and doc["suite_version"] == cases.SUITE_VERSION
    assert doc["backends"] == list(BACKENDS) and doc["packages"]["torch"] and doc["device"]["gpu"] is None
    assert [c["name"] for c in doc["cases"]] == [c.name for c in cases.suite("quick", list(OPS))
                                                 + grad_cases.suite("quick", list(GRAD_OPS))]
    assert doc["skipped"] == [] and doc["subsets"] == []
    assert doc["timing"] == dict(TIMING, gradient_budget_s=GRAD_BUDGET_S)
    assert "compare quick: agreement [" in run["err"] and "compare quick: timing [" in run["err"]


def test_every_result_carries_its_timing_and_spread(run):
    results = run["doc"]["results"]
    native = {r["op"]: r for r in results if r["backend"] == "native"}
    for r in results:
        assert r["cases"] == sum(c["op"] == r["op"] for c in run["doc"]["cases"])
        assert TIMING["min_runs"] <= r["runs"] <= TIMING["repeats"] and r["clock"] == "perf_counter"
        assert 0 < r["min_ms"] <= r["q1_ms"] <= r["median_ms"] <= r["q3_ms"] <= r["max_ms"]
        assert r["ratio_to_native"] == pytest.approx(r["median_ms"] / native[r["op"]]["median_ms"])
    r = next(r for r in results if r["op"] == "masked_whiten" and r["backend"] == "ascend")
    cells = {tuple(c.strip() for c in line.split("|")[1:-1])[:2]: [c.strip() for c in line.split("|")[1:-1]]
             for line in run["markdown"].splitlines() if line.startswith("| ")}
    assert cells[("op", "backend")] == list(report.HEADERS)
    row = dict(zip(report.HEADERS, cells[("masked_whiten", "ascend")]))
    assert row["cases"] == str(r["cases"]) and row["runs"] == str(r["runs"])
    assert row["IQR %"] == f"{100 * (r['q3_ms'] - r['q1_ms']) / r['median_ms']:.0f}"


def test_run_digests_are_the_golden_ones_on_canonical_backends(run):
    want = {c["name"]: c.get("digest", c.get("tensors")) for c in golden.load()["cases"]}
    for case in run["doc"]["cases"]:
        key = "tensors" if "tensors" in case else "digests"
        assert [case[key][b] for b in ("numpy", "cpu", "ascend")] == [want[case["name"]]] * 3
    exact = {(r["op"], r["backend"]): r["exact_percent"] for r in run["doc"]["results"]}
    assert all(exact[(op, b)] == 100.0 for op in OPS + GRAD_OPS for b in ("cpu", "ascend"))
    assert exact[("log_softmax", "native")] < 100.0


def test_ulp_histograms_count_every_element(run):
    for r in run["doc"]["results"]:
        assert sum(r["ulp_histogram"]) == r["elements"] > 0


def test_markdown_embeds_the_plots_and_they_are_drawn(run):
    import matplotlib.image

    for name in ("agreement.png", "ulp_histograms.png", "cost_ratio.png"):
        path = run["dir"] / "plots" / name
        assert f"]({path})" in run["markdown"]
        pixels = matplotlib.image.imread(path)
        assert pixels.shape[0] > 300 and pixels.shape[1] > 500 and pixels[..., :3].std() > 0.05   # not blank
    assert re.search(r"\| log_softmax +\| native", run["markdown"])


def test_schema_validator_names_what_is_wrong(run):
    doc = copy.deepcopy(run["doc"])
    del doc["device"]
    doc["cases"][0]["digests"]["cpu"] = "xyz"
    del doc["cases"][1]["digests"]["ascend"]
    doc["results"][0]["max_ulp"] = "big"
    doc["results"][1]["q3_ms"] = "slow"
    doc["skipped"] = [{"name": "cuda"}]
    doc["schema_version"] = 1
    with pytest.raises(ValueError) as err:
        schema.validate(doc)
    for part in ("missing 'device'", "cases[0].digests.cpu: not a hex SHA-256", "cases[1].digests: backends",
                 "results[0].max_ulp", "results[1].q3_ms", "skipped[0]: missing 'reason'", "version 1"):
        assert part in str(err.value)
    # A backend that ran a subset of the suite may lack a case's digest.
    partial = copy.deepcopy(run["doc"])
    partial["subsets"] = [{"backend": "ascend", "rule": "the first case only"}]
    for case in partial["cases"][1:]:
        del case["digests"]["ascend"]
        case.get("tensors", {}).pop("ascend", None)           # a gradient case: its tensors' digests too
    assert schema.validate(partial) is partial


def _write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_diff_of_a_run_with_itself_agrees(run, tmp_path, capsys):
    a = _write(tmp_path, "a.json", run["doc"])
    assert cli.main(["diff", a, a]) == 0
    assert "every canonical digest agrees" in capsys.readouterr().out
    assert cli.main(["diff", a, a, "--format", "json"]) == 0
    pairs = json.loads(capsys.readouterr().out)["pairs"]
    n = len(run["doc"]["cases"])
    canonical = [x for x in BACKENDS if x != "native"]
    assert [(p["a"], p["b"], p["equal"], p["different"]) for p in pairs] == (
        [(x, x, n, 0) for x in BACKENDS] + [(x, y, n, 0) for x in canonical for y in canonical if x != y])


def test_diff_pairs_cuda_on_one_machine_with_ascend_on_another(run, tmp_path, capsys):
    # Machine a is the run with its ascend column relabelled cuda (the CUDA box); b is the run with
    # one ascend digest corrupted (the Ascend box).  Every canonical backend of a is paired with
    # b's ascend, cuda among them, and native only with native.
    a = copy.deepcopy(run["doc"])
    a["backends"] = ["cuda" if n == "ascend" else n for n in a["backends"]]
    for case in a["cases"]:
        case["digests"]["cuda"] = case["digests"].pop("ascend")
        if "tensors" in case:
            case["tensors"]["cuda"] = case["tensors"].pop("ascend")
    for r in a["results"]:
        r["backend"] = "cuda" if r["backend"] == "ascend" else r["backend"]
    b = copy.deepcopy(run["doc"])
    b["cases"][2]["digests"]["ascend"] = "0" * 64
    assert cli.main(["diff", _write(tmp_path, "a.json", a), _write(tmp_path, "b.json", b), "--format", "json"]) == 1
    result = json.loads(capsys.readouterr().out)
    pairs = {(p["a"], p["b"]): p for p in result["pairs"]}
    assert pairs[("cuda", "ascend")]["different"] == 1 and pairs[("cuda", "cpu")]["different"] == 0
    assert not [p for p in pairs if "native" in p and p != ("native", "native")]
    assert {(d["a"], d["b"]) for d in result["different"]} == {("numpy", "ascend"), ("cpu", "ascend"),
                                                                ("cuda", "ascend")}


def test_diff_fails_on_a_differing_canonical_digest(run, tmp_path, capsys):
    b = copy.deepcopy(run["doc"])
    victim = b["cases"][3]
    victim["digests"]["cpu"] = "0" * 64
    for case in b["cases"]:                     # native differs too: reported, but not a failure alone
        case["digests"]["native"] = "f" * 64
    assert cli.main(["diff", _write(tmp_path, "a.json", run["doc"]), _write(tmp_path, "b.json", b)]) == 1
    out = capsys.readouterr().out
    assert "canonical digests DIFFER" in out and victim["name"] in out and "0" * 16 in out
    assert "native: not canonical" in out


def test_diff_refuses_runs_of_different_seeds_and_invalid_files(run, tmp_path, capsys):
    a = _write(tmp_path, "a.json", run["doc"])
    assert cli.main(["diff", a, _write(tmp_path, "b.json", dict(run["doc"], seed=1))]) == 2
    assert "seed 0 vs 1" in capsys.readouterr().err
    assert cli.main(["diff", a, _write(tmp_path, "c.json", {"schema": "something else"})]) == 2
    assert "not a bitparity run document" in capsys.readouterr().err
    assert cli.main(["diff", str(tmp_path / "nonexistent.json"), a]) == 2
    assert "nonexistent.json" in capsys.readouterr().err
    (tmp_path / "d.json").write_text("{")
    assert cli.main(["diff", a, str(tmp_path / "d.json")]) == 2
    assert "d.json" in capsys.readouterr().err


def test_ulp_histogram_bins():
    from bitparity.compare.run import ULP_BIN_LABELS, ulp_histogram
    counts = ulp_histogram(np.array([0.0, 0.1, 0.125, 0.2, 1.0, 1.5, 5000.0, np.inf]))
    assert dict(zip(ULP_BIN_LABELS, counts.tolist())) == {
        "0": 1, "<=1/8": 2, "<=1/4": 1, "<=1/2": 0, "<=1": 1, "<=2": 1, "<=4": 0, "<=8": 0, "<=16": 0,
        "<=64": 0, "<=1024": 0, ">1024": 1, "inf": 1}


def test_where_names_no_accelerator_for_a_cuda_build_without_a_gpu():
    doc = {"device": {"cpu": "Xeon", "gpu": None, "npu": None, "cuda_runtime": "12.8", "cuda_driver": None,
                      "cann": None}, "packages": {"torch": "2.9"}, "machine": {"cpu_count": 2}}
    assert report.where(doc) == "Xeon (2 cores); no GPU or NPU, cuda_runtime 12.8; torch 2.9"


def test_diff_names_the_gradient_tensor_that_differs(run, tmp_path, capsys):
    b = copy.deepcopy(run["doc"])
    victim = next(c for c in b["cases"] if c["name"].startswith("rms_norm.backward/"))
    victim["tensors"]["ascend"]["dweight"] = "0" * 64
    victim["digests"]["ascend"] = "1" * 64
    assert cli.main(["diff", _write(tmp_path, "a.json", run["doc"]), _write(tmp_path, "b.json", b),
                     "--format", "json"]) == 1
    different = json.loads(capsys.readouterr().out)["different"]
    assert {(d["case"], tuple(d["tensors"])) for d in different} == {(victim["name"], ("dweight",))}
    assert cli.main(["diff", _write(tmp_path, "a.json", run["doc"]), _write(tmp_path, "b.json", b)]) == 1
    assert "| dweight " in capsys.readouterr().out


def test_schema_checks_the_gradient_tensors_digests(run):
    doc = copy.deepcopy(run["doc"])
    case = next(c for c in doc["cases"] if "tensors" in c)
    case["tensors"]["cpu"][next(iter(case["tensors"]["cpu"]))] = "not hex"
    with pytest.raises(ValueError, match=r"tensors\.cpu: expected an object of tensor name -> hex SHA-256"):
        schema.validate(doc)
    del case["tensors"]["numpy"]
    with pytest.raises(ValueError, match="tensors: expected an object with the backends of digests"):
        schema.validate(doc)
