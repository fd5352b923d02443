"""Bad input to the `bitparity` commands: a message naming what is wrong and exit status 2, before
any long run, never a traceback (and never status 1, which `diff` and `verify` keep for differing bits)."""

import importlib
import json
import sys
from types import SimpleNamespace

import pytest

from bitparity import cli
from bitparity.compare import run


def _fails(argv, capsys, *words):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bitparity {argv[0]}: ") and all(w in err for w in words), err


def test_diff_of_a_missing_file(tmp_path, capsys):
    _fails(["diff", str(tmp_path / "nonexistent.json"), str(tmp_path / "b.json")], capsys, "nonexistent.json")


def test_verify_with_a_json_that_is_not_a_golden_file(tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"cases": []}))
    _fails(["verify", "--backend", "cpu", "--golden", str(path)], capsys, "not a golden digest file", "spec_version")


def test_bench_with_zero_repeats(capsys):
    _fails(["bench", "--backend", "cpu", "--repeats", "0"], capsys, "repeats must be an integer >= 1")


@pytest.mark.parametrize("command", ("probe", "verify", "bench", "rl-check"))
def test_an_unavailable_backend_is_one_line_and_status_2_in_every_command(command, monkeypatch, capsys):
    # cuda's backend module, as the registry sees it, says what a machine without triton or a GPU says;
    # every caller of bitparity.backends.availability (and so backends()) gets that reason.
    registry = importlib.import_module("bitparity.backends")
    monkeypatch.setitem(registry._modules, "cuda", SimpleNamespace(availability=lambda: (False, "no GPU (test)")))
    assert cli.main([command, "--backend", "cuda"]) == 2
    assert capsys.readouterr().err == f"bitparity {command}: backend cuda is not available here: no GPU (test)\n"


def test_compare_checks_plots_and_out_before_running(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "compare", lambda **kwargs: pytest.fail("compare ran despite bad arguments"))
    _fails(["compare", "--out", str(tmp_path / "no" / "such" / "run.json")], capsys, "--out", "no folder")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    _fails(["compare", "--out", str(tmp_path / "run.json"), "--plots", str(tmp_path)], capsys,
           "--plots", "pip install 'bitparity[plots]'")


def test_compare_warns_about_an_unavailable_backend(monkeypatch, tmp_path, capsys):
    unavailable = {"ascend": (False, "no NPU (test)")}
    monkeypatch.setattr(cli, "availability", lambda b: unavailable.get(b, (True, "")))
    monkeypatch.setattr(run, "availability", lambda b: unavailable.get(b, (True, "")))
    assert cli.main(["compare", "--backend", "numpy", "--backend", "ascend", "--op", "exp",
                     "--out", str(tmp_path / "run.json")]) == 0
    assert "warning: skipping --backend ascend: no NPU (test)" in capsys.readouterr().err
    assert json.loads((tmp_path / "run.json").read_text())["backends"] == ["numpy"]


@pytest.mark.parametrize("seed", ["-1", str(2**63)])
def test_compare_refuses_a_seed_outside_int64_before_running(seed, monkeypatch, tmp_path, capsys):
    """A negative seed used to reach numpy's generator and end in a traceback, status 1."""
    monkeypatch.setattr(cli, "compare", lambda **kwargs: pytest.fail("compare ran despite bad arguments"))
    _fails(["compare", "--seed", seed, "--out", str(tmp_path / "run.json")], capsys, "--seed must be in [0, 2**63)",
           seed)


def test_output_paths_are_checked_before_running(monkeypatch, tmp_path, capsys):
    """--plots and --out that cannot be written are refused before the run (they used to fail after it)."""
    monkeypatch.setattr(cli, "compare", lambda **kwargs: pytest.fail("compare ran despite bad arguments"))
    monkeypatch.setattr(cli.probe, "probe", lambda *a: pytest.fail("probe ran despite bad arguments"))
    monkeypatch.setattr(cli.bench, "run", lambda *a, **k: pytest.fail("bench ran despite bad arguments"))
    for plots in (cli.plotting, importlib.import_module("bitparity.demo.plots")):     # with or without matplotlib
        monkeypatch.setattr(plots, "pyplot", lambda: None)
    a_file = tmp_path / "file"
    a_file.write_text("")
    _fails(["compare", "--out", str(tmp_path / "run.json"), "--plots", str(a_file / "plots")], capsys,
           "--plots", "is not a folder")
    _fails(["probe", "--out", str(tmp_path / "no" / "report.md")], capsys, "--out", "no folder")
    _fails(["bench", "--backend", "cpu", "--out", str(tmp_path / "no" / "bench.md")], capsys, "--out", "no folder")
    _fails(["demo", "order", "--plots", str(a_file)], capsys, "--plots", "not a folder")
