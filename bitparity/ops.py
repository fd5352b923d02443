"""The operator API: signatures, input validation and dispatch.

Every check on user input happens here, once, so that backends and kernels
can assume valid input.  Leading dimensions are flattened to rows before a
backend is called and restored after; bf16 and fp16 inputs are upcast to
float32, which is exact.  Results are always float32.
"""

import math
import numbers

import numpy as np
import torch

from .backends import resolve as _resolve

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_float_tensor(name, x, min_dim):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16; got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimension(s); got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"{name} must not be empty; got shape {tuple(x.shape)}")


def _check_mask(mask, x):
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor of dtype bool or None; got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must have dtype torch.bool (True = counts); got {mask.dtype}")
    if mask.shape != x.shape:
        raise ValueError(f"mask must have the shape of x, {tuple(x.shape)}; got {tuple(mask.shape)}")
    if mask.device != x.device:
        raise ValueError(f"mask must be on x's device, {x.device}; got {mask.device}")
    return mask.reshape(-1, x.shape[-1]).contiguous()


def inverse_temperature(temperature):
    """scale = RN32(1 / RN32(temperature)): one IEEE-correct float32 division on the host (spec 8.1)."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number; got {type(temperature).__name__}")
    temperature = float(temperature)
    if not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be finite and > 0; got {temperature}")
    t32 = np.float32(temperature)
    with np.errstate(over="ignore", divide="ignore"):
        scale = np.float32(1.0) / t32
    if t32 < np.finfo(np.float32).tiny or not np.isfinite(scale):
        raise ValueError(f"temperature must lie in float32's normal range so that 1/temperature is finite; "
                         f"got {temperature}")
    return float(scale)


def _rows(x):
    return x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()


def _call(op, backend, x, *args):
    module = _resolve(backend, x.device)
    return getattr(module, op)(x, *args)


def sum(x, mask=None, *, backend=None):  # noqa: A001 - mirrors torch.sum
    """Canonical sum over the last dimension; masked entries count as -0.0, the additive identity."""
    _check_float_tensor("x", x, 1)
    rows_mask = _check_mask(mask, x)
    return _call("sum", backend, _rows(x), rows_mask).reshape(x.shape[:-1])


def _softmax_family(op, x, mask, temperature, backend):
    _check_float_tensor("x", x, 1)
    rows_mask = _check_mask(mask, x)
    scale = inverse_temperature(temperature)
    return _call(op, backend, _rows(x), rows_mask, scale)


def logsumexp(x, mask=None, temperature=1.0, *, backend=None):
    """log(sum(exp(x / temperature))) over the last dimension; -inf for a fully masked row."""
    return _softmax_family("logsumexp", x, mask, temperature, backend).reshape(x.shape[:-1])


def log_softmax(x, mask=None, temperature=1.0, *, backend=None):
    """Masked log-softmax over the last dimension: masked entries and fully masked rows give -inf."""
    return _softmax_family("log_softmax", x, mask, temperature, backend).reshape(x.shape)


def softmax(x, mask=None, temperature=1.0, *, backend=None):
    """Masked softmax over the last dimension: masked entries and fully masked rows give 0."""
    return _softmax_family("softmax", x, mask, temperature, backend).reshape(x.shape)


def entropy(logits, mask=None, temperature=1.0, *, backend=None):
    """Entropy of softmax(logits / temperature) per row, as sum p * (log S - (w - max)); 0 for a fully masked row."""
    return _softmax_family("entropy", logits, mask, temperature, backend).reshape(logits.shape[:-1])


def token_logprobs(logits, tokens, temperature=1.0, *, backend=None):
    """log_softmax(logits / temperature) at each chosen token: logits [..., V], tokens int64 [...] -> [...]."""
    _check_float_tensor("logits", logits, 1)
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"tokens must be a torch.Tensor of dtype int64; got {type(tokens).__name__}")
    if tokens.dtype != torch.int64:
        raise TypeError(f"tokens must have dtype torch.int64; got {tokens.dtype}")
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(f"tokens must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])}; "
                         f"got {tuple(tokens.shape)}")
    if tokens.device != logits.device:
        raise ValueError(f"tokens must be on logits' device, {logits.device}; got {tokens.device}")
    vocab = logits.shape[-1]
    flat = tokens.reshape(-1).contiguous()
    low, high = int(flat.min()), int(flat.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ValueError(f"tokens must lie in [0, {vocab}) (the vocabulary size); got {bad}")
    scale = inverse_temperature(temperature)
    return _call("token_logprobs", backend, _rows(logits), flat, scale).reshape(tokens.shape)


def _elementwise(op, x, backend):
    _check_float_tensor("x", x, 0)
    flat = x.reshape(-1).to(torch.float32).contiguous()
    return _call(op, backend, flat).reshape(x.shape)


def exp(x, *, backend=None):
    """The portable float32 exp of docs/spec.md (max error below 1 ulp), element-wise."""
    return _elementwise("exp", x, backend)


def log(x, *, backend=None):
    """The portable float32 log of docs/spec.md (max error below 1 ulp), element-wise."""
    return _elementwise("log", x, backend)
