"""Canonical optimizers, gradient clipping and micro-batch accumulation (spec 29.1, 29.10-29.12).

`AdamW` and `SGD` are `torch.optim.Optimizer` subclasses with torch's hyper-parameters, so schedulers,
`state_dict()` and `zero_grad()` work as usual; their `step()` runs one element-wise backend op per
parameter (`adamw_step`, `sgd_step`) with the host's binary64 constants rounded once, so the updated weights
are the same bits on every canonical backend. `clip_grad_norm_` is torch's, with spec 29.10's norm.
`GradientFold` combines micro-batch gradients by the row fold, which makes them independent of the
micro-batch size (powers of two); torch's own `.grad +=` is the same only for one or two micro-batches.
"""

import math

import numpy as np
import torch

from . import ops
from .backends import resolve as _resolve
from .reference.canonical import sqrt32


def _rn32(value):
    return float(np.float32(value))


def _params(params, name):
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    for p in params:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{name} must be tensors; got {type(p).__name__}")
    return params


def _float32_param(p, who):
    if p.dtype != torch.float32:
        raise TypeError(f"bitparity.optim.{who} updates float32 parameters (the canonical order is binary32); got "
                        f"a parameter of dtype {p.dtype}: keep float32 master weights")


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW (amsgrad=False, maximize=False) in spec 29.12's order, on `backend` (default: the
    parameters' device's, as every op). State m and v are float32."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *, backend=None):
        for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"{name} must be a real number >= 0; got {value!r}")
        if eps <= 0 or not np.float32(eps) > 0:
            raise ValueError(f"eps must be > 0 and round to a positive float32; got {eps!r}")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1); got {betas!r}")
        self.backend = backend
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                _float32_param(p, "AdamW")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["beta1_power"], state["beta2_power"] = 1.0, 1.0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["step"] += 1
                state["beta1_power"] *= beta1                     # beta^t by t binary64 multiplications
                state["beta2_power"] *= beta2
                bc1, bc2 = 1.0 - state["beta1_power"], 1.0 - state["beta2_power"]
                module = _resolve(self.backend, p.device)
                w, m, v = module.adamw_step(
                    ops._dense(p.detach()).reshape(-1), ops._dense(p.grad.to(torch.float32)).reshape(-1),
                    state["exp_avg"].reshape(-1), state["exp_avg_sq"].reshape(-1),
                    None if wd == 0 else _rn32(1.0 - lr * wd), _rn32(beta1), _rn32(1.0 - beta1), _rn32(beta2),
                    _rn32(1.0 - beta2), _rn32(1.0 / math.sqrt(bc2)), _rn32(eps), _rn32(lr / bc1))
                p.copy_(w.reshape(p.shape))
                state["exp_avg"].copy_(m.reshape(p.shape))
                state["exp_avg_sq"].copy_(v.reshape(p.shape))
        return loss


class SGD(torch.optim.Optimizer):
    """torch.optim.SGD (maximize=False) in spec 29.12's order, on `backend`."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 backend=None):
        for name, value in (("lr", lr), ("momentum", momentum), ("dampening", dampening),
                            ("weight_decay", weight_decay)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"{name} must be a real number >= 0; got {value!r}")
        if nesterov and (momentum == 0 or dampening != 0):
            raise ValueError("nesterov needs momentum > 0 and dampening = 0 (as torch.optim.SGD)")
        self.backend = backend
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": bool(nesterov)})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                _float32_param(p, "SGD")
                state = self.state[p]
                buf = state.get("momentum_buffer")
                module = _resolve(self.backend, p.device)
                w, buf = module.sgd_step(
                    ops._dense(p.detach()).reshape(-1), ops._dense(p.grad.to(torch.float32)).reshape(-1),
                    None if buf is None else buf.reshape(-1), _rn32(group["lr"]), _rn32(group["momentum"]),
                    _rn32(1.0 - group["dampening"]), _rn32(group["weight_decay"]), group["nesterov"])
                p.copy_(w.reshape(p.shape))
                if buf is not None:
                    state["momentum_buffer"] = buf.reshape(p.shape).clone()
        return loss


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm, *, backend=None):
    """Scale every gradient by RN32(min(1, max_norm / (norm + 1e-6))) (spec 29.10) and return the norm, a 0-d
    float32 tensor: norm = sqrt32 of the canonical sum, over the parameters in the order given, of each
    gradient's canonical sum of squares. Parameters without a gradient are skipped."""
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
        raise ValueError(f"max_norm must be a real number > 0; got {max_norm!r}")
    grads = [p.grad for p in _params(parameters, "parameters") if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    squares = []
    for g in grads:
        flat = g.detach().to(torch.float32).reshape(1, -1)
        squares.append(ops.sum(flat * flat, backend=backend).reshape(1))       # one rounding per product
    total = ops.sum(torch.cat(squares).to(grads[0].device), backend=backend)
    norm = np.float32(sqrt32(np.float32(float(total))))
    coef = _rn32(min(1.0, float(max_norm) / (float(norm) + 1e-6)))
    for g in grads:
        g.mul_(coef)
    return torch.tensor(norm)


class GradientFold:
    """Accumulates micro-batch gradients by spec 29.1's row fold: call `add()` after each micro-batch's
    backward (it takes every parameter's .grad and clears it) and `finish()` after the last (it writes the
    folded gradient to .grad). Micro-batches must be consecutive blocks of the same power-of-two number of
    rows of every op (the last may be shorter); then the result is the bits of one backward over all rows.
    A binary counter: two partials of the same size are added (left + right) as soon as both exist, so at
    most log2(micro-batches) partials per parameter are held."""

    def __init__(self, params):
        self.params = _params(params, "params")
        self._stack = []                                  # [(level, [grad or None per parameter])]

    def add(self):
        grads = [None if p.grad is None else p.grad.detach().to(torch.float32).clone() for p in self.params]
        for p in self.params:
            p.grad = None
        level = 0
        while self._stack and self._stack[-1][0] == level:
            _, left = self._stack.pop()
            grads, level = [_plus(a, b) for a, b in zip(left, grads)], level + 1
        self._stack.append((level, grads))

    def finish(self):
        if not self._stack:
            raise ValueError("GradientFold.finish: no micro-batch was added")
        _, folded = self._stack.pop()
        while self._stack:                               # right to left: the -0.0 padding of spec 29.1
            _, left = self._stack.pop()
            folded = [_plus(a, b) for a, b in zip(left, folded)]
        for p, g in zip(self.params, folded):
            p.grad = None if g is None else g.to(p.dtype)


def _plus(left, right):
    """left + right, one binary32 add per element; a missing gradient is the row fold's -0.0 (an identity)."""
    if left is None or right is None:
        return right if left is None else left
    return left + right


__all__ = ["AdamW", "SGD", "clip_grad_norm_", "GradientFold"]
