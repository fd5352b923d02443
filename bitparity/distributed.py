"""Data-parallel reductions and gradients whose bits do not depend on the world size (spec 28).

Each rank passes its own rows; the global batch is the concatenation of every rank's rows in rank order
along dimension 0, and each function returns, on every rank, the bits of the single-process op on that
concatenation. Only data crosses the wire: the ranks all-gather their inputs' bytes and every rank
computes the single-process op itself, so no addition ever happens inside the collective library (whose
all-reduce order depends on the world size, the message size and the algorithm: ring, tree, NVLS). Any
process-group backend works (gloo here; NCCL and HCCL with device tensors); ranks may hold different
numbers of rows.

Gradients: the local tensor enters the concatenation as itself, so the result's gradient w.r.t. this rank's
rows is that rank's slice of the single-process gradient (spec 26), with no communication in the backward.
The loss returned is the global one on every rank: summing (not averaging) parameter gradients over the
ranks gives the single-process gradient.

Errors are raised identically on every rank, never on one rank while the others wait: before any collective
that depends on them, ranks exchange a description of what they pass (each tensor's type, dtype, shape, device
type and layout; the other arguments; for fold_gradients every parameter and gradient) with all_gather_object,
which carries objects of any size, and every rank checks every rank's description in the same order. A
collective that fails (a rank died, the group's timeout passed) raises a RuntimeError naming the op.
"""

import math

import torch
import torch.distributed as dist

from . import autograd as _autograd
from . import ops
from .backends import resolve as _resolve

# Transported as bytes, so any dtype crosses exactly.
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.bool, torch.int64, torch.int32)


def _name(op):
    """The public name of op in messages: distributed's own ops by their name, another module's by its qualified
    name ("parallel.moe" -> bitparity.parallel.moe), so spec 31's modules reuse these checks."""
    return f"bitparity.{op}" if "." in op else f"bitparity.distributed.{op}"


def _group_size(op, group):
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"{_name(op)}: torch.distributed is not initialised; call "
                         f"torch.distributed.init_process_group first")
    return dist.get_world_size(group), dist.get_rank(group)


def _collective(op, what, call):
    try:
        return call()
    except (RuntimeError, dist.DistError) as error:
        raise RuntimeError(f"{_name(op)}: the {what} failed across the group (a rank died or "
                           f"the group's timeout passed): {error}") from error


def _describe(t):
    """What every rank must agree on about one tensor, as plain data: (type, dtype, shape, device type,
    layout). Built without reading a value, so a meta or sparse tensor is described, not touched."""
    if not isinstance(t, torch.Tensor):
        return (type(t).__name__, None, None, None, None)
    return ("Tensor", str(t.dtype), tuple(t.shape), t.device.type, str(t.layout))


def _exchange(op, group, world, description):
    """Every rank's description, in rank order. all_gather_object sends each object's size first, so the
    ranks' descriptions may differ in length without a collective ever seeing mismatched sizes."""
    table = [None] * world
    _collective(op, "layout exchange", lambda: dist.all_gather_object(table, description, group=group))
    return table


def _check_tensor(op, name, rank, described, dtypes):
    """The same error on every rank for an argument that is not a dense tensor with data of one of dtypes."""
    kind, dtype, _, device, layout = described
    where = f"{_name(op)}: {name} on rank {rank}"
    if kind != "Tensor":
        raise TypeError(f"{where} must be a torch.Tensor; got {kind}")
    if layout != str(torch.strided):
        raise TypeError(f"{where} must be a dense (strided) tensor; got layout {layout}")
    if device == "meta":
        raise ValueError(f"{where} must hold data; got a tensor on the meta device")
    if dtype not in map(str, dtypes):
        raise TypeError(f"{where} must have dtype one of {', '.join(map(str, dtypes))}; got {dtype}")


def _check_agreement(op, what, table, key):
    """The same ValueError on every rank naming the first rank whose key(entry) differs from rank 0's."""
    for rank, entry in enumerate(table[1:], 1):
        if key(entry) != key(table[0]):
            raise ValueError(f"{_name(op)}: {what} must be the same on every rank; rank 0 has "
                             f"{key(table[0])}, rank {rank} has {key(entry)}")


def _check_layouts(op, names, options, table):
    """table: every rank's (argument descriptions, option reprs). The same error on every rank, in this order:
    an argument that is not a dense tensor with data and at least one dimension (rows); a dtype, trailing
    shape or device type that differs from rank 0's; arguments of one rank with different row counts; an
    option that differs from rank 0's."""
    for rank, (described, _) in enumerate(table):
        for name, d in zip(names, described):
            _check_tensor(op, name, rank, d, _DTYPES)
            if not d[2]:
                raise ValueError(f"{_name(op)}: {name} on rank {rank} must have at least one "
                                 f"dimension (rows); got a 0-d tensor")
    for index, name in enumerate(names):
        _check_agreement(op, f"{name}'s dtype, trailing shape and device type", table,
                         lambda entry: (entry[0][index][1], entry[0][index][2][1:], entry[0][index][3]))
    for rank, (described, _) in enumerate(table):
        rows = [d[2][0] for d in described]
        if len(set(rows)) != 1:
            raise ValueError(f"{_name(op)}: {', '.join(names)} must have the same number of rows on "
                             f"rank {rank}; got {rows}")
    for option in options:
        _check_agreement(op, option, table, lambda entry: entry[1][option])


def _gathered(op, group, options, **tensors):
    """{name: the rank-order concatenation along dim 0} with this rank's own tensor (autograd intact) in its
    place, and (start, stop): this rank's rows in it. options: the op's other arguments, which must be the
    same on every rank (compared by repr, so NaN equals NaN)."""
    world, rank = _group_size(op, group)
    names = list(tensors)
    table = _exchange(op, group, world, ([_describe(t) for t in tensors.values()],
                                         {name: repr(value) for name, value in options.items()}))
    _check_layouts(op, names, list(options), table)
    rows = [described[0][2][0] for described, _ in table]
    start = sum(rows[:rank])
    concatenated = {}
    for index, (name, t) in enumerate(tensors.items()):
        dense = ops._dense(t.detach())
        sizes = [r * math.prod(dense.shape[1:]) * dense.element_size() for r in rows]     # bytes per rank
        payload = torch.zeros(max(sizes), dtype=torch.uint8, device=dense.device)
        payload[:sizes[rank]] = dense.reshape(-1).view(torch.uint8)
        parts = [torch.empty_like(payload) for _ in range(world)]
        _collective(op, f"all_gather of {name}", lambda: dist.all_gather(parts, payload, group=group))
        pieces = [t if r == rank else parts[r][:sizes[r]].view(dense.dtype).reshape(rows[r], *dense.shape[1:])
                  for r in range(world)]
        concatenated[name] = torch.cat(pieces)
    return concatenated, (start, start + rows[rank])


def masked_mean(x, mask, *, group=None, backend=None):
    """bitparity.masked_mean(X, M) over the whole global batch (0-d, the same bits on every rank), where X and M
    are the rank-order concatenations of every rank's x [B_r, ...] and mask [B_r, ...]. Differentiable in x."""
    g, _ = _gathered("masked_mean", group, {"backend": backend}, x=x, mask=mask)
    return ops.masked_mean(g["x"], g["mask"], backend=backend)


def masked_whiten(x, mask, *, shift_mean=True, unbiased=True, eps=1e-8, eps_mode="add", group=None, backend=None):
    """This rank's rows of bitparity.masked_whiten(X, M, ...) over the global batch (X, M as in masked_mean):
    the mean and variance are the global ones. Differentiable in x."""
    options = {"shift_mean": shift_mean, "unbiased": unbiased, "eps": eps, "eps_mode": eps_mode, "backend": backend}
    g, (start, stop) = _gathered("masked_whiten", group, options, x=x, mask=mask)
    out = ops.masked_whiten(g["x"], g["mask"], shift_mean=shift_mean, unbiased=unbiased, eps=eps, eps_mode=eps_mode,
                            backend=backend)
    return out[start:stop]


def ppo_policy_loss(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None,
                    ratio_clamp=20.0, agg="token-mean", group=None, backend=None):
    """bitparity.ppo_policy_loss over the global batch of sequences (each rank's rows [B_r, T] are its
    sequences; T equal on every rank): the global (loss, clip fraction) on every rank, every agg. The loss
    is differentiable in this rank's logp."""
    options = {"clip_low": clip_low, "clip_high": clip_high, "dual_clip": dual_clip, "ratio_clamp": ratio_clamp,
               "agg": agg, "backend": backend}
    g, _ = _gathered("ppo_policy_loss", group, options, logp=logp, old_logp=old_logp, advantages=advantages,
                     mask=mask)
    return ops.ppo_policy_loss(g["logp"], g["old_logp"], g["advantages"], g["mask"], clip_low=clip_low,
                               clip_high=clip_high, dual_clip=dual_clip, ratio_clamp=ratio_clamp, agg=agg,
                               backend=backend)


def fold_gradients(params, *, group=None, backend=None):
    """Replace every parameter's .grad, on every rank, by the row fold (spec 29.1) of all ranks' gradients in
    rank order: the single-process gradient, bit for bit, when rank r's gradient is the row fold over the r-th
    of W consecutive, equal, power-of-two blocks of the batch's rows (spec 28.1). W must be a power of two. A
    parameter without a gradient on a rank counts there as the row fold's -0.0 (no rows); one without a
    gradient on every rank keeps .grad None.

    Only data crosses the wire, in the bytes of a ring all-reduce: an all_to_all gives each rank every rank's
    partials of its 1/W share of the elements, which it folds; an all_gather returns the folded shares."""
    world, rank = _group_size("fold_gradients", group)
    if world & (world - 1):
        raise ValueError(f"bitparity.distributed.fold_gradients: the world size must be a power of two (the row "
                         f"fold's blocks); got {world}")
    # Described, never raised on, locally: a rank that raised before the exchange would leave the others waiting.
    if not hasattr(params, "__iter__"):
        description, params = type(params).__name__, []
    else:
        params = [params] if isinstance(params, torch.Tensor) else list(params)     # torch's clip_grad_norm_ rule
        description = [(_describe(p), None if getattr(p, "grad", None) is None else _describe(p.grad),
                         str(p.device) if isinstance(p, torch.Tensor) else None) for p in params]
    table = _exchange("fold_gradients", group, world, description)
    _check_parameters(table)
    used = [p for i, p in enumerate(params) if any(entries[i][1] is not None for entries in table)]
    if not used:
        return
    device = used[0].device
    flat = torch.cat([(torch.full(p.shape, -0.0, device=device) if p.grad is None else p.grad.to(torch.float32))
                      .reshape(-1) for p in used])
    share = -(-flat.numel() // world)
    padded = torch.full((world * share,), -0.0, device=device)
    padded[:flat.numel()] = flat
    partials = torch.empty_like(padded)                       # [W, share]: rank q's partial of this rank's share
    _collective("fold_gradients", "all_to_all", lambda: dist.all_to_all_single(partials, padded, group=group))
    folded = _autograd.row_fold(_resolve(backend, device), partials.reshape(world, share))
    shares = [torch.empty_like(folded) for _ in range(world)]
    _collective("fold_gradients", "all_gather", lambda: dist.all_gather(shares, folded, group=group))
    total = torch.cat(shares)[:flat.numel()]
    offset = 0
    for p in used:
        p.grad = total[offset:offset + p.numel()].reshape(p.shape).to(p.dtype).clone()
        offset += p.numel()


def _check_parameters(table):
    """table: every rank's [(parameter, gradient or None, device)] descriptions. The same error on every rank,
    in this order: a different number of parameters than rank 0; a parameter or gradient that is not a dense
    float32, bfloat16 or float16 tensor with data; a gradient of another shape than its parameter; parameters
    of one rank on several devices; a parameter whose dtype, shape or device type differs from rank 0's."""
    op = "fold_gradients"
    for rank, entries in enumerate(table):
        if isinstance(entries, str):
            raise TypeError(f"{_name(op)}: params on rank {rank} must be a tensor or an iterable of "
                            f"tensors; got {entries}")
    _check_agreement(op, "the number of parameters in params", table, len)
    for rank, entries in enumerate(table):
        for i, (param, grad, _) in enumerate(entries):
            _check_tensor(op, f"params[{i}]", rank, param, ops._FLOAT_DTYPES)
            if grad is not None:
                _check_tensor(op, f"params[{i}].grad", rank, grad, ops._FLOAT_DTYPES)
                if grad[2] != param[2]:
                    raise ValueError(f"{_name(op)}: params[{i}].grad on rank {rank} must have the "
                                     f"parameter's shape {param[2]}; got {grad[2]}")
        devices = sorted({device for _, _, device in entries})
        if len(devices) > 1:
            raise ValueError(f"{_name(op)}: params on rank {rank} must all be on one device (the "
                             f"flat gradient buffer's); got {', '.join(devices)}")
    for i in range(len(table[0])):
        _check_agreement(op, f"params[{i}]'s dtype, shape and device type", table,
                         lambda entries: (entries[i][0][1], entries[i][0][2], entries[i][0][3]))
