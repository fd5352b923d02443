"""A validator for the run document of docs/report-schema.md (schema_version 2).

`validate(doc)` raises ValueError listing every problem it finds; `bitparity diff` runs it on
both inputs, so a truncated or foreign file is refused before anything is compared.
"""

import re

from .report import SCHEMA, SCHEMA_VERSION

HEX64 = re.compile(r"^[0-9a-f]{64}$")

_STR_OR_NULL = (str, type(None))
TOP = {"schema": str, "schema_version": int, "created": str, "command": _STR_OR_NULL, "spec_version": str,
       "suite_version": str, "tier": str, "seed": int, "packages": dict, "machine": dict, "device": dict,
       "backend_info": list, "backends": list, "skipped": list, "subsets": list, "timing": dict, "warnings": list,
       "ulp_bins": list, "cases": list, "results": list}
DEVICE = {k: _STR_OR_NULL for k in ("cpu", "gpu", "npu", "cuda_runtime", "cuda_driver", "cann")}
PACKAGES = ("bitparity", "torch", "numpy", "triton", "torch_npu")
RESULT_NUMBERS = ("exact_percent", "max_ulp", "logdiff", "median_ms", "q1_ms", "q3_ms", "min_ms", "max_ms",
                  "ratio_to_native")
TIMING = {"warmup": int, "min_runs": int, "repeats": int, "budget_s": (int, float)}


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


def _list(doc, key):
    """doc[key] if it is a list (a wrong type is reported by TOP's check), else []."""
    return doc[key] if isinstance(doc.get(key), list) else []


def _case(i, case, names, partial, problems):
    where = f"cases[{i}]"
    if not _fields(where, case, {"name": str, "op": str, "shapes": dict, "digests": dict}, problems):
        return
    for key, shape in case.get("shapes", {}).items():
        if not (isinstance(shape, list) and all(isinstance(d, int) and d > 0 for d in shape)):
            problems.append(f"{where}.shapes.{key}: expected a list of positive ints")
    digests = case.get("digests", {})
    if isinstance(digests, dict):
        # A backend that ran a subset of the suite (doc["subsets"]) has digests of its cases only.
        if not set(names) - set(partial) <= set(digests) <= set(names):
            problems.append(f"{where}.digests: backends {sorted(digests)} are not the run's {sorted(names)} "
                            f"(less those that ran a subset, {sorted(partial)})")
        problems.extend(f"{where}.digests.{b}: not a hex SHA-256" for b, d in digests.items()
                        if not (isinstance(d, str) and HEX64.match(d)))
    if "tensors" in case:           # a gradient case: each backend's digest of each tensor, for the same backends
        _tensors(where, case["tensors"], digests, problems)


def _tensors(where, tensors, digests, problems):
    if not isinstance(tensors, dict) or set(tensors) != set(digests if isinstance(digests, dict) else ()):
        problems.append(f"{where}.tensors: expected an object with the backends of digests")
        return
    for b, named in tensors.items():
        if not (isinstance(named, dict) and named and all(isinstance(d, str) and HEX64.match(d)
                                                           for d in named.values())):
            problems.append(f"{where}.tensors.{b}: expected an object of tensor name -> hex SHA-256")


def _result(i, r, names, bins, problems):
    where = f"results[{i}]"
    spec = {"op": str, "backend": str, "cases": int, "elements": int, "identical": int, "runs": int,
            "clock": _STR_OR_NULL, "ulp_histogram": list}
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
    if isinstance(doc.get("timing"), dict):
        _fields("timing", doc["timing"], TIMING, problems)
    for i, s in enumerate(_list(doc, "skipped")):
        _fields(f"skipped[{i}]", s, {"name": str, "reason": str}, problems)
    for i, s in enumerate(_list(doc, "subsets")):
        _fields(f"subsets[{i}]", s, {"backend": str, "rule": str}, problems)
    problems.extend(f"warnings[{i}]: expected a string" for i, w in enumerate(_list(doc, "warnings"))
                    if not isinstance(w, str))
    names, bins = _list(doc, "backends"), _list(doc, "ulp_bins")
    partial = [s.get("backend") for s in _list(doc, "subsets") if isinstance(s, dict)]
    for i, case in enumerate(_list(doc, "cases")):
        _case(i, case, names, partial, problems)
    seen = [c.get("name") for c in _list(doc, "cases") if isinstance(c, dict)]
    if len(seen) != len(set(seen)):
        problems.append("cases: names are not unique")
    for i, r in enumerate(_list(doc, "results")):
        _result(i, r, names, bins, problems)
    if problems:
        raise ValueError("not a bitparity run document: " + "; ".join(problems))
    return doc
