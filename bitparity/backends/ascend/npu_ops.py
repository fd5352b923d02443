"""The Ascend C kernels on an NPU, through the torch ops that npu/bitparity_npu.cpp registers.

CMakeLists.txt (run by scripts/npu_build.sh) builds build/libbitparity_npu.so
from kernels/*.cpp and npu/bitparity_npu.cpp, which registers
torch.ops.bitparity_ascend.* for PrivateUse1 (torch_npu) tensors.  This module
finds that library and loads it.  The NPU path has not been run in this
project (docs/ascend.md).
"""

import os
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_LIBRARY = HERE / "build" / "libbitparity_npu.so"
NAMESPACE = "bitparity_ascend"
LIBRARY_ENV = "BITPARITY_ASCEND_NPU_LIB"

_loaded = []


def npu_present():
    """torch_npu imports and reports at least one NPU."""
    try:
        import torch_npu  # noqa: F401 - registers torch.npu
    except ImportError:
        return False
    return torch.npu.is_available()


def library_path():
    return Path(os.environ.get(LIBRARY_ENV) or DEFAULT_LIBRARY)


def load():
    """Load the NPU build once; raises OSError if it is missing or does not load."""
    if not _loaded:
        path = library_path()
        if not path.exists():
            raise OSError(f"{path} does not exist: build it with scripts/npu_build.sh (docs/ascend.md), "
                          f"or set {LIBRARY_ENV}")
        torch.ops.load_library(str(path))
        _loaded.append(path)
    return _loaded[0]


def op(name):
    load()
    return getattr(getattr(torch.ops, NAMESPACE), name)
