#!/usr/bin/env python3
"""The prepared NPU check (issues 7, 26): golden digests (forward and gradient), platform probe, benchmark
(forward and backward), the RL step, three training steps and an RL step on a patched Hugging Face model, on the
`ascend` backend.

On an Ascend machine with torch_npu and the library built by scripts/npu_build.sh:
    python scripts/npu_check.py [--out DIR]
Without an NPU (the Ascend C host emulation on the CPU; says nothing about an NPU):
    python scripts/npu_check.py --emulation --small
The steps, the files written and the exit status are described in bitparity/compare/device_check.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))    # the checkout, installed or not

from bitparity.compare import device_check  # noqa: E402 - after the path; imports no backend


def main(argv=None):
    args = device_check.parser("npu-check", "ascend", "--emulation",
                               "run the Ascend C kernels in the host emulation on the CPU (without an NPU)"
                               ).parse_args(argv)
    from bitparity.backends.ascend import npu_ops
    has_npu = npu_ops.npu_present()
    if has_npu and args.test_double:
        raise SystemExit("npu-check: an NPU is present and the ascend backend runs on it; "
                         "--emulation is for machines without one")
    return device_check.run(args, has_npu, "no NPU here (torch_npu missing or no device); --emulation runs the "
                                           "Ascend C host emulation on the CPU instead")


if __name__ == "__main__":
    sys.exit(main())
