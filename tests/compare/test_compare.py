"""The comparison layer: what `bitparity compare` reports, and the CLI around it."""

import json

import pytest

from bitparity import SPEC_VERSION, cli
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
