"""The run document `bitparity compare` writes (docs/report-schema.md), and its renderings:
a table for people, JSON for machines, Markdown with plots for reports."""

import datetime
import glob
import importlib.metadata
import json
import os
import platform
import subprocess
from collections import Counter

import numpy as np
import torch
from tabulate import tabulate

from ..backends import backends
from ..spec import SPEC_VERSION
from . import cases
from .run import GRAD_BUDGET_S, GRAD_OPS, LOG_SPACE, TIMING, ULP_BIN_LABELS

SCHEMA = "bitparity-run"
SCHEMA_VERSION = 2
HEADERS = ("op", "backend", "cases", "exact %", "max ulp vs f64", "logdiff", "median ms", "IQR %", "runs",
           "x native")


# -- numbers: the document is strict JSON, so inf is the string "inf" and NaN (not measured) is null --

def _num(v):
    v = float(v)
    return None if v != v else ("inf" if v == float("inf") else v)


def _value(v):
    return float("nan") if v is None else float(v)


def _fmt(v, spec):
    v = _value(v)
    return "-" if v != v else format(v, spec)


# -- where the run happened ------------------------------------------------------------

def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def packages():
    return {"bitparity": _version("bitparity"), "torch": torch.__version__, "numpy": np.__version__,
            "triton": _version("triton"), "torch_npu": _version("torch_npu")}


def cpuinfo():
    """The first processor's fields in /proc/cpuinfo, {} where there is no such file."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n")[0]
    except OSError:
        return {}
    return {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}


def cpu_name():
    return cpuinfo().get("model name") or platform.processor() or platform.machine()


def _nvidia_driver():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def _cann_version():
    """The CANN toolkit version from its install record, looked for where CANN's set-up script points."""
    roots = [os.environ.get(k) for k in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")]
    for root in [r for r in roots if r] + ["/usr/local/Ascend/ascend-toolkit/latest"]:
        for info in sorted(glob.glob(os.path.join(root, "*", "ascend_toolkit_install.info"))):
            with open(info) as f:
                for line in f:
                    if line.startswith("version="):
                        return line.split("=", 1)[1].strip()
    return None


def device():
    npu = getattr(torch, "npu", None)
    has_npu = npu is not None and npu.is_available()
    return {"cpu": cpu_name(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "npu": npu.get_device_name(0) if has_npu else None,
            "cuda_runtime": torch.version.cuda,
            "cuda_driver": _nvidia_driver() if torch.cuda.is_available() else None,
            "cann": _cann_version()}


def machine():
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}


# -- the document ------------------------------------------------------------------------

def _timing(t):
    """A result's timing fields; runs 0 and nulls when it was not timed."""
    if t is None:
        return {"runs": 0, "clock": None, **{k: None for k in ("median_ms", "q1_ms", "q3_ms", "min_ms", "max_ms")}}
    return {"runs": t.runs, "clock": t.clock, "median_ms": _num(t.median_ms), "q1_ms": _num(t.q1_ms),
            "q3_ms": _num(t.q3_ms), "min_ms": _num(t.min_ms), "max_ms": _num(t.max_ms)}


def document(run, command=None):
    """The self-describing JSON document of a compare.Run (docs/report-schema.md)."""
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "spec_version": SPEC_VERSION, "suite_version": cases.SUITE_VERSION, "tier": run.tier, "seed": run.seed,
        "packages": packages(), "machine": machine(), "device": device(),
        "backend_info": backends(),
        "backends": list(run.backends),
        "skipped": [{"name": b, "reason": why} for b, why in run.skipped.items()],
        "subsets": [{"backend": b, "rule": rule} for b, rule in run.subsets.items()],
        "timing": dict(TIMING, gradient_budget_s=GRAD_BUDGET_S),
        "warnings": list(run.warnings),
        "ulp_bins": list(ULP_BIN_LABELS),
        "cases": run.cases,
        "results": [{"op": r.op, "backend": r.backend, "cases": r.cases, "elements": r.elements,
                     "identical": r.identical, "exact_percent": _num(r.exact_percent), "max_ulp": _num(r.max_ulp),
                     "logdiff": _num(r.logdiff) if r.op in LOG_SPACE else None,
                     **_timing(r.timing), "ratio_to_native": _num(r.ratio_to_native),
                     "ulp_histogram": [int(c) for c in r.ulp_counts]} for r in run.results],
    }


def to_json(doc):
    return json.dumps(doc, indent=1, allow_nan=False)


# -- renderings ---------------------------------------------------------------------------

def _iqr_percent(r):
    """A result's interquartile range over its median, in percent; NaN where it was not timed."""
    return 100.0 * (_value(r["q3_ms"]) - _value(r["q1_ms"])) / _value(r["median_ms"])


def _rows(doc):
    total = Counter(case["op"] for case in doc["cases"])
    subset = {s["backend"] for s in doc["subsets"]}
    return [(r["op"], r["backend"], f"{r['cases']}/{total[r['op']]}" if r["backend"] in subset else r["cases"],
             _fmt(r["exact_percent"], ".2f"), _fmt(r["max_ulp"], ".3g"),
             _fmt(r["logdiff"], ".3g") if r["op"] in LOG_SPACE else "", _fmt(r["median_ms"], ".3g"),
             _fmt(_iqr_percent(r), ".0f"), r["runs"] or "-", _fmt(r["ratio_to_native"], ".3g"))
            for r in doc["results"]]


def notes(doc):
    """The lines under the results table: backends skipped and why, backends that ran a subset of the suite,
    how the times were taken, and the run's warnings."""
    ran = Counter(b for case in doc["cases"] for b in case["digests"])
    t = doc["timing"]
    return ([f"- skipped {s['name']}: {s['reason']}" for s in doc["skipped"]] +
            [f"- {s['backend']} ran {ran[s['backend']]} of {len(doc['cases'])} cases: {s['rule']}"
             for s in doc["subsets"]] +
            [f"- times: each op on its timing case, per backend {t['warmup']} warm-up call, then runs until "
             f"{t['budget_s']:g} s of them and at least {t['min_runs']} (at most {t['repeats']}), the backends' runs "
             f"interleaved; median ms is their median, IQR % their interquartile range over it"] +
            ([f"- gradient ops (<op>.backward, the training steps): `max ulp vs f64` is in spec 26.12's measure "
              f"(ulps of its floor; relative for sum, exp, masked_mean, kl_penalty, ppo_policy_loss) or, for the "
              f"model blocks, the embedding, GradientFold and the training steps, spec 29.14's (units of 2^-24 "
              f"times the tensor's largest magnitude), bfloat16 gradients at bfloat16's resolution; times are the "
              f"backward alone against torch autograd (the steps: the whole case against torch.optim), runs until "
              f"{t['gradient_budget_s']:g} s"] if "gradient_budget_s" in t and any(
                  r["op"] in GRAD_OPS for r in doc["results"]) else []) +
            [f"- WARNING: {w}" for w in doc["warnings"]])


def table(doc):
    return tabulate(_rows(doc), headers=HEADERS, tablefmt="github") + "\n\n" + "\n".join(notes(doc))


def backends_table(rows=None):
    return tabulate([(b["name"], "yes" if b["available"] else "no", b["device"], b["reason"])
                     for b in rows or backends()], headers=("backend", "available", "device", "how / why not"),
                    tablefmt="github")


def where(doc):
    d, p = doc["device"], doc["packages"]
    # A CUDA build of torch reports its runtime on a box without a GPU: toolkits are not devices.
    accel = ", ".join(f"{k} {d[k]}" for k in ("gpu", "npu") if d.get(k)) or "no GPU or NPU"
    toolkits = "".join(f", {k} {v}" for k, v in d.items() if k not in ("cpu", "gpu", "npu") and v)
    pkgs = ", ".join(f"{k} {v}" for k, v in p.items() if v)
    return f"{d['cpu']} ({doc['machine']['cpu_count']} cores); {accel}{toolkits}; {pkgs}"


def header(doc):
    return (f"bitparity {doc['spec_version']}: suite {doc['suite_version']}, {doc['tier']} tier, "
            f"{len(doc['cases'])} cases, seed {doc['seed']}; canonical = the `numpy` backend (the spec executed)\n"
            f"machine: {where(doc)}")


def markdown(doc, plots=None):
    """A Markdown report; plots maps a plot's kind to the image path to link (relative to the report)."""
    plots = plots or {}
    lines = ["# bitparity compare report", "",
             f"Spec {doc['spec_version']}, suite {doc['suite_version']} ({doc['tier']} tier, {len(doc['cases'])} "
             f"cases, seed {doc['seed']}), run {doc['created']}" +
             (f" by `{doc['command']}`." if doc["command"] else "."), "",
             f"Machine: {where(doc)}.", "",
             "## Backends", "", backends_table(doc["backend_info"]), "",
             "## Agreement, accuracy and cost", "",
             "`exact %`: share of result elements whose bits equal the canonical (`numpy`) result. "
             "`max ulp vs f64`: worst error against the float64 meaning in the op's measure (spec section 10). "
             "`logdiff`: largest |Δ log-prob| against the canonical result. `cases`: the cases the backend ran "
             "(of the op's, where it ran a subset). `x native`: median time over torch's own op on the same device; "
             "`ascend` times on a machine without an NPU are the host emulation, and say nothing about NPU speed.",
             "",
             table(doc), ""]
    captions = {"agreement": "Agreement: exact % per backend and op",
                "ulp": "Errors against float64, in ulps, per op and backend",
                "cost": "Cost: median time relative to torch on the same device, with its interquartile range"}
    for kind, caption in captions.items():
        if kind in plots:
            lines += [f"### {caption}", "", f"![{caption}]({plots[kind]})", ""]
    return "\n".join(lines)
