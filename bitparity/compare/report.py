"""Turn compare results into a table for people and JSON for machines."""

import json
import platform

import torch
from tabulate import tabulate

from ..backends import backends
from ..spec import SPEC_VERSION
from .run import LOG_SPACE

HEADERS = ("op", "backend", "exact %", "max ulp vs f64", "logdiff", "median ms", "x native")


def _fmt(v, spec):
    return "-" if v != v else format(v, spec)


def table(results):
    rows = []
    for r in results:
        rows.append((r.op, r.backend, _fmt(r.exact_percent, ".2f"), _fmt(r.max_ulp, ".3g"),
                     _fmt(r.logdiff, ".3g") if r.op in LOG_SPACE else "", _fmt(r.median_ms, ".3g"),
                     _fmt(r.ratio_to_native, ".3g")))
    return tabulate(rows, headers=HEADERS, tablefmt="github")


def backends_table():
    return tabulate([(b["name"], "yes" if b["available"] else "no", b["device"], b["reason"])
                     for b in backends()], headers=("backend", "available", "device", "how / why not"),
                    tablefmt="github")


def machine():
    return {"python": platform.python_version(), "torch": torch.__version__,
            "processor": platform.processor() or platform.machine(), "platform": platform.platform(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def to_json(results, suite):
    return json.dumps({
        "spec_version": SPEC_VERSION,
        "suite": suite,
        "machine": machine(),
        "backends": backends(),
        "results": [{"op": r.op, "backend": r.backend, "elements": r.elements, "identical": r.identical,
                     "exact_percent": r.exact_percent, "max_ulp": r.max_ulp,
                     "logdiff": r.logdiff if r.op in LOG_SPACE else None,
                     "median_ms": r.median_ms, "ratio_to_native": r.ratio_to_native} for r in results],
    }, indent=2, allow_nan=True)
