"""Command-line pieces shared by the report commands: tier and format flags, a progress bar.

A minimal stand-in with the names helper 5a defines on its branch (add_tier_args, tier,
add_format_args, Progress); the merge keeps 5a's version of this file.
"""

import sys
import time

TIERS = ("quick", "full")
FORMATS = ("table", "json", "markdown")


def add_tier_args(parser):
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", dest="tier", action="store_const", const="quick", help="the quick tier (default)")
    group.add_argument("--full", dest="tier", action="store_const", const="full", help="the full tier")
    parser.set_defaults(tier="quick")


def tier(args):
    return args.tier


def add_format_args(parser):
    parser.add_argument("--format", choices=FORMATS, default="table",
                        help="how to print the report on stdout (default: table)")


class Progress:
    """A plain-text progress line on stderr: `with Progress(total, label) as bar: bar.step(name)`."""

    def __init__(self, total, label, enabled=True, stream=None):
        self.total, self.label, self.done, self.enabled = total, label, 0, enabled
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()

    def __enter__(self):
        return self

    def step(self, what=""):
        self.done += 1
        if not self.enabled:
            return
        self.stream.write(f"{self.label} {self.done}/{self.total} "
                          f"{time.perf_counter() - self.start:.0f}s {what}\n")
        self.stream.flush()

    def __exit__(self, *exc):
        pass
