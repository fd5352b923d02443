"""The `bitparity` command: `bitparity compare`, `bitparity backends` and `bitparity demo`."""

import argparse
import json
import sys
import time

from .backends import NAMES
from .compare import report
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


def _demo(args):
    from .demo import TOPICS, plots

    if args.plots is not None:
        try:
            plots.pyplot()
        except ImportError as error:
            raise SystemExit(f"bitparity demo: --plots: {error}") from error
    topics = list(TOPICS) if args.topic == "all" else [args.topic]
    results = {}
    for topic in topics:
        results[topic] = TOPICS[topic](args.plots)
        print()
    if args.json is not None:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def _add_demo_parser(sub):
    from .demo import TOPICS

    dm = sub.add_parser("demo", help="runnable lessons: why float32 results differ, and bitparity's answer "
                                     "(docs/learn/)")
    dm.add_argument("topic", nargs="?", choices=(*TOPICS, "all"), default="all",
                    help="order, batch, fma, exp, rl, or all (default)")
    dm.add_argument("--plots", metavar="DIR", help="save each topic's figure as DIR/TOPIC.png (needs matplotlib)")
    dm.add_argument("--json", metavar="FILE", help="write each topic's key numbers to FILE")
    dm.set_defaults(func=_demo)


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
    _add_demo_parser(sub)
    args = parser.parse_args(argv)
    if getattr(args, "op", None) is None and args.command == "compare":
        args.op = list(OPS)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
