"""The `bitparity` command: `bitparity compare`, `backends`, `probe` and `bench`."""

import argparse
import sys
import time

from .backends import NAMES
from .compare import bench, probe, report
from .compare.cli_common import add_format_args, add_tier_args, tier
from .compare.run import OPS, compare
from .spec import SPEC_VERSION


def _compare(args):
    start = time.perf_counter()
    progress = (lambda msg: print(f"  .. {msg}", file=sys.stderr)) if args.verbose else None
    results = compare(backends=args.backend, ops_=args.op, suite=args.suite, seed=args.seed, progress=progress)
    print(f"bitparity {SPEC_VERSION}: canonical = the `numpy` backend (the spec executed); suite = {args.suite}\n")
    print(report.backends_table())
    print()
    print(report.table(results))
    with open(args.json, "w") as f:
        f.write(report.to_json(results, args.suite))
    print(f"\nwrote {args.json} in {time.perf_counter() - start:.1f} s")
    return 0


def _backends(_args):
    print(report.backends_table())
    return 0


def _print_or_write(text, out):
    """Print a report, or write it to out and say so."""
    if out is None:
        print(text)
        return
    with open(out, "w") as f:
        f.write(text + "\n")
    print(f"wrote {out}")


def _probe(args):
    findings = probe.probe(args.backend)
    _print_or_write(probe.render(findings, args.format, args.backend), args.out)
    return 0


def _add_probe_parser(sub):
    p = sub.add_parser("probe", help="test on a target the floating-point assumptions the spec rests on")
    p.add_argument("--backend", choices=probe.PROBE_BACKENDS, default="cpu",
                   help="cpu: numpy and torch; cuda: Triton (interpreter without a GPU) and torch CUDA; "
                        "ascend: host emulation or torch_npu (default: cpu)")
    add_format_args(p)
    p.add_argument("--out", help="write the report to this file instead of stdout")
    p.set_defaults(func=_probe)


def _bench(args):
    rows = bench.run(args.backend, args.op or list(OPS), tier=tier(args), repeats=args.repeats,
                     warmup=args.warmup, progress=not args.no_progress)
    _print_or_write(bench.render(rows, args.format), args.out)
    return 0


def _add_bench_parser(sub):
    p = sub.add_parser("bench", help="time each op against torch's native op and the copy bandwidth")
    p.add_argument("--backend", action="append", choices=bench.BENCH_BACKENDS,
                   help="backends to time (repeatable; default: all available)")
    p.add_argument("--op", action="append", choices=OPS, help="ops to time (repeatable; default: all)")
    add_tier_args(p)
    add_format_args(p)
    p.add_argument("--repeats", type=int, help="timed runs per measurement (default: by tier)")
    p.add_argument("--warmup", type=int, help="untimed runs first (default: by tier)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.add_argument("--out", help="write the report to this file instead of stdout")
    p.set_defaults(func=_bench)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bitparity", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cmp_ = sub.add_parser("compare", help="run every op on every available backend and report agreement and cost")
    cmp_.add_argument("--backend", action="append", choices=NAMES, help="backends to run (repeatable; default: all available)")
    cmp_.add_argument("--op", action="append", choices=OPS, help="ops to run (repeatable; default: all)")
    cmp_.add_argument("--suite", choices=("quick", "full"), default="quick", help="case suite size (default: quick)")
    cmp_.add_argument("--seed", type=int, default=0)
    cmp_.add_argument("--json", default="bitparity-report.json", help="where to write the JSON report")
    cmp_.add_argument("-v", "--verbose", action="store_true", help="print each case as it runs")
    cmp_.set_defaults(func=_compare)
    bk = sub.add_parser("backends", help="list the backends and whether they can run here")
    bk.set_defaults(func=_backends)
    _add_probe_parser(sub)
    _add_bench_parser(sub)
    args = parser.parse_args(argv)
    if getattr(args, "op", None) is None and args.command == "compare":
        args.op = list(OPS)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
