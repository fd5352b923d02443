"""Golden digests and `bitparity verify`: the committed file matches the code, every canonical
backend matches the file, and a wrong digest or a wrong backend is reported as a mismatch."""

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from bitparity import SPEC_VERSION, cli, spec
from bitparity.backends import resolve
from bitparity.compare import cases, golden, grad_cases, metrics

# SHA-256 of json.dumps([[name, digest], ...]) over the forward rows of spec 1.6.0's golden file (commit 2d5c219,
# bitparity/golden/spec-v1.6.0.json, carried unchanged into spec-v1.7.0.json by 8c42143) without the cases of the
# two ops that call linear (linear, moe): spec 2.0.0 changes linear's bits (spec 12) and no other op's. And the
# same hash over all of 2.0.0's forward rows, so that a forward bit cannot change unnoticed.
FORWARD_DIGESTS_1_6_0_WITHOUT_LINEAR = "73706539e888bbd37c40e00acc478e70ad2b7815a409080457daa7923761c223"
FORWARD_DIGESTS_2_0_0 = "a87157643669e2ae2dfb6e0c05fc5f134d5fcc18da71afaccc5634887dbe06c3"


@pytest.fixture(scope="module")
def committed():
    return golden.load()


def test_digest_is_sha256_of_little_endian_canonical_bits():
    # 1.0f is 0x3F800000; every NaN payload and sign becomes 0x7FC00000; int64 5 is 05 00 .. 00.
    one = hashlib.sha256(bytes.fromhex("0000803f")).hexdigest()
    assert golden.digest(torch.tensor([1.0])) == one
    nans = torch.tensor([0x7FC00000, 0x7F800001, -0x00400000], dtype=torch.int32).view(torch.float32)
    assert golden.digest(nans) == hashlib.sha256(bytes.fromhex("0000c07f") * 3).hexdigest()
    assert golden.digest(torch.tensor([0.0])) != golden.digest(torch.tensor([-0.0]))
    pair = (torch.tensor(1.0), torch.tensor([5], dtype=torch.int64))
    assert golden.digest(pair) == hashlib.sha256(bytes.fromhex("0000803f" + "05" + "00" * 7)).hexdigest()


def test_golden_file_describes_this_suite(committed):
    assert committed["spec_version"] == SPEC_VERSION and committed["suite_version"] == cases.SUITE_VERSION
    assert committed["tier"] == "full"           # the full tier holds the quick cases too: verify --full needs it
    full = cases.suite("full") + grad_cases.suite("full")
    assert [(c["name"], c["op"], c["tier"], c["shapes"]) for c in committed["cases"]] == \
        [(c.name, c.op, c.tier, c.shapes) for c in full]
    gradient = {c.name: c.tensors for c in grad_cases.suite("full")}
    for row in committed["cases"]:               # a digest per forward case, one per tensor of a gradient case
        assert ("digest" in row) != (row["name"] in gradient)
        assert row["name"] not in gradient or tuple(row["tensors"]) == gradient[row["name"]]


def test_the_forward_digests_are_spec_1_6_0s_but_linears(committed):
    rows = [[c["name"], c["digest"]] for c in committed["cases"] if "digest" in c]
    assert len(rows) == len(cases.suite("full"))
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == FORWARD_DIGESTS_2_0_0
    others = [[c["name"], c["digest"]] for c in committed["cases"] if "digest" in c and c["op"] not in ("linear", "moe")]
    assert hashlib.sha256(json.dumps(others).encode()).hexdigest() == FORWARD_DIGESTS_1_6_0_WITHOUT_LINEAR


def test_golden_file_is_not_stale(committed):
    """The quick tier recomputed on the cpu backend gives the committed digests: a change to an op's
    bits or to a case's inputs without `python -m bitparity.compare.golden --write` fails here."""
    fresh = golden.compute("quick", progress=False)["cases"]
    want = {c["name"]: c.get("digest", c.get("tensors")) for c in committed["cases"]}
    stale = [c["name"] for c in fresh if want[c["name"]] != c.get("digest", c.get("tensors"))]
    assert not stale, f"{len(stale)} stale golden digests, e.g. {stale[:3]}"


@pytest.mark.parametrize("backend", ("cpu", "numpy", "ascend"))
def test_verify_quick_tier_matches_every_case(backend, capsys):
    # ascend runs in the host emulation here (no NPU). cuda, in the Triton interpreter, verifies compare's
    # interpreter subset in tests/test_device_checks.py's gpu_check run, and its bits on the wide rows are
    # checked against numpy in tests/backends/test_bit_identity.py: the whole tier would cost CI minutes.
    assert cli.main(["verify", "--backend", backend, "--quick"]) == 0
    out = capsys.readouterr()
    gradient = grad_cases.suite("quick")
    n = len(cases.suite("quick")) + sum(len(c.tensors) for c in gradient)       # forward cases, gradient tensors
    assert f"{backend}: {n}/{n} quick digests (forward cases and gradient tensors) match" in out.out
    assert "MISMATCH" not in out.out
    cells = [[c.strip() for c in line.split("|")[1:4]] for line in out.out.splitlines() if line.startswith("| ")]
    assert ["linear.backward/bias/3x1100x17", "dbias", "match"] in cells
    cases_run = len(cases.suite("quick")) + len(gradient)
    assert f"verify quick on {backend} [" in out.err and f"{cases_run}/{cases_run}" in out.err      # the progress


def test_verify_reports_a_corrupted_digest(committed, tmp_path, capsys):
    bad = json.loads(json.dumps(committed))
    victim = next(c for c in bad["cases"] if c["name"] == "log_softmax/random/4x32000")
    victim["digest"] = victim["digest"][:-1] + ("0" if victim["digest"][-1] != "0" else "1")
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(bad))
    assert cli.main(["verify", "--backend", "cpu", "--golden", str(path), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    mismatches = [r for r in report["cases"] if not r["match"]]
    # The backend equals the local canonical result, so the file is the one that differs.
    assert mismatches == [{"name": victim["name"], "op": "log_softmax", "tensor": None, "match": False,
                           "max_ulp": 0.0, "first_diff": None, "error": None}]


def test_verify_names_the_gradient_tensor_whose_digest_differs(committed, tmp_path, capsys):
    bad = json.loads(json.dumps(committed))
    victim = next(c for c in bad["cases"] if c["name"] == "moe.backward/random/6x16x8x12x2")
    victim["tensors"]["dup_proj"] = "0" * 64
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(bad))
    rows = golden.verify("cpu", "quick", golden.load(path), progress=False, names={victim["name"]})
    assert [(r["tensor"], r["match"]) for r in rows] == [
        ("dx", True), ("drouter_weight", True), ("dgate_proj", True), ("dup_proj", False), ("ddown_proj", True)]
    # The backend equals the local canonical result, so the file is the one that differs.
    assert rows[3]["max_ulp"] == 0.0 and rows[3]["first_diff"] is None


def _rows_apart(real):
    """weight_grad with every row its own 32-row block (positions spread by spec.LINEAR_GRAD_BLOCK): each product
    rounded, then the row fold, i.e. 1.x's weight gradient. (Reversing the rows, this test's fault before 2.0.0,
    changes no bit now: a block's sum is exact in any order.) db, the same rule on a ones column, is left alone,
    so that only dweight is wrong."""
    def weight_grad(x, g, positions, rows):
        if x.shape[1] == 1:
            return real(x, g, positions, rows)
        return real(x, g, positions * spec.LINEAR_GRAD_BLOCK, rows * spec.LINEAR_GRAD_BLOCK)
    return weight_grad


@pytest.mark.parametrize("backend", ("cpu", "ascend"))
def test_a_wrong_backward_fails_verify_naming_its_op_and_tensor(backend, committed, monkeypatch, capsys):
    """Acceptance (issue 26): a backend's parameter-gradient blocks (ascend: its host emulation here), cut per row, are
    caught by the gradient goldens, which name linear's dweight (and only it: dx and dbias are other computations),
    with its max ulp against the local canonical result (cpu's, or numpy's when cpu is the one verified) and the
    first differing index."""
    module = resolve(backend, torch.device("cpu"))
    monkeypatch.setattr(module, "weight_grad", _rows_apart(module.weight_grad))
    picked = grad_cases.suite("quick", ["linear.backward"])
    monkeypatch.setattr(cases, "suite", lambda tier: [])
    monkeypatch.setattr(grad_cases, "suite", lambda tier: picked)
    assert cli.main(["verify", "--backend", backend, "--quick", "--format", "json"]) == 1
    rows = json.loads(capsys.readouterr().out)["cases"]
    wrong = [r for r in rows if not r["match"]]
    assert wrong and {(r["op"], r["tensor"]) for r in wrong} == {("linear.backward", "dweight")}
    assert all(r["max_ulp"] > 0 and isinstance(r["first_diff"], int) and r["error"] is None for r in wrong)
    assert all(r["match"] for r in rows if r["tensor"] != "dweight")
    assert cli.main(["verify", "--backend", backend, "--quick"]) == 1
    table = capsys.readouterr().out
    assert f"{backend}: {len(rows) - len(wrong)}/{len(rows)} quick digests" in table
    cells = [[c.strip() for c in line.split("|")[1:6]] for line in table.splitlines() if "MISMATCH" in line]
    assert sorted((name, tensor, float(ulp), int(first)) for name, tensor, _, ulp, first in cells) == sorted(
        (r["name"], "dweight", float(f"{r['max_ulp']:.3g}"), r["first_diff"]) for r in wrong)


def test_verify_native_mismatches_with_max_ulp_and_first_index(capsys):
    """torch's own log_softmax is not the canonical order: verify fails, and its max ulp and first
    differing index are those computed here directly from the two outputs."""
    assert cli.main(["verify", "--backend", "native", "--quick", "--format", "json"]) == 1
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["cases"]}
    case = next(c for c in cases.suite("quick", ["log_softmax"]) if c.name == "log_softmax/random/4x32000")
    inputs = case.inputs()
    got, want = case.run("native", inputs).reshape(-1), case.run("numpy", inputs).reshape(-1)
    differ = torch.nonzero(metrics.canonical_bits(got) != metrics.canonical_bits(want))
    row = rows[case.name]
    assert differ.numel() and not row["match"]
    assert row["first_diff"] == int(differ[0])
    assert row["max_ulp"] == metrics.max_or_zero(metrics.ulp_error(got.double().numpy(), want.double().numpy()))
    assert 0 < row["max_ulp"] < 64
    assert all(r["match"] for n, r in rows.items() if n.startswith("gae/carry"))   # torch's recurrence is the same


def test_verify_refuses_a_golden_file_of_another_suite(committed, tmp_path):
    other = dict(committed, suite_version="0")
    with pytest.raises(ValueError, match="suite 0"):
        golden.verify("cpu", "quick", other, progress=False)


def test_verify_without_a_golden_file_points_to_the_shipped_one_and_never_to_regenerating(tmp_path, capsys):
    # Digests written on the machine under test would only agree with that machine.
    missing = tmp_path / "none.json"
    assert cli.main(["verify", "--backend", "cpu", "--golden", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == (f"bitparity verify: no golden digest file at {missing}: the golden digests come from the published "
                   f"spec release, never from the machine under test; bitparity ships those of spec {SPEC_VERSION} as "
                   f"{golden.default_path()}\n")
    assert "--write" not in err


def test_the_golden_file_ships_in_the_wheel(tmp_path):
    """pyproject.toml declares it package data, so an installed bitparity verifies without the source tree.
    The wheel is built from a copy of the package, so the build leaves no build/ in the checkout."""
    root = Path(golden.__file__).resolve().parents[2]
    source = tmp_path / "source"
    shutil.copytree(root / "bitparity", source / "bitparity", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "wheel"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.read(f"bitparity/golden/spec-v{SPEC_VERSION}.json")
    assert shipped == golden.default_path().read_bytes()


def test_verify_records_a_case_that_raises_and_goes_on(committed, monkeypatch):
    picked = [c for c in cases.suite("quick", ["exp", "log"])]
    monkeypatch.setattr(cases, "suite", lambda tier: picked)
    monkeypatch.setattr(grad_cases, "suite", lambda tier: [])
    real_exp = cases.ops.exp

    def broken_exp(*args, backend, **kwargs):
        if backend == "cpu":
            raise ValueError("exp is broken here")
        return real_exp(*args, backend=backend, **kwargs)
    monkeypatch.setattr(cases.ops, "exp", broken_exp)
    rows = golden.verify("cpu", "quick", committed, progress=False)
    assert [r["op"] for r in rows] == [c.op for c in picked]
    assert all(not r["match"] and r["error"] == "ValueError: exp is broken here" for r in rows if r["op"] == "exp")
    assert all(r["match"] and r["error"] is None for r in rows if r["op"] == "log")


def test_golden_write_quick_must_not_overwrite_the_full_file(capsys):
    with pytest.raises(SystemExit):
        golden.main(["--write", "--quick"])
    assert "--quick needs --out" in capsys.readouterr().err
