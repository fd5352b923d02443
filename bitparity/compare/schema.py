"""A validator for the run document of docs/report-schema.md (schema_version 1).

`validate(doc)` raises ValueError listing every problem it finds; `bitparity diff` runs it on
both inputs, so a truncated or foreign file is refused before anything is compared.
"""

import re

from .report import SCHEMA, SCHEMA_VERSION

HEX64 = re.compile(r"^[0-9a-f]{64}$")

_STR_OR_NULL = (str, type(None))
TOP = {"schema": str, "schema_version": int, "created": str, "command": _STR_OR_NULL, "spec_version": str,
       "suite_version": str, "tier": str, "seed": int, "packages": dict, "machine": dict, "device": dict,
       "backend_info": list, "backends": list, "ulp_bins": list, "cases": list, "results": list}
DEVICE = {k: _STR_OR_NULL for k in ("cpu", "gpu", "npu", "cuda_runtime", "cuda_driver", "cann")}
PACKAGES = ("bitparity", "torch", "numpy", "triton", "torch_npu")
RESULT_NUMBERS = ("exact_percent", "max_ulp", "logdiff", "median_ms", "ratio_to_native")


def _number(v):
    """A measured number: a JSON number, "inf", or null (not measured)."""
    return v is None or v == "inf" or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _fields(where, obj, spec, problems):
    if not isinstance(obj, dict):
        problems.append(f"{where}: expected an object, got {type(obj).__name__}")
        return False
    for key, kind in spec.items():
        if key not in obj:
            problems.append(f"{where}: missing {key!r}")
        elif not isinstance(obj[key], kind) or (kind is int and isinstance(obj[key], bool)):
            problems.append(f"{where}.{key}: wrong type {type(obj[key]).__name__}")
    return True


def _case(i, case, names, problems):
    where = f"cases[{i}]"
    if not _fields(where, case, {"name": str, "op": str, "shapes": dict, "digests": dict}, problems):
        return
    for key, shape in case.get("shapes", {}).items():
        if not (isinstance(shape, list) and all(isinstance(d, int) and d > 0 for d in shape)):
            problems.append(f"{where}.shapes.{key}: expected a list of positive ints")
    digests = case.get("digests", {})
    if isinstance(digests, dict):
        if set(digests) != set(names):
            problems.append(f"{where}.digests: backends {sorted(digests)} differ from the run's {sorted(names)}")
        problems.extend(f"{where}.digests.{b}: not a hex SHA-256" for b, d in digests.items()
                        if not (isinstance(d, str) and HEX64.match(d)))


def _result(i, r, names, bins, problems):
    where = f"results[{i}]"
    spec = {"op": str, "backend": str, "elements": int, "identical": int, "ulp_histogram": list}
    if not _fields(where, r, spec, problems):
        return
    problems.extend(f"{where}.{k}: expected a number, \"inf\" or null" for k in RESULT_NUMBERS
                    if not _number(r.get(k, 0)) or k not in r)
    if r.get("backend") not in names:
        problems.append(f"{where}.backend: {r.get('backend')!r} is not among the run's backends")
    hist = r.get("ulp_histogram")
    if isinstance(hist, list) and (len(hist) != len(bins) or not all(isinstance(c, int) for c in hist)):
        problems.append(f"{where}.ulp_histogram: expected {len(bins)} integer counts")


def validate(doc):
    """Raise ValueError naming every way doc departs from the schema; return doc if it does not."""
    problems = []
    if not _fields("document", doc, TOP, problems):
        raise ValueError("not a bitparity run document: " + "; ".join(problems))
    if doc.get("schema") != SCHEMA or doc.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"schema: expected {SCHEMA!r} version {SCHEMA_VERSION}; got {doc.get('schema')!r} "
                        f"version {doc.get('schema_version')!r}")
    if doc.get("tier") not in ("quick", "full"):
        problems.append(f"tier: expected quick or full; got {doc.get('tier')!r}")
    if isinstance(doc.get("device"), dict):
        _fields("device", doc["device"], DEVICE, problems)
    if isinstance(doc.get("packages"), dict):
        _fields("packages", doc["packages"], {k: _STR_OR_NULL for k in PACKAGES}, problems)
    names = doc.get("backends") if isinstance(doc.get("backends"), list) else []
    bins = doc.get("ulp_bins") if isinstance(doc.get("ulp_bins"), list) else []
    for i, case in enumerate(doc.get("cases") or []):
        _case(i, case, names, problems)
    seen = [c.get("name") for c in doc.get("cases") or [] if isinstance(c, dict)]
    if len(seen) != len(set(seen)):
        problems.append("cases: names are not unique")
    for i, r in enumerate(doc.get("results") or []):
        _result(i, r, names, bins, problems)
    if problems:
        raise ValueError("not a bitparity run document: " + "; ".join(problems))
    return doc
