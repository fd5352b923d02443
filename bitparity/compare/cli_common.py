"""Command-line pieces shared by the report commands (compare, verify, bench, probe, diff):
the suite tier flags, the output format flag, and a progress bar on stderr."""

import sys
import time

TIERS = ("quick", "full")
FORMATS = ("table", "json", "markdown")


def add_tier_args(parser):
    """--quick (the default) or --full; returns their mutually exclusive group."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", dest="tier", action="store_const", const="quick",
                       help="the quick tier of the conformance suite (default)")
    group.add_argument("--full", dest="tier", action="store_const", const="full",
                       help="the full tier: the quick cases plus RL-sized shapes up to [256, 151936]")
    parser.set_defaults(tier="quick")
    return group


def tier(args):
    """The tier the parsed arguments ask for: "quick" or "full"."""
    return args.tier


def add_format_args(parser):
    parser.add_argument("--format", choices=FORMATS, default="table",
                        help="how to print the report on stdout (default: table)")


class Progress:
    """A one-line progress bar on stderr: `with Progress(total, label) as bar: bar.step(name)`.

    On a terminal the line is redrawn in place; otherwise (a log, a pipe) it is written once per
    tenth of the run, so logs stay short and still show where a long run is.
    """

    def __init__(self, total, label, enabled=True, stream=None):
        self.total, self.label, self.done, self.enabled = total, label, 0, enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self._last_tenth = -1

    def __enter__(self):
        return self

    def step(self, what=""):
        self.done += 1
        if not self.enabled:
            return
        tenth = 10 * self.done // max(self.total, 1)
        if not self.tty and tenth == self._last_tenth and self.done != self.total:
            return
        self._last_tenth = tenth
        width = 24
        filled = width * self.done // max(self.total, 1)
        line = (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                f"{time.perf_counter() - self.start:.0f}s {what}")
        self.stream.write(("\r" + line[:120].ljust(120)) if self.tty else line + "\n")
        self.stream.flush()

    def __exit__(self, *exc):
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
