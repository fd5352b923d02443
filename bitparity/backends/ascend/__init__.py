"""The `ascend` backend: the canonical order (docs/spec.md) as Ascend C kernels for Atlas A2.

kernels/*.cpp are written to the real Ascend C API (910B, dav-2201): a kernel
class per op family with CopyIn/Compute/CopyOut, TPipe/TQue/TBuf, rows spread
over AI cores by GetBlockIdx/GetBlockNum, and only IEEE add/sub/mul, compare,
select, min/max, exact casts and int32/bit operations in the canonical path.

They run in one of two ways:
  * On an NPU (torch_npu imports and sees a device): the library built from
    npu/ registers torch.ops.bitparity.*, and the ops take NPU tensors.  This
    path is written to CANN conventions but has never been compiled or run in
    this project: see npu/README.md for what must be checked on hardware.
  * Elsewhere, in the host emulation: the same kernel sources compiled by g++
    against emulation/kernel_operator.h, which models the API subset and
    enforces its constraints (alignment, UB capacity, queue discipline,
    cross-pipe syncs).  It is a test double that runs on CPU tensors, not an NPU.
"""

from . import host_emulation, npu_ops

NAME = "ascend"

_mode = []


def _on_npu():
    """Whether the ops run on the NPU (decided once per process)."""
    if not _mode:
        _mode.append(npu_ops.npu_present())
    return _mode[0]


def availability():
    if _on_npu():
        try:
            path = npu_ops.load()
        except (OSError, RuntimeError) as err:
            return False, f"an NPU is present but the Ascend C NPU build cannot be loaded: {err}"
        return True, f"Ascend C kernels on the NPU (torch_npu, {path.name})"
    if host_emulation.compiler() is None:
        return False, "no NPU (torch_npu missing or no device) and no g++ for the Ascend C host emulation"
    try:
        host_emulation.library()
    except (RuntimeError, OSError) as err:
        return False, f"the Ascend C host emulation could not be built or loaded: {err}"
    return True, "Ascend C kernels in host emulation (g++ -ffp-contract=off), a test double: not an NPU"


def sum(x, mask):  # noqa: A001 - the op's public name
    if _on_npu():
        return npu_ops.op("sum")(x, mask)
    return host_emulation.row_op("sum", x, mask)


def logsumexp(x, mask, scale):
    if _on_npu():
        return npu_ops.op("logsumexp")(x, mask, scale)
    return host_emulation.row_op("logsumexp", x, mask, scale)


def log_softmax(x, mask, scale):
    if _on_npu():
        return npu_ops.op("log_softmax")(x, mask, scale)
    return host_emulation.map_op("log_softmax", x, mask, scale)


def softmax(x, mask, scale):
    if _on_npu():
        return npu_ops.op("softmax")(x, mask, scale)
    return host_emulation.map_op("softmax", x, mask, scale)


def entropy(x, mask, scale):
    if _on_npu():
        return npu_ops.op("entropy")(x, mask, scale)
    return host_emulation.row_op("entropy", x, mask, scale)


def token_logprobs(x, tokens, scale):
    if _on_npu():
        return npu_ops.op("token_logprobs")(x, tokens, scale)
    return host_emulation.row_op("token_logprobs", x, tokens, scale)


def exp(x):
    if _on_npu():
        return npu_ops.op("exp")(x)
    return host_emulation.elementwise("exp", x)


def log(x):
    if _on_npu():
        return npu_ops.op("log")(x)
    return host_emulation.elementwise("log", x)
