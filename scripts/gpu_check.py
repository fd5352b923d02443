#!/usr/bin/env python3
"""The prepared GPU check (issues 7, 26, 24): golden digests (forward and gradient), platform probe, benchmark
(forward and backward), spec 2.0.0's linear against torch's bf16 and float32 matmul, the RL step, three training
steps and an RL step on a patched Hugging Face model, on the `cuda` backend.

On a machine with an NVIDIA GPU, torch with CUDA and triton (estimated under 8 minutes on an H200, within the
15-minute device budget with the machine's start; not yet run on a GPU, so that is an estimate, whose basis
docs/portability.md gives, not a measurement):
    python scripts/gpu_check.py [--out DIR]
Without a GPU, as CI runs it (the Triton interpreter on the CPU; says nothing about a GPU):
    python scripts/gpu_check.py --interpret --small
The steps, the files written and the exit status are described in bitparity/compare/device_check.py.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))    # the checkout, installed or not

from bitparity.compare import device_check  # noqa: E402 - after the path; imports no backend


def main(argv=None):
    args = device_check.parser("gpu-check", "cuda", "--interpret",
                               "run the Triton kernels in the interpreter on the CPU (without a GPU)").parse_args(argv)
    import torch
    has_gpu = torch.cuda.is_available()
    if has_gpu and args.test_double:
        raise SystemExit("gpu-check: a GPU is present and the cuda backend compiles its kernels for it; "
                         "--interpret is for machines without one")
    if args.test_double:
        # triton.jit chooses between compiling and interpreting when it decorates a kernel,
        # so the choice must be in the environment before the cuda backend is imported.
        os.environ["TRITON_INTERPRET"] = "1"
    return device_check.run(args, has_gpu,
                            "no GPU here (torch.cuda.is_available() is False); --interpret runs the Triton "
                            "interpreter on the CPU instead")


if __name__ == "__main__":
    sys.exit(main())
