"""Expert-parallel MoE (spec 31.4): spec 24.6's block with its experts placed on the ranks of a group, and its
backward (spec 29.7), giving the bits of one process at every group size.

The global token sequence is the concatenation of every rank's tokens x [T_r, D] in rank order (uneven T_r, and
T_r = 0, allowed). The router [E, D] is replicated; rank r holds experts expert_range(E, W, r), E/W consecutive
ones. Every op of the block is per row (spec 24's linear, topk, softmax, silu_mul and canonical_sum each compute a
token from that token and the weights only), so a token's expert outputs are the same bits on whichever rank they
are computed and in whatever company:

- forward: a token's router logits, top-k and weights on its home rank; (token, slot) rows dispatched to the
  experts' ranks with all_to_all (the row counts exchanged first, also with all_to_all); each expert's y_s on its
  rank; y_s returned with all_to_all; spec 24.6's combine per token in rank order on the home rank.
- backward: dwt, dl and dy_s = g * wt_s per token on the home rank; dy_s to the expert's rank, which returns the
  dx terms gz_s and gu_s (spec 29.7 adds 1 + 2k terms per token in one sum on the home rank, so the expert cannot
  add them); an expert's gate/up/down gradient is spec 29.2's blocked row fold over the tokens that chose it at
  their GLOBAL positions, on the expert's rank; the router's gradient is split by columns of x (each element of
  spec 29.2's block product reads one column of dl and one of x): rank q receives every token's dl [T, E] and its
  columns of x, computes those columns of the router gradient over all T tokens, and an all_gather gives every
  rank the whole single-process gradient.

No float is added inside a collective: all_to_all and all_gather only move rows, counts and finished columns.
"""

import hashlib
import numbers

import torch
import torch.distributed as dist

from .. import autograd as _autograd
from .. import distributed as _distributed
from .. import ops
from ..backends import resolve as _resolve

_OP = "parallel.moe"
_NAME = f"bitparity.{_OP}"
_TENSORS = ("x", "router", "gate", "up", "down")


def expert_range(num_experts, world_size, rank):
    """(start, stop): the experts rank holds, num_experts / world_size consecutive experts in rank order
    (spec 31.4). ValueError where num_experts is not divisible by world_size."""
    num_experts = ops._positive_int("num_experts", num_experts)
    world_size = ops._positive_int("world_size", world_size)
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise TypeError(f"rank must be an integer; got {type(rank).__name__}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size - 1}] (world_size - 1); got {rank}")
    if num_experts % world_size:
        raise ValueError(f"num_experts = {num_experts} must be divisible by world_size = {world_size}: each rank holds "
                         f"num_experts / world_size consecutive experts")
    per = num_experts // world_size
    return rank * per, (rank + 1) * per


def _column_range(width, world, rank):
    """The columns of x whose router gradient rank computes: a contiguous split whose sizes differ by at most one
    (some empty where width < world)."""
    return rank * width // world, (rank + 1) * width // world


# -- The same error on every rank ---------------------------------------------------------------------------

def _router_digest(router):
    """sha256 of the router's bytes, read only from a dense tensor with data (anything else is refused later)."""
    if (not isinstance(router, torch.Tensor) or router.layout != torch.strided or router.device.type == "meta"
            or router.dim() == 0):
        return None
    return hashlib.sha256(router.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def _resolved(backend, x):
    """("ok", backend name) or (error type, message) of resolving the backend on this rank, raised on every rank."""
    if not isinstance(x, torch.Tensor):
        return "ok", None                               # x's own error comes first
    try:
        module = _resolve(backend, x.device)
    except (ValueError, RuntimeError, TypeError) as error:
        return type(error).__name__, str(error)
    if module.NAME == "native":
        return "ValueError", (f"backend must be a canonical backend (numpy, cpu, cuda, ascend); native runs "
                              f"torch's ops, whose bits no other rank count reproduces")
    return "ok", module.NAME


def _description(tensors, options, backend):
    """What every rank must agree on, built without reading a value except the router's bytes."""
    described = [_distributed._describe(t) for t in tensors]
    devices = sorted({str(t.device) for t in tensors if isinstance(t, torch.Tensor)})
    reprs = {name: repr(value) for name, value in options.items()}
    return described, devices, reprs, _router_digest(tensors[1]), _resolved(backend, tensors[0])


def _check_call(table, world):
    """The same error on every rank, in this order: an argument that is not a dense float tensor with data of its
    rank (x 2-d, router 2-d, gate/up/down 3-d); one rank's tensors on several devices; a device type or router shape
    other than rank 0's; E not divisible by the group's size; a shape that does not fit rank 0's router [E, D] and
    gate [E/W, I, D]; an option or the router's bytes other than rank 0's; the backend (unavailable, wrong device,
    native). moe checks k and norm_topk_prob next. Returns E."""
    layouts = {"x": (2, "[T_r, D]"), "router": (2, "[E, D]"), "gate": (3, "[E/W, I, D]"), "up": (3, "[E/W, I, D]"),
               "down": (3, "[E/W, D, I]")}
    for rank, (described, devices, _, _, _) in enumerate(table):
        for name, d in zip(_TENSORS, described):
            _distributed._check_tensor(_OP, name, rank, d, ops._FLOAT_DTYPES)
            dims, shape = layouts[name]
            if len(d[2]) != dims:
                raise ValueError(f"{_NAME}: {name} on rank {rank} must have shape {shape}; got {d[2]}")
        if len(devices) > 1:
            raise ValueError(f"{_NAME}: x, router, gate, up and down on rank {rank} must be on one device; got "
                             f"{', '.join(devices)}")
    _distributed._check_agreement(_OP, "the device type of x", table, lambda entry: entry[0][0][3])
    _distributed._check_agreement(_OP, "router's shape [E, D] (it is replicated)", table, lambda entry: entry[0][1][2])
    experts, width = table[0][0][1][2]
    if experts % world:
        raise ValueError(f"{_NAME}: router's E = {experts} experts must be divisible by the group's size {world}: each "
                         f"rank holds E/W consecutive experts (expert_range)")
    per, inter = experts // world, table[0][0][2][2][1]
    want = {"gate": (per, inter, width), "up": (per, inter, width), "down": (per, width, inter)}
    for rank, (described, _, _, _, _) in enumerate(table):
        if described[0][2][1] != width:
            raise ValueError(f"{_NAME}: x on rank {rank} must have shape [T_r, D] with D = {width} (router's); got "
                             f"{described[0][2]}")
        for name, d in zip(_TENSORS[2:], described[2:]):
            if d[2] != want[name]:
                raise ValueError(f"{_NAME}: {name} on rank {rank} must have shape {want[name]} (this rank's E/W = "
                                 f"{per} experts, I = {inter} from rank 0's gate, D = {width}); got {d[2]}")
    for option in table[0][2]:
        _distributed._check_agreement(_OP, option, table, lambda entry: entry[2][option])
    _distributed._check_agreement(_OP, "router's values (it is replicated: the same bits on every rank)", table,
                                  lambda entry: entry[3])
    for rank, entry in enumerate(table):
        kind, message = entry[4]
        if kind != "ok":
            raise (TypeError if kind == "TypeError" else ValueError)(f"{_NAME}: backend on rank {rank}: {message}")
    return experts


class _Plan:
    """One call's constants: the backend, the group, the k and routing mode, and every rank's token count."""

    def __init__(self, module, group, world, rank, top_k, norm_topk_prob, rows, experts):
        self.module, self.group, self.world, self.rank = module, group, world, rank
        self.top_k, self.norm_topk_prob, self.rows, self.experts = top_k, norm_topk_prob, rows, experts
        self.per = experts // world
        self.offset, self.total = sum(rows[:rank]), sum(rows)


# -- Moving rows: all_to_all, sizes known on both sides ----------------------------------------------------

def _all_to_all(plan, rows, send_sizes, recv_sizes, what):
    """rows [n, ...] cut into send_sizes[q] rows for rank q -> [sum(recv_sizes), ...], rank r's rows at their place
    in rank order. Exact: bytes move, nothing is added."""
    out = torch.empty((sum(recv_sizes), *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    _distributed._collective(_OP, f"all_to_all of {what}", lambda: dist.all_to_all_single(
        out, rows.contiguous(), recv_sizes, send_sizes, group=plan.group))
    return out


class _Dispatch:
    """Where this rank's (token, slot) rows go and where the rows this rank's experts compute come from.

    Sent rows are ordered by expert, then token (so each destination's rows are one slice, its experts in order);
    received rows are in source-rank order, each source's by expert, then token. An expert's rows, taken source by
    source, are therefore in ascending global token order (ranks hold consecutive slices of the sequence)."""

    def __init__(self, plan, chosen):
        flat = chosen.reshape(-1)
        order = torch.sort(flat, stable=True).indices                 # expert, then token (flat index t*k + s)
        self.tokens, self.slots = order // plan.top_k, order % plan.top_k
        counts = torch.bincount(flat, minlength=plan.experts).to(torch.int64)     # [E] rows per expert
        self.send_sizes = counts.reshape(plan.world, plan.per).sum(1).tolist()
        got = _all_to_all(plan, counts, [plan.per] * plan.world, [plan.per] * plan.world, "row counts")
        got = got.reshape(plan.world, plan.per)                       # [source rank, local expert]
        self.recv_sizes = got.sum(1).tolist()
        starts = (torch.cumsum(got.reshape(-1), 0) - got.reshape(-1)).reshape(plan.world, plan.per)
        self.expert_rows = [torch.cat([torch.arange(int(starts[r, e]), int(starts[r, e] + got[r, e]),
                                                    device=chosen.device)
                                       for r in range(plan.world)]) for e in range(plan.per)]
        self.positions = _all_to_all(plan, self.tokens + plan.offset, self.send_sizes, self.recv_sizes,
                                     "token positions")                 # global: rank offset + local token

    def send(self, plan, rows, what):
        return _all_to_all(plan, rows, self.send_sizes, self.recv_sizes, what)

    def back(self, plan, rows, what):
        return _all_to_all(plan, rows, self.recv_sizes, self.send_sizes, what)


# -- Forward (spec 24.6) and backward (spec 29.7) ------------------------------------------------------------

def _route(plan, x, router):
    """Spec 24.6's routing of this rank's tokens: (weights [T_r, k], chosen [T_r, k], probs [T_r, E] or None)."""
    if x.shape[0] == 0:
        empty = torch.empty((0, plan.top_k), dtype=torch.float32, device=x.device)
        probs = None if plan.norm_topk_prob else torch.empty((0, plan.experts), dtype=torch.float32, device=x.device)
        return empty, empty.to(torch.int64), probs
    return _autograd._moe_routing(plan.module, x, router, plan.top_k, plan.norm_topk_prob)


def _expert_forward(module, h, gate, up):
    """(z, u, act) of one expert on its rows h: z = linear(h, gate), u = linear(h, up), act = silu_mul(z, u)."""
    z, u = module.linear(h, gate, None), module.linear(h, up, None)
    return z, u, module.silu_mul(z.reshape(-1), u.reshape(-1)).reshape(z.shape)


def _combine(module, weights, outputs):
    """Spec 24.6: out_d = canonical_sum over s of wt_s * y_s[d], per token in rank order."""
    tokens, top_k, width = outputs.shape
    if tokens == 0:
        return torch.empty((0, width), dtype=torch.float32, device=outputs.device)
    weighted = weights[:, :, None] * outputs                                    # one multiply per term
    return module.sum(weighted.transpose(1, 2).reshape(-1, top_k).contiguous(), None).reshape(tokens, width)


def _forward(plan, x, router, gate, up, down):
    """(out [T_r, D], state): state keeps what the backward reads."""
    m = plan.module
    weights, chosen, probs = _route(plan, x, router)
    dispatch = _Dispatch(plan, chosen)
    received = dispatch.send(plan, x[dispatch.tokens], "token rows")
    computed = torch.empty_like(received)
    for e, rows in enumerate(dispatch.expert_rows):
        if rows.numel():
            _, _, act = _expert_forward(m, received[rows], gate[e], up[e])
            computed[rows] = m.linear(act, down[e], None)
    outputs = torch.empty((x.shape[0], plan.top_k, x.shape[1]), dtype=torch.float32, device=x.device)
    outputs[dispatch.tokens, dispatch.slots] = dispatch.back(plan, computed, "expert outputs")
    state = {"weights": weights, "chosen": chosen, "probs": probs, "outputs": outputs, "dispatch": dispatch,
             "received": received}
    return _combine(m, weights, outputs), state


def _router_grad(plan, x, d_logits):
    """Spec 29.2's dW of the router over all T tokens, [E, D], the same on every rank. Rank q computes the columns
    _column_range(D, W, q) from every token's dl (gathered) and those columns of every token's x (all_to_all); an
    all_gather returns the columns. Exact: each element of a block's product reads one column of dl and one of x."""
    world, width = plan.world, x.shape[1]
    columns = [_column_range(width, world, q) for q in range(world)]
    mine = columns[plan.rank][1] - columns[plan.rank][0]
    d_all = _all_to_all(plan, d_logits.repeat(world, 1), [x.shape[0]] * world, plan.rows, "router logit gradients")
    pieces = torch.cat([x[:, a:b].reshape(-1) for a, b in columns])
    got = _all_to_all(plan, pieces, [x.shape[0] * (b - a) for a, b in columns], [r * mine for r in plan.rows],
                      "x's columns")
    x_mine = torch.cat([part.reshape(r, mine) for part, r in zip(got.split([r * mine for r in plan.rows]), plan.rows)])
    widest = max(b - a for a, b in columns)
    share = torch.full((plan.experts, widest), -0.0, dtype=torch.float32, device=x.device)
    if mine and plan.total:                                       # else no column or no token: the fold's -0.0
        share[:, :mine] = _autograd.weight_grad(plan.module, x_mine.contiguous(), d_all.contiguous())
    shares = [torch.empty_like(share) for _ in range(world)]
    _distributed._collective(_OP, "all_gather of the router gradient's columns",
                             lambda: dist.all_gather(shares, share, group=plan.group))
    return torch.cat([s[:, :b - a] for s, (a, b) in zip(shares, columns)], dim=1)


def _backward(plan, state, g, x, router, gate, up, down):
    """Spec 29.7: (dx [T_r, D], drouter [E, D], dgate, dup, ddown [E/W, ...] of this rank's experts)."""
    m, k, width = plan.module, plan.top_k, x.shape[1]
    weights, dispatch, received = state["weights"], state["dispatch"], state["received"]
    tokens = x.shape[0]
    if tokens:
        d_weights = m.sum((g[:, None, :] * state["outputs"]).reshape(-1, width), None).reshape(tokens, k)   # dwt_s
        d_logits = _autograd._moe_router_grad(m, weights, state["chosen"], state["probs"], d_weights, plan.experts)
    else:
        d_logits = torch.empty((0, plan.experts), dtype=torch.float32, device=x.device)
    d_out = g[dispatch.tokens] * weights[dispatch.tokens, dispatch.slots][:, None]                     # dy_s
    d_received = dispatch.send(plan, d_out, "output gradients")
    terms_back = torch.empty((received.shape[0], 2, width), dtype=torch.float32, device=x.device)
    grads = [torch.full_like(w, -0.0) for w in (gate, up, down)]
    silu_backward = _autograd._backend_function(m, "silu_mul_backward")
    for e, rows in enumerate(dispatch.expert_rows):
        if not rows.numel():
            continue                                              # no token chose it: -0.0
        h, dy, positions = received[rows], d_received[rows], dispatch.positions[rows]
        z, u, act = _expert_forward(m, h, gate[e], up[e])
        da = m.linear(dy, down[e].t().contiguous(), None)
        dz, du = (t.reshape(z.shape) for t in silu_backward(z.reshape(-1), u.reshape(-1), da.reshape(-1)))
        terms_back[rows, 0] = m.linear(dz, gate[e].t().contiguous(), None)                                  # gz_s
        terms_back[rows, 1] = m.linear(du, up[e].t().contiguous(), None)                                    # gu_s
        grads[0][e] = _autograd.weight_grad(m, h, dz, positions, plan.total)
        grads[1][e] = _autograd.weight_grad(m, h, du, positions, plan.total)
        grads[2][e] = _autograd.weight_grad(m, act, dy, positions, plan.total)
    terms_home = dispatch.back(plan, terms_back, "dx terms")
    d_router = _router_grad(plan, x, d_logits)
    if not tokens:
        return torch.empty_like(x), d_router, *grads
    terms = torch.empty((tokens, 1 + 2 * k, width), dtype=torch.float32, device=x.device)
    terms[:, 0] = m.linear(d_logits, router.t().contiguous(), None)                                          # r
    terms[dispatch.tokens, 1 + 2 * dispatch.slots] = terms_home[:, 0]
    terms[dispatch.tokens, 2 + 2 * dispatch.slots] = terms_home[:, 1]
    dx = m.sum(terms.transpose(1, 2).reshape(-1, 1 + 2 * k).contiguous(), None).reshape(x.shape)
    return dx, d_router, *grads


class _ExpertParallelMoe(torch.autograd.Function):

    @staticmethod
    def forward(ctx, plan, x, router, gate, up, down):
        tensors = tuple(t.detach() for t in (x, router, gate, up, down))
        out, ctx.state = _forward(plan, *tensors)
        ctx.plan = plan
        ctx.save_for_backward(*tensors)
        return out

    @staticmethod
    def backward(ctx, g):
        """Every rank of the group must run it (it moves rows between ranks)."""
        _autograd._refuse_double_backward(_OP)
        return (None, *_backward(ctx.plan, ctx.state, _autograd._dense(g), *ctx.saved_tensors))


def moe(x, router, gate, up, down, k, *, norm_topk_prob=True, group=None, backend=None):
    """Spec 24.6's MoE block with experts over the ranks of group (spec 31.4): this rank's rows of
    bitparity.moe(X, router, GATE, UP, DOWN, k) on the global tokens X = cat of every rank's x in rank order, where
    GATE, UP, DOWN concatenate every rank's experts in rank order. The same bits at every group size.

    x [T_r, D]: this rank's tokens (any T_r >= 0); router [E, D]: replicated (the same bits on every rank, checked);
    gate, up [E/W, I, D] and down [E/W, D, I]: this rank's experts, expert_range(E, W, rank). Float inputs float32,
    bfloat16 or float16 (upcast exactly), result float32 [T_r, D]. Every rank of the group must call it with the
    same k, norm_topk_prob and backend; bad or mismatched arguments raise the same error on every rank.

    Differentiable in all five (spec 29.7); every rank must run the backward. x.grad is this rank's rows of the
    single-process dx; router.grad is the whole single-process router gradient on every rank (do not also fold it
    across this group); gate/up/down.grad are the single-process gradients of this rank's experts."""
    world, rank = _distributed._group_size(_OP, group)
    tensors = (x, router, gate, up, down)
    differentiable = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
    options = {"k": k, "norm_topk_prob": norm_topk_prob, "backend": backend, "differentiable (requires grad)":
               differentiable}
    table = _distributed._exchange(_OP, group, world, _description(tensors, options, backend))
    experts = _check_call(table, world)
    # k and norm_topk_prob agree on every rank (compared above), so these raise on every rank alike
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"{_NAME}: k must be an integer; got {type(k).__name__}")
    if not 1 <= k <= experts:
        raise ValueError(f"{_NAME}: k must be in [1, {experts}] (router's E experts); got {k}")
    if not isinstance(norm_topk_prob, bool):
        raise TypeError(f"{_NAME}: norm_topk_prob must be a bool; got {type(norm_topk_prob).__name__}")
    plan = _Plan(_resolve(backend, x.device), group, world, rank, int(k), norm_topk_prob,
                 [entry[0][0][2][0] for entry in table], experts)
    dense = [ops._dense(t.to(torch.float32)) for t in tensors]
    if differentiable:
        return _ExpertParallelMoe.apply(plan, *dense)
    return _forward(plan, *(t.detach() for t in dense))[0]
