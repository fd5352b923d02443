"""Compare two run documents case by case: where two machines' digests agree and where they differ.

Gradient cases (compare/grad_cases.py) are compared like forward cases, by the digest of all their tensors; where
one differs, the tensors whose own digests differ are named ("dweight", "exp_avg", ...).

Backends are paired by name first (cpu with cpu, native with native, ...), then every canonical
backend of a with every other canonical backend of b (cuda on the CUDA box with ascend on the
Ascend box, and so on): every canonical backend computes the spec, so all their digests must be
equal, across names and across machines.  `native` (torch's own ops, on each machine's GPU or NPU
when it has one) is paired only with `native`, and is reported but not expected to agree.
"""

from tabulate import tabulate

NATIVE = "native"
COMPARABLE = ("spec_version", "suite_version", "seed")


def incomparable(a, b):
    """Why a and b's digests cannot be compared (different spec, suite or seed), or None."""
    diffs = [f"{k} {a[k]} vs {b[k]}" for k in COMPARABLE if a[k] != b[k]]
    return "runs differ in " + ", ".join(diffs) if diffs else None


def pairs(a, b):
    """(backend in a, backend in b) pairs to compare: same names first, then canonical across names."""
    same = [(n, n) for n in a["backends"] if n in b["backends"]]
    return same + [(x, y) for x in a["backends"] for y in b["backends"] if x != y and NATIVE not in (x, y)]


def diff(a, b):
    """{"pairs": [per pair counts], "different": [per differing case and pair], "cases": common case count}."""
    cases_a = {c["name"]: c for c in a["cases"]}
    common = [c for c in b["cases"] if c["name"] in cases_a]
    by_name_b = {c["name"]: c for c in common}
    rows, different = [], []
    for x, y in pairs(a, b):
        # A backend that ran a subset (the Triton interpreter, report schema 2) has digests for its cases only.
        both = [(c["name"], cases_a[c["name"]]["digests"][x], c["digests"][y]) for c in common
                if x in cases_a[c["name"]]["digests"] and y in c["digests"]]
        equal = 0
        for name, da, db in both:
            if da == db:
                equal += 1
            else:
                different.append({"case": name, "a": x, "b": y, "digest_a": da, "digest_b": db,
                                  "tensors": differing_tensors(cases_a[name], by_name_b[name], x, y),
                                  "canonical": NATIVE not in (x, y)})
        rows.append({"a": x, "b": y, "cases": len(both), "equal": equal, "different": len(both) - equal,
                     "canonical": NATIVE not in (x, y)})
    return {"cases": len(common), "only_a": len(a["cases"]) - len(common),
            "only_b": len(b["cases"]) - len(common), "pairs": rows, "different": different}


def differing_tensors(case_a, case_b, x, y):
    """The tensors of a gradient case whose digests differ between backend x in a and y in b (None for a forward
    case, or a document without per-tensor digests)."""
    ta, tb = case_a.get("tensors", {}).get(x), case_b.get("tensors", {}).get(y)
    if ta is None or tb is None:
        return None
    return [name for name in ta if ta[name] != tb.get(name)]


def failed(result):
    """True if a canonical pair differs on some common case."""
    return any(r["canonical"] and r["different"] for r in result["pairs"])


def table(result, tablefmt="github"):
    pair_rows = [(f"{r['a']} = {r['b']}", r["cases"], r["equal"], r["different"],
                  "" if r["canonical"] else "native: not canonical, differences expected") for r in result["pairs"]]
    out = [tabulate(pair_rows, headers=("a = b", "cases", "equal", "different", "note"), tablefmt=tablefmt)]
    canonical = [d for d in result["different"] if d["canonical"]]
    if canonical:
        out += ["", "canonical cases that differ:", "",
                tabulate([(d["case"], ", ".join(d["tensors"] or ()), f"{d['a']} = {d['b']}", d["digest_a"][:16],
                           d["digest_b"][:16]) for d in canonical],
                         headers=("case", "tensors", "a = b", "digest a", "digest b"), tablefmt=tablefmt)]
    return "\n".join(out)
