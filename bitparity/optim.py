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

from . import ops, row_fold, spec
from .backends import resolve as _resolve
from .reference.canonical import sqrt32

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_MIN_NORMAL = float(np.finfo(np.float32).tiny)            # 2^-126
_TWO_M64, _TWO_P64 = 2.0 ** -64, 2.0 ** 64


def _rn32(value):
    return float(np.float32(value))


def _fits32(value):
    """Whether RN32(value) is finite."""
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(value)))


def _params(params, name):
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    for p in params:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{name} must be tensors; got {type(p).__name__}")
    return params


def _real(value, name):
    """value as a binary64 number: an int, a float, a numpy real scalar or a one-element real tensor (torch's
    optimizers take a tensor lr the same way); bools, complex numbers and other types are refused."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.dtype.is_complex or value.is_meta:
            raise TypeError(f"{name} as a tensor must hold one real number; got shape {tuple(value.shape)}, dtype "
                            f"{value.dtype}, device {value.device}")
        return float(value.detach().reshape(()).item())
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number (int, float, numpy scalar or one-element tensor); got "
                        f"{type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be finite; got an int of {int(value).bit_length()} bits") from None


def _in_domain(value, name, low, low_open, what):
    """The number `value` (see _real) if it is finite, >= low (> low when low_open) and finite in binary32."""
    x = _real(value, name)
    if not math.isfinite(x) or x < low or (low_open and x == low) or not abs(x) <= _FLOAT32_MAX:
        raise ValueError(f"{name} must be {what}; got {value!r}")
    return x


def _name(key, group_index):
    """The user's name of a hyper-parameter: the keyword, or its entry of a parameter group."""
    return key if group_index is None else f"param_groups[{group_index}]['{key}']"


def _check_dense_float32(p, grad, who, label):
    """Refuses what the element-wise kernels cannot take, before anything changes: a parameter or gradient that
    is not float32 (bf16 models keep float32 master weights), a sparse gradient, a gradient of another shape."""
    if p.dtype != torch.float32:
        raise TypeError(f"bitparity.optim.{who} updates float32 parameters (the canonical order is binary32); got "
                        f"{label} of dtype {p.dtype}: keep float32 master weights")
    if grad is None:
        return
    if grad.layout != torch.strided:
        raise TypeError(f"bitparity.optim.{who}: the gradient of {label} is {grad.layout}; the canonical step "
                        f"takes dense gradients (torch.Tensor.to_dense(), or a dense embedding)")
    if grad.dtype != torch.float32 or grad.shape != p.shape:
        raise TypeError(f"bitparity.optim.{who}: the gradient of {label} must be float32 of the parameter's shape "
                        f"{tuple(p.shape)}; got {grad.dtype} {tuple(grad.shape)}")


def _kernel(backend, p, name, who):
    module = _resolve(backend, p.device)
    kernel = getattr(module, name, None)
    if kernel is None:
        raise ValueError(f"bitparity.optim.{who}: backend {module.NAME!r} has no canonical {name}; use a canonical "
                         f"backend (numpy, cpu, cuda, ascend) or torch.optim")
    return kernel


class _Canonical(torch.optim.Optimizer):
    """What AdamW and SGD share: every parameter group is checked when it is added and again at each step()
    (a scheduler or the user may have changed it), and step() plans every parameter's update (its checks and
    host constants) before it changes any weight or state, so a refused step leaves the optimizer as it was."""

    def add_param_group(self, param_group):
        merged = {**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}}
        self._hyper(merged, len(self.param_groups))
        params = param_group["params"]
        if not isinstance(params, (torch.Tensor, set)):       # a generator is read once, here (torch refuses a set)
            param_group = {**param_group, "params": list(params)}
        params = param_group["params"]
        for i, p in enumerate([params] if isinstance(params, torch.Tensor) else params):
            if isinstance(p, torch.Tensor) and p.requires_grad:     # a frozen parameter never gets a gradient
                _check_dense_float32(p, None, type(self).__name__,
                                     f"param_groups[{len(self.param_groups)}]['params'][{i}]")
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plan = []
        for index, group in enumerate(self.param_groups):
            hyper = self._hyper(group, index)
            for i, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                label = f"param_groups[{index}]['params'][{i}]"
                _check_dense_float32(p, p.grad, type(self).__name__, label)
                plan.append(self._plan(p, hyper, index))
        for update in plan:
            update()
        return loss


class AdamW(_Canonical):
    """torch.optim.AdamW (amsgrad=False, maximize=False) in spec 29.12's order, on `backend` (default: the
    parameters' device's, as every op). State m and v are float32. Accepted (spec 29.12): lr and weight_decay
    finite >= 0, eps with RN32(eps) a normal binary32 (2^-126 <= RN32(eps) <= 3.4e38), betas in [0, 1); each an
    int, float, numpy scalar or one-element tensor."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *, backend=None):
        self.backend = backend
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self._hyper(defaults, None)
        super().__init__(params, defaults)

    @staticmethod
    def _hyper(group, index):
        """(lr, beta1, beta2, eps, weight_decay) as binary64 numbers, or the error naming the user's value."""
        lr = _in_domain(group["lr"], _name("lr", index), 0.0, False, "finite, >= 0 and at most 3.4e38")
        wd = _in_domain(group["weight_decay"], _name("weight_decay", index), 0.0, False,
                        "finite, >= 0 and at most 3.4e38")
        eps_name = _name("eps", index)
        eps = _in_domain(group["eps"], eps_name, 0.0, True, "> 0 and finite")
        if not _MIN_NORMAL <= _rn32(eps) <= _FLOAT32_MAX:
            raise ValueError(f"{eps_name} must round to a normal binary32, 2^-126 (1.1754944e-38) <= RN32(eps) <= "
                             f"3.4028235e38: it is the floor of AdamW's denominator, whose reciprocal (spec 29.11) "
                             f"is defined from 2^-126 up; got {group['eps']!r}")
        betas, betas_name = group["betas"], _name("betas", index)
        if isinstance(betas, torch.Tensor) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise ValueError(f"{betas_name} must be a pair (beta1, beta2); got {betas!r}")
        beta1, beta2 = (_in_domain(b, f"{betas_name}[{k}]", 0.0, False, "in [0, 1)") for k, b in enumerate(betas))
        for k, b in enumerate((beta1, beta2)):
            if not b < 1.0:
                raise ValueError(f"{betas_name}[{k}] must be in [0, 1); got {betas[k]!r}")
        if wd != 0 and not _fits32(1.0 - lr * wd):
            raise ValueError(f"1 - {_name('lr', index)} * {_name('weight_decay', index)} (the decay factor) must be "
                             f"finite in binary32; got lr = {lr!r}, weight_decay = {wd!r}")
        return lr, beta1, beta2, eps, wd

    def _plan(self, p, hyper, index):
        """The update of p at its next step t, with spec 29.12's host constants, made and checked now."""
        lr, beta1, beta2, eps, wd = hyper
        kernel = _kernel(self.backend, p, "adamw_step", "AdamW")
        state = self.state[p]
        beta1_power = state.get("beta1_power", 1.0) * beta1           # beta^t by t binary64 multiplications
        beta2_power = state.get("beta2_power", 1.0) * beta2
        bc1, bc2 = 1.0 - beta1_power, 1.0 - beta2_power
        if not _fits32(lr / bc1):
            raise ValueError(f"{_name('lr', index)} / (1 - beta1^t) = {lr / bc1!r} at step t = "
                             f"{state.get('step', 0) + 1} exceeds binary32; lower lr")
        constants = (None if wd == 0 else _rn32(1.0 - lr * wd), _rn32(beta1), _rn32(1.0 - beta1), _rn32(beta2),
                     _rn32(1.0 - beta2), _rn32(1.0 / math.sqrt(bc2)), _rn32(eps), _rn32(lr / bc1))

        def update():
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            w, m, v = kernel(ops._dense(p.detach()).reshape(-1), ops._dense(p.grad).reshape(-1),
                             state["exp_avg"].reshape(-1), state["exp_avg_sq"].reshape(-1), *constants)
            state["step"] += 1
            state["beta1_power"], state["beta2_power"] = beta1_power, beta2_power
            p.copy_(w.reshape(p.shape))
            state["exp_avg"].copy_(m.reshape(p.shape))
            state["exp_avg_sq"].copy_(v.reshape(p.shape))
        return update


class SGD(_Canonical):
    """torch.optim.SGD (maximize=False) in spec 29.12's order, on `backend`. Accepted (spec 29.12): lr, momentum
    and weight_decay finite >= 0, dampening finite (torch checks none of it), each an int, float, numpy scalar
    or one-element tensor; nesterov needs momentum > 0 and dampening = 0, as torch."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 backend=None):
        self.backend = backend
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
                    "nesterov": nesterov}
        self._hyper(defaults, None)
        super().__init__(params, defaults)

    @staticmethod
    def _hyper(group, index):
        """(lr, momentum, 1 - dampening, weight_decay, nesterov) as RN32 values, or the error naming the user's."""
        values = {}
        for key in ("lr", "momentum", "weight_decay"):
            values[key] = _in_domain(group[key], _name(key, index), 0.0, False, "finite, >= 0 and at most 3.4e38")
        dampening = _in_domain(group["dampening"], _name("dampening", index), -_FLOAT32_MAX, False,
                               "finite and at most 3.4e38 in magnitude")
        if not _fits32(1.0 - dampening):
            raise ValueError(f"1 - {_name('dampening', index)} must be finite in binary32; got {group['dampening']!r}")
        if values["momentum"] != 0 and _rn32(values["momentum"]) == 0:
            raise ValueError(f"{_name('momentum', index)} must be 0 or round to a nonzero binary32; got "
                             f"{group['momentum']!r}")
        nesterov = group["nesterov"]
        if not isinstance(nesterov, (bool, np.bool_)):
            raise TypeError(f"{_name('nesterov', index)} must be a bool; got {nesterov!r}")
        if nesterov and (values["momentum"] == 0 or dampening != 0):
            raise ValueError(f"{_name('nesterov', index)} needs momentum > 0 and dampening = 0 (as torch.optim.SGD)")
        return (_rn32(values["lr"]), _rn32(values["momentum"]), _rn32(1.0 - dampening),
                _rn32(values["weight_decay"]), bool(nesterov))

    def _plan(self, p, hyper, index):
        kernel = _kernel(self.backend, p, "sgd_step", "SGD")
        state = self.state[p]

        def update():
            buf = state.get("momentum_buffer")
            w, buf = kernel(ops._dense(p.detach()).reshape(-1), ops._dense(p.grad).reshape(-1),
                            None if buf is None else buf.reshape(-1), *hyper)
            p.copy_(w.reshape(p.shape))
            if buf is not None:
                state["momentum_buffer"] = buf.reshape(p.shape).clone()
        return update


def _flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; got {value!r}")
    return bool(value)


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None, *, backend=None):
    """torch.nn.utils.clip_grad_norm_ with spec 29.10's norm: scale every gradient by
    coef = RN32(min(1, max_norm / (norm + 1e-6))) (NaN-propagating min) and return the norm, a 0-d float32 tensor.
    norm = sqrt32 of the canonical sum, over the parameters in the order given, of each gradient's canonical
    sum of squares; where that sum overflows, the same sums of the gradients scaled by 2^-64, and the root scaled
    back (so a finite norm is +inf only beyond binary32). Parameters without a gradient, or with no elements,
    are skipped. norm_type must be 2 (the one canonical norm); error_if_nonfinite=True raises RuntimeError, as
    torch, before any gradient changes; foreach (None or a bool) is accepted and changes nothing."""
    max_norm = _in_domain(max_norm, "max_norm", 0.0, True, "finite and > 0")
    if isinstance(norm_type, str) or _real(norm_type, "norm_type") != 2.0:
        raise ValueError(f"norm_type must be 2.0: spec 29.10 defines the Euclidean norm only; got {norm_type!r}")
    error_if_nonfinite = _flag(error_if_nonfinite, "error_if_nonfinite")
    if foreach is not None:
        _flag(foreach, "foreach")
    params = _params(parameters, "parameters")
    grads = []
    for i, p in enumerate(params):
        if p.grad is None or p.grad.numel() == 0:
            continue
        if p.grad.layout != torch.strided or p.grad.dtype != torch.float32:
            raise TypeError(f"bitparity.optim.clip_grad_norm_: the gradient of parameters[{i}] must be dense "
                            f"float32; got {p.grad.layout} {p.grad.dtype}")
        grads.append(p.grad)
    if not grads:
        return torch.tensor(0.0)
    norm = _norm(grads, 1.0, backend)
    if norm == math.inf:                                  # overflowed squares: the scaled sums, then the root * 2^64
        norm = np.float32(_norm(grads, _TWO_M64, backend) * np.float32(_TWO_P64))
    if error_if_nonfinite and not np.isfinite(norm):
        raise RuntimeError(f"The total norm of order 2.0 for gradients from `parameters` is non-finite ({norm}), so "
                           f"it cannot be clipped. To disable this error and scale the gradients by the non-finite "
                           f"norm anyway, set `error_if_nonfinite=False`")
    ratio = max_norm / (float(norm) + 1e-6)
    coef = _rn32(ratio if math.isnan(ratio) else min(1.0, ratio))    # torch.clamp's NaN-propagating min
    for g in grads:
        g.mul_(coef)
    return torch.tensor(norm)


def _norm(grads, scale, backend):
    """sqrt32 of the canonical sum of the gradients' canonical sums of (g * scale)^2 (one rounding per product;
    scale is 1 or 2^-64, exact)."""
    squares = []
    for g in grads:
        flat = g.detach().reshape(1, -1)
        flat = flat if scale == 1.0 else flat * scale
        squares.append(ops.sum(flat * flat, backend=backend).reshape(1))
    total = ops.sum(torch.cat(squares).to(grads[0].device), backend=backend)
    with np.errstate(invalid="ignore"):                   # sqrt32(+inf)'s steps run on inf; it returns +inf
        return np.float32(sqrt32(np.float32(float(total))))


class GradientFold:
    """Accumulates micro-batch gradients by spec 29.1's row fold: call `add(rows)` after each micro-batch's
    backward, with the number of rows every op of that backward folded (for a model: sequences x padded length;
    it takes every parameter's .grad and clears it), and `finish()` after the last (it writes the folded
    gradient to .grad). The result is the bits of one backward over all rows when the micro-batches are
    consecutive blocks of the same power-of-two number of rows, at least spec.LINEAR_GRAD_BLOCK (linear's weight
    gradient is exact over blocks of that many rows, spec 29.2), the last possibly shorter; `add` refuses any
    other layout, before it changes anything. Parameters must be float32: a bf16 parameter's .grad is rounded
    to bf16 by each micro-batch's backward, so no fold of them is one backward's bits.
    The partials are combined by row_fold.Counter, so at most log2(micro-batches) per parameter are held."""

    def __init__(self, params):
        self.params = _params(params, "params")
        for i, p in enumerate(self.params):
            if p.dtype != torch.float32 and p.requires_grad:       # a frozen parameter never gets a gradient
                raise TypeError(f"GradientFold: params[{i}] has dtype {p.dtype}; each micro-batch's backward rounds "
                                f"its .grad to that dtype, so folding them cannot give one backward's bits: keep "
                                f"float32 master parameters")
        self._counter = row_fold.Counter(lambda left, right: [row_fold.plus(a, b) for a, b in zip(left, right)])
        self._rows = []                                   # the rows of each micro-batch added since finish()

    def add(self, rows):
        if isinstance(rows, (bool, np.bool_)) or not isinstance(rows, (int, np.integer)) or rows < 1:
            raise ValueError(f"GradientFold.add: rows must be a positive int (the micro-batch's rows); got {rows!r}")
        rows = int(rows)
        if self._rows:
            first, last = self._rows[0], self._rows[-1]
            if first & (first - 1):
                raise ValueError(f"GradientFold.add: the first micro-batch had {first} rows, not a power of two; "
                                 f"with several micro-batches each but the last must have the same power-of-two "
                                 f"number of rows (spec 29.1), or the fold is not one backward's")
            if last < first:
                raise ValueError(f"GradientFold.add: the previous micro-batch had {last} rows, fewer than the "
                                 f"first's {first}: only the last micro-batch may be shorter (spec 29.1)")
            if rows > first:
                raise ValueError(f"GradientFold.add: this micro-batch has {rows} rows, more than the first's "
                                 f"{first}: every micro-batch but the last must have the same power-of-two number "
                                 f"of rows, the last at most as many (spec 29.1)")
            if first < spec.LINEAR_GRAD_BLOCK:
                raise ValueError(f"GradientFold.add: the first micro-batch had {first} rows, fewer than the "
                                 f"{spec.LINEAR_GRAD_BLOCK} of a linear gradient block: with several micro-batches "
                                 f"each must hold whole blocks (spec 29.2), or the fold is not one backward's")
        for i, p in enumerate(self.params):
            if p.grad is not None:
                _check_dense_float32(p, p.grad, "GradientFold", f"params[{i}]")
        grads = [None if p.grad is None else p.grad.detach().clone() for p in self.params]
        for p in self.params:
            p.grad = None
        self._rows.append(rows)
        self._counter.push(grads)                        # [grad or None per parameter]

    def finish(self):
        if self._counter.empty():
            raise ValueError("GradientFold.finish: no micro-batch was added")
        folded = self._counter.result()
        self._rows = []
        for p, g in zip(self.params, folded):
            p.grad = g


__all__ = ["AdamW", "SGD", "clip_grad_norm_", "GradientFold"]
