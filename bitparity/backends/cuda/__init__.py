"""The cuda backend: the canonical order as Triton kernels (docs/backend-contract.md).

On a machine with a GPU the kernels are compiled for it, with
``enable_fp_fusion=False`` on every launch.  Without one they run in the
Triton interpreter on CPU tensors: the same kernel source, executed
operation by operation with numpy float32 arithmetic.  What the GPU build
emits is checked offline by tests/backends/test_cuda_ptx.py, which compiles
every kernel to sm_90 PTX and SASS and rejects FMA, approximate and
flush-to-zero instructions.
"""

import os

import torch

NAME = "cuda"

try:
    import triton
except ImportError as error:
    _MISSING = f"triton is not installed ({error})"
else:
    _MISSING = None
    _HAS_GPU = torch.cuda.is_available()
    if not _HAS_GPU:
        # triton.jit picks between compiling and interpreting when it
        # decorates a kernel, so the choice has to be in the environment
        # before the kernel modules below are imported.  Without a GPU the
        # interpreter is the only way to run them; an explicit
        # TRITON_INTERPRET from the user is left as it is.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    _INTERPRETED = bool(triton.knobs.runtime.interpret)

    from .attention import attention, attention_backward
    from .elementwise import exp, log, silu_mul, silu_mul_backward
    from .fold import fold_rows
    from .gae import gae
    from .kl import kl_penalty, kl_penalty_backward
    from .linear import linear, linear_exact, weight_grad
    from .masked import masked_mean, masked_mean_backward, masked_whiten, masked_whiten_backward
    from .optim import adamw_step, sgd_step
    from .ppo import ppo_policy_loss, ppo_policy_loss_backward
    from .reduce import sum  # noqa: A004 - the op's public name
    from .rms_norm import rms_norm, rms_norm_backward
    from .rotary import rotary
    from .sampling import filter_logits, philox, sample
    from .softmax import (entropy, entropy_backward, log_softmax, log_softmax_backward, logsumexp,
                          logsumexp_backward, softmax, softmax_backward, token_logprobs, token_logprobs_backward)
    from .topk import topk

    __all__ = ["NAME", "availability", "sum", "logsumexp", "log_softmax", "softmax",
               "entropy", "token_logprobs", "exp", "log",
               "masked_mean", "masked_whiten", "kl_penalty", "gae", "ppo_policy_loss",
               "philox", "topk", "filter_logits", "sample",
               "linear", "linear_exact", "rms_norm", "rotary", "attention", "silu_mul",
               "logsumexp_backward", "log_softmax_backward", "softmax_backward", "entropy_backward",
               "token_logprobs_backward", "masked_mean_backward", "masked_whiten_backward",
               "kl_penalty_backward", "ppo_policy_loss_backward",
               "fold_rows", "weight_grad", "rms_norm_backward", "silu_mul_backward",
               "attention_backward", "adamw_step", "sgd_step"]


def availability():
    """(can run here, how or why not)."""
    if _MISSING is not None:
        return False, _MISSING
    if _INTERPRETED and _HAS_GPU:
        return True, ("Triton interpreter (TRITON_INTERPRET=1 is set); "
                      "GPU tensors are copied to the host for each launch")
    if _INTERPRETED:
        return True, "Triton interpreter on CPU tensors (TRITON_INTERPRET=1); no GPU"
    if _HAS_GPU:
        return True, f"Triton kernels on {torch.cuda.get_device_name()} (enable_fp_fusion=False)"
    return False, "no GPU, and TRITON_INTERPRET is set to a false value, so the Triton interpreter is off"
