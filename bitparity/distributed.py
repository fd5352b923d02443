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

Errors are raised identically on every rank, never on one rank while the others wait: ranks first exchange
their inputs' shapes and dtypes and all check all of them. A collective that fails (a rank died, the group's
timeout passed) raises a RuntimeError naming the op.
"""

import math

import torch
import torch.distributed as dist

from . import autograd as _autograd
from . import ops
from .backends import resolve as _resolve

# Transported as bytes, so any dtype crosses exactly; the code names the dtype in the shape exchange.
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.bool, torch.int64, torch.int32)
_MAX_DIMS = 8


def _group_size(op, group):
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"bitparity.distributed.{op}: torch.distributed is not initialised; call "
                         f"torch.distributed.init_process_group first")
    return dist.get_world_size(group), dist.get_rank(group)


def _collective(op, what, call):
    try:
        return call()
    except (RuntimeError, dist.DistError) as error:
        raise RuntimeError(f"bitparity.distributed.{op}: the {what} failed across the group (a rank died or "
                           f"the group's timeout passed): {error}") from error


def _describe(name, t):
    """[dtype code, dims, shape...] of one argument as int64; -1 codes a non-tensor or an unsupported dtype."""
    row = torch.full((2 + _MAX_DIMS,), -1, dtype=torch.int64)
    if isinstance(t, torch.Tensor) and t.dtype in _DTYPES and t.dim() <= _MAX_DIMS:
        row[0], row[1] = _DTYPES.index(t.dtype), t.dim()
        row[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    return row


def _check_layouts(op, names, table):
    """table [W, args, 2 + _MAX_DIMS]: the same error on every rank for the first rank whose argument is not a
    tensor of a supported dtype with at least one dimension, or whose dtype, rank or trailing shape differs
    from rank 0's."""
    for rank, rows in enumerate(table.tolist()):
        for name, (code, dims, *shape), first in zip(names, rows, table[0].tolist()):
            if code < 0 or dims < 1:
                raise TypeError(f"bitparity.distributed.{op}: {name} on rank {rank} must be a tensor of at least one "
                                f"dimension (rows) and dtype one of {', '.join(map(str, _DTYPES))}")
            if (code, dims, shape[1:dims]) != (first[0], first[1], first[3:2 + dims]):
                raise ValueError(
                    f"bitparity.distributed.{op}: {name} must have the same dtype and trailing shape on every rank; "
                    f"rank 0 has {_DTYPES[first[0]]} {tuple(first[2:2 + first[1]])}, rank {rank} has "
                    f"{_DTYPES[code]} {tuple(shape[:dims])}")
        if len({r[2] for r in rows}) != 1:
            raise ValueError(f"bitparity.distributed.{op}: {', '.join(names)} must have the same number of rows on "
                             f"rank {rank}; got {[r[2] for r in rows]}")


def _gathered(op, group, **tensors):
    """{name: the rank-order concatenation along dim 0} with this rank's own tensor (autograd intact) in its
    place, and (start, stop): this rank's rows in it."""
    world, rank = _group_size(op, group)
    names = list(tensors)
    local = torch.stack([_describe(name, t) for name, t in tensors.items()])
    table = [torch.empty_like(local) for _ in range(world)]
    _collective(op, "shape exchange", lambda: dist.all_gather(table, local, group=group))
    table = torch.stack(table)
    _check_layouts(op, names, table)
    rows = table[:, 0, 2].tolist()
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
    g, _ = _gathered("masked_mean", group, x=x, mask=mask)
    return ops.masked_mean(g["x"], g["mask"], backend=backend)


def masked_whiten(x, mask, *, shift_mean=True, unbiased=True, eps=1e-8, eps_mode="add", group=None, backend=None):
    """This rank's rows of bitparity.masked_whiten(X, M, ...) over the global batch (X, M as in masked_mean):
    the mean and variance are the global ones. Differentiable in x."""
    g, (start, stop) = _gathered("masked_whiten", group, x=x, mask=mask)
    out = ops.masked_whiten(g["x"], g["mask"], shift_mean=shift_mean, unbiased=unbiased, eps=eps, eps_mode=eps_mode,
                            backend=backend)
    return out[start:stop]


def ppo_policy_loss(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None,
                    ratio_clamp=20.0, agg="token-mean", group=None, backend=None):
    """bitparity.ppo_policy_loss over the global batch of sequences (each rank's rows [B_r, T] are its
    sequences; T equal on every rank): the global (loss, clip fraction) on every rank, every agg. The loss
    is differentiable in this rank's logp."""
    g, _ = _gathered("ppo_policy_loss", group, logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
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
    params = list(params)
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8)
    table = [torch.empty_like(present) for _ in range(world)]
    _collective("fold_gradients", "gradient exchange", lambda: dist.all_gather(table, present, group=group))
    used = [p for p, any_rank in zip(params, torch.stack(table).amax(0).tolist()) if any_rank]
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
