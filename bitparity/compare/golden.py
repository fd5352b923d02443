"""Golden digests: one SHA-256 per suite case, so a platform is checked without moving tensors.

A case's digest is the SHA-256 of its output's canonical bytes: a float32
result as little-endian int32 after every NaN becomes 0x7FC00000
(metrics.canonical_bits), an integer result as its little-endian bytes, the
parts of a tuple concatenated in order.  A gradient case (compare/grad_cases.py)
has one digest per recorded tensor ("dx", "dweight", "exp_avg", ...), under
"tensors", so a mismatch names the tensor.  The file
bitparity/golden/spec-v<SPEC_VERSION>.json ships inside the package (package
data), so an installed bitparity verifies without its source tree.  It is part
of the spec release, written once by the `cpu` backend (equal bit for bit to
the `numpy` backend, the spec executed) when the spec changes, by one command:

    python -m bitparity.compare.golden --write [--quick --out FILE]

A machine under test never writes its own: digests it wrote would only agree
with themselves.
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

from ..backends import availability
from ..spec import SPEC_VERSION
from . import cases, grad_cases, metrics
from .cli_common import Progress

# Package data (pyproject.toml), beside the code that reads it, in a wheel as in a checkout.
GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
WRITER = "cpu"


def default_path():
    return GOLDEN_DIR / f"spec-v{SPEC_VERSION}.json"


def _parts(output):
    return output if isinstance(output, tuple) else (output,)


def canonical_bytes(output):
    """The bytes a digest is taken of (module docstring)."""
    chunks = []
    for part in _parts(output):
        if part.is_floating_point():
            if part.dtype != torch.float32:
                raise TypeError(f"a digested float result must be float32; got {part.dtype}")
            chunks.append(metrics.canonical_bits(part).numpy().astype("<i4").tobytes())
        else:
            a = part.detach().cpu().numpy()
            chunks.append(a.astype(a.dtype.newbyteorder("<")).tobytes())
    return b"".join(chunks)


def digest(output):
    """Hex SHA-256 of an op's output (a tensor or a tuple of tensors)."""
    return hashlib.sha256(canonical_bytes(output)).hexdigest()


def tensor_digests(grads):
    """{tensor name: digest} of a gradient case's output, in its order."""
    return {name: digest(t) for name, t in grads.items()}


def compute(tier, backend=WRITER, progress=True):
    """The golden document of a tier, computed on backend case by case: the forward cases, then the gradient
    cases (one digest per tensor)."""
    suite = cases.suite(tier) + grad_cases.suite(tier)
    rows = []
    with Progress(len(suite), f"golden {tier} on {backend}", enabled=progress) as bar:
        for case in suite:
            row = {"name": case.name, "op": case.op, "tier": case.tier, "shapes": case.shapes}
            if isinstance(case, grad_cases.GradCase):
                row["tensors"] = tensor_digests(case.run(backend))
            else:
                row["digest"] = digest(case.run(backend))
            rows.append(row)
            bar.step(case.name)
    return {"spec_version": SPEC_VERSION, "suite_version": cases.SUITE_VERSION, "tier": tier,
            "writer": backend, "cases": rows}


def dumps(doc):
    """The golden document as JSON with one case per line, so a regenerated file diffs case by case."""
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, indent=1)[:-2]
    rows = ",\n".join("  " + json.dumps(c) for c in doc["cases"])
    return f'{head},\n "cases": [\n{rows}\n ]\n}}\n'


def load(path=None):
    """The golden document at path (default: the shipped bitparity/golden/spec-v<SPEC_VERSION>.json)."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise FileNotFoundError(f"no golden digest file at {path}: the golden digests come from the published "
                                f"spec release, never from the machine under test; bitparity ships those of spec "
                                f"{SPEC_VERSION} as {default_path()}")
    return json.loads(path.read_text())


def _max_ulp_and_first_diff(got, want):
    """Against the local canonical output: the worst ulp distance of the float parts (None if
    there are none) and the first flat index whose bits differ (None if none does)."""
    g = [p.detach().cpu() for p in _parts(got)]
    w = [p.detach().cpu() for p in _parts(want)]
    max_ulp, first, offset = None, None, 0
    for gp, wp in zip(g, w):
        gp, wp = gp.reshape(-1), wp.reshape(-1)
        if gp.is_floating_point():
            err = metrics.ulp_error(gp.double().numpy(), wp.double().numpy())
            max_ulp = max(max_ulp or 0.0, metrics.max_or_zero(err))
            differ = metrics.canonical_bits(gp) != metrics.canonical_bits(wp)
        else:
            differ = gp != wp
        idx = torch.nonzero(differ)
        if first is None and idx.numel():
            first = offset + int(idx[0])
        offset += gp.numel()
    return max_ulp, first


def _check_row(row, out, want, local_out):
    """Fill row's match, and for a mismatch its max_ulp and first_diff against the local canonical output."""
    row["match"] = digest(out) == want
    if not row["match"]:
        row["max_ulp"], row["first_diff"] = _max_ulp_and_first_diff(out, local_out())
    return row


def verify(backend, tier="quick", golden=None, progress=True, names=None):
    """Run the tier on backend, forward and gradient cases (only the cases named in `names`, when given), and
    check each against the golden digests.

    Returns one dict per forward case and one per tensor of a gradient case: name, op, tensor (None for a forward
    case), match, and for a mismatch max_ulp and first_diff (the flat index in that tensor) against the canonical
    output recomputed here (the `cpu` backend; `numpy` where cpu cannot build or is the backend verified); error is
    the exception's text
    when the case raised on backend (then match is False for each of its rows), else None.
    """
    golden = golden if golden is not None else load()
    if golden["spec_version"] != SPEC_VERSION or golden["suite_version"] != cases.SUITE_VERSION:
        raise ValueError(f"the golden file is for spec {golden['spec_version']}, suite {golden['suite_version']}; "
                         f"this is spec {SPEC_VERSION}, suite {cases.SUITE_VERSION}")
    want = {row["name"]: row.get("tensors", row.get("digest")) for row in golden["cases"]}
    suite = [c for c in cases.suite(tier) + grad_cases.suite(tier) if names is None or c.name in names]
    missing = [c.name for c in suite if c.name not in want]
    if missing:
        raise ValueError(f"the golden file has no digests for {len(missing)} {tier} case(s), e.g. {missing[0]}: "
                         f"it was written for the {golden['tier']} tier")
    # The canonical result a mismatch is measured against: the writer's, or numpy's where the writer cannot build or
    # is the backend under test (a wrong cpu kernel must not be its own yardstick).
    local = WRITER if availability(WRITER)[0] and backend != WRITER else "numpy"
    results = []
    with Progress(len(suite), f"verify {tier} on {backend}", enabled=progress) as bar:
        for case in suite:
            results.extend(_verify_case(case, backend, local, want[case.name]))
            bar.step(case.name)
    return results


def _verify_case(case, backend, local, want):
    """verify's rows of one case: one for a forward case, one per tensor of a gradient case."""
    inputs = case.inputs()
    gradient = isinstance(case, grad_cases.GradCase)
    tensors = case.tensors if gradient else (None,)
    rows = [{"name": case.name, "op": case.op, "tensor": t, "match": False, "max_ulp": None, "first_diff": None,
             "error": None} for t in tensors]
    try:
        out = case.run(backend, inputs)
    except Exception as err:                        # a case that raises is a failed case, not the end of the run
        for row in rows:
            row["error"] = f"{type(err).__name__}: {err}"
        return rows
    local_out = {}

    def canonical():                                # computed once, and only for a mismatch
        if "out" not in local_out:
            local_out["out"] = case.run(local, inputs)
        return local_out["out"]
    if not gradient:
        return [_check_row(rows[0], out, want, canonical)]
    return [_check_row(row, out[row["tensor"]], want.get(row["tensor"]), lambda t=row["tensor"]: canonical()[t])
            for row in rows]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bitparity.compare.golden", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", required=True,
                        help="recompute and write the golden file, forward and gradient cases (required: a deliberate "
                             "flag, since the default file is committed and verify trusts it)")
    parser.add_argument("--quick", action="store_true", help="the quick tier only (default: the full tier, "
                                                             "which holds the quick cases too)")
    parser.add_argument("--out", help="where to write (default: bitparity/golden/spec-v<SPEC_VERSION>.json)")
    args = parser.parse_args(argv)
    if args.quick and not args.out:
        parser.error("--quick needs --out: the default file holds the full tier, which verify --full needs")
    doc = compute("quick" if args.quick else "full")
    path = Path(args.out) if args.out else default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(doc))
    print(f"wrote {len(doc['cases'])} digests to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
