"""Gradients through the canonical ops (spec 26): one torch.autograd.Function for every backend call.

ops.py validates and normalises inputs, then calls a backend through `call`. When grad mode is on and a
tensor argument requires grad, the call becomes a `_BackendNode`: its forward runs the backend op on
detached inputs (so the numpy backend can read them), and its backward runs the same backend's
`<op>_backward` (docs/backend-contract.md), which computes spec 26's bits. Ops whose gradient is pure
data movement (`sum`, `exp`'s one multiply, `topk`'s placement) do it here with torch, exactly, for every
backend. The `native` backend is torch's own ops and keeps torch's own autograd.

Why a torch.autograd.Function rather than torch.library.custom_op + register_autograd: the backend
calls take Python values that are not tensors (a kind string, optional clamps, a scale) and return
tuples with non-differentiable members; custom_op would need a schema, a fake kernel and a registration
per op and per backend, for no gain in eager training, which is what bitparity's ops serve today.
docs/autograd.md says more.
"""

import torch

# The public name of each positional argument of a backend call, for error messages.
ARGUMENTS = {
    "sum": ("x", "mask"),
    "logsumexp": ("x", "mask", "temperature"),
    "log_softmax": ("x", "mask", "temperature"),
    "softmax": ("x", "mask", "temperature"),
    "entropy": ("logits", "mask", "temperature"),
    "token_logprobs": ("logits", "tokens", "temperature"),
    "exp": ("x",),
    "log": ("x",),
    "masked_mean": ("x", "mask"),
    "masked_whiten": ("x", "mask", "shift_mean", "unbiased", "eps", "eps_mode"),
    "kl_penalty": ("logp", "ref_logp", "kind", "clamp", "log_ratio_clamp"),
    "gae": ("rewards", "values", "mask", "bootstrap", "gamma", "gamma_lambda", "mask_mode"),
    "ppo_policy_loss": ("logp", "old_logp", "advantages", "mask", "clip_low", "clip_high", "dual_clip",
                        "ratio_clamp", "agg"),
    "topk": ("x", "k"),
    "filter_logits": ("logits", "temperature", "top_k", "top_p", "min_p"),
    "sample": ("logits", "temperature", "top_k", "top_p", "min_p", "greedy", "seeds", "positions"),
    "linear": ("x", "weight", "bias"),
    "rms_norm": ("x", "weight", "eps"),
    "rotary": ("x", "cos", "sin"),
    "attention": ("q", "k", "v", "kv_lengths", "causal", "scale"),
    "silu_mul": ("gate", "up"),
}

# Why an op has no backward, for the ops that are not model blocks.
_NOT_DIFFERENTIABLE = {
    "log": "its derivative 1/x needs a general reciprocal, which spec 26 does not define; for "
           "log-probabilities use log_softmax or token_logprobs, which are differentiable",
    "gae": "advantages and returns are regression targets (verl, TRL and OpenRLHF compute them under "
           "torch.no_grad()); pass rewards.detach() and values.detach()",
    "filter_logits": "filtering selects tokens; recompute differentiable log-probabilities with token_logprobs",
    "sample": "sampling is not differentiable; recompute differentiable log-probabilities with token_logprobs",
    "beam_search_step": "beam search selects candidates; recompute differentiable log-probabilities with "
                        "token_logprobs",
    "rollout_correction": "its weights are constants of the loss (verl, TRL and OpenRLHF detach them); pass "
                          "old_logp.detach() and rollout_logp.detach()",
}


def no_backward_error(op, argument):
    """The error for a tensor that requires grad reaching an op without a backward."""
    return ValueError(f"bitparity.{op} is not differentiable: {argument} requires grad; {_NOT_DIFFERENTIABLE[op]}")


def _backend_function(module, name):
    """module.name, or a NotImplementedError naming the backend when it lacks a spec 29 backward."""
    function = getattr(module, name, None)
    if function is None:
        raise NotImplementedError(f"the {module.NAME} backend has no {name} (spec 29) yet; train on a backend "
                                  f"that has it")
    return function


def refuse_grad(op, **tensors):
    """Raise no_backward_error if grad mode is on and one of the named tensors requires grad."""
    if torch.is_grad_enabled():
        for name, t in tensors.items():
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise no_backward_error(op, name)


def _dense(g):
    """Upstream gradients arrive in any layout (sum().backward() gives a stride-0 expand); backends read dense
    float32."""
    return g.to(torch.float32).contiguous()


def _refuse_double_backward(op):
    """A backward under create_graph=True would compute with backend kernels outside the graph: refuse it."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"bitparity.{op}: double backward (create_graph=True) is not supported; "
                           f"spec 26 defines first derivatives only")


# -- Backward rules: (module, args, outputs, grads, needs) -> one gradient (or None) per argument -------------

def _sum(module, args, outs, grads, needs):
    x, mask = args
    g = grads[0][:, None].expand(x.shape)
    return (g.clone() if mask is None else torch.where(mask, g, 0.0)), None


def _from_inputs(op):
    """Softmax-family ops whose backward reads x: logsumexp, token_logprobs (spec 26.2, 26.6)."""
    def rule(module, args, outs, grads, needs):
        x, other, scale = args
        return getattr(module, f"{op}_backward")(x, other, scale, _dense(grads[0])), None, None
    return rule


def _from_output(op):
    """log_softmax and softmax: their backward reads the forward's output (spec 26.3, 26.4)."""
    def rule(module, args, outs, grads, needs):
        _, mask, scale = args
        return getattr(module, f"{op}_backward")(outs[0], mask, scale, _dense(grads[0])), None, None
    return rule


def _entropy(module, args, outs, grads, needs):
    x, mask, scale = args
    return module.entropy_backward(x, mask, scale, outs[0], _dense(grads[0])), None, None


def _exp(module, args, outs, grads, needs):
    return (grads[0] * outs[0],)      # spec 26.11: one multiply


def _masked_mean(module, args, outs, grads, needs):
    return module.masked_mean_backward(args[1], _dense(grads[0])), None


def _masked_whiten(module, args, outs, grads, needs):
    return (module.masked_whiten_backward(*args, _dense(grads[0])),) + (None,) * 5


def _kl_penalty(module, args, outs, grads, needs):
    d_ref = module.kl_penalty_backward(*args, _dense(grads[0]))
    return (torch.neg(d_ref) if needs[0] else None), (d_ref if needs[1] else None), None, None, None


def _ppo_policy_loss(module, args, outs, grads, needs):
    g = _dense(grads[0]).reshape(1)       # the clip fraction (grads[1]) is not differentiable
    return (module.ppo_policy_loss_backward(*args, g),) + (None,) * 8


def _topk(module, args, outs, grads, needs):
    x, _ = args
    return torch.zeros_like(x).scatter_(1, outs[1], grads[0]), None


# -- The model blocks (spec 29) ------------------------------------------------------

def _rows(n, device):
    return torch.arange(n, dtype=torch.int64, device=device)


def weight_grad(module, x, g, positions=None, rows=None):
    """Spec 29.2: dW over blocks of spec.LINEAR_GRAD_BLOCK rows (at positions, default 0 ... M-1), each block's
    exact product rounded once, the blocks row-folded (spec 29.1)."""
    if positions is None:
        positions, rows = _rows(x.shape[0], x.device), x.shape[0]
    return _backend_function(module, "weight_grad")(x, g, positions, rows)


def row_fold(module, c):
    """Spec 29.1: the row fold of c [R, F] over its rows -> [F]."""
    n = c.shape[0]
    zeros = torch.zeros(n, dtype=torch.int64, device=c.device)
    return _backend_function(module, "fold_rows")(c, zeros, _rows(n, c.device), n, 1)[0]


def _linear(module, args, outs, grads, needs):
    x, weight, bias = args
    g = _dense(grads[0])
    dx = module.linear(g, weight.t().contiguous(), None) if needs[0] else None
    dw = weight_grad(module, x, g) if needs[1] else None
    # spec 29.2: db is dW's block rule with x a column of ones (which quantises exactly)
    ones = torch.ones((x.shape[0], 1), dtype=torch.float32, device=x.device)
    db = weight_grad(module, ones, g)[:, 0] if bias is not None and needs[2] else None
    return dx, dw, db


def _rms_norm(module, args, outs, grads, needs):
    x, weight, eps = args
    dx, terms = _backend_function(module, "rms_norm_backward")(x, weight, eps, _dense(grads[0]))
    return dx, (row_fold(module, terms) if needs[1] else None), None


def _rotary(module, args, outs, grads, needs):
    _, cos, sin = args
    return module.rotary(_dense(grads[0]), cos, torch.neg(sin)), None, None      # spec 29.4: exact negation


def _attention(module, args, outs, grads, needs):
    return (*_backend_function(module, "attention_backward")(*args, _dense(grads[0])), None, None, None)


def _silu_mul(module, args, outs, grads, needs):
    return _backend_function(module, "silu_mul_backward")(*args, _dense(grads[0]))


RULES = {
    "sum": (_sum, ("x",)),
    "logsumexp": (_from_inputs("logsumexp"), ("x",)),
    "log_softmax": (_from_output("log_softmax"), ("x",)),
    "softmax": (_from_output("softmax"), ("x",)),
    "entropy": (_entropy, ("logits",)),
    "token_logprobs": (_from_inputs("token_logprobs"), ("logits",)),
    "exp": (_exp, ("x",)),
    "masked_mean": (_masked_mean, ("x",)),
    "masked_whiten": (_masked_whiten, ("x",)),
    "kl_penalty": (_kl_penalty, ("logp", "ref_logp")),
    "ppo_policy_loss": (_ppo_policy_loss, ("logp",)),
    "topk": (_topk, ("x",)),
    "linear": (_linear, ("x", "weight", "bias")),
    "rms_norm": (_rms_norm, ("x", "weight")),
    "rotary": (_rotary, ("x",)),
    "attention": (_attention, ("q", "k", "v")),
    "silu_mul": (_silu_mul, ("gate", "up")),
}


class _BackendNode(torch.autograd.Function):
    """One backend call in the autograd graph; its backward is the same backend's spec 26 backward."""

    @staticmethod
    def forward(ctx, op, module, *args):
        result = getattr(module, op)(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
        outs = result if isinstance(result, tuple) else (result,)
        ctx.op, ctx.module = op, module
        ctx.is_tensor = [isinstance(a, torch.Tensor) for a in args]
        ctx.constants = [None if t else a for a, t in zip(args, ctx.is_tensor)]
        ctx.save_for_backward(*(a for a in args if isinstance(a, torch.Tensor)), *outs)
        # topk's indices and the PPO clip fraction carry no gradient.
        ctx.mark_non_differentiable(*outs[1:])
        return result

    @staticmethod
    def backward(ctx, *grads):
        _refuse_double_backward(ctx.op)
        saved = iter(ctx.saved_tensors)
        args = [next(saved) if t else c for t, c in zip(ctx.is_tensor, ctx.constants)]
        outs = list(saved)
        rule, _ = RULES[ctx.op]
        return (None, None, *rule(ctx.module, args, outs, grads, ctx.needs_input_grad[2:]))


def call(op, module, args):
    """module.op(*args), as an autograd node when grad mode is on and a tensor argument requires grad."""
    wanted = [(name, a) for name, a in zip(ARGUMENTS[op], args)
              if isinstance(a, torch.Tensor) and a.requires_grad]
    if not wanted or not torch.is_grad_enabled() or module.NAME == "native":
        return getattr(module, op)(*args)
    if op not in RULES:
        raise no_backward_error(op, wanted[0][0])
    differentiable = RULES[op][1]
    for name, _ in wanted:
        if name not in differentiable:
            raise ValueError(f"bitparity.{op}: {name} requires grad but is not differentiable "
                             f"(differentiable: {', '.join(differentiable)}); pass {name}.detach()")
    return _BackendNode.apply(op, module, *args)


# -- Composite ops: the token embedding and moe (spec 29.7, 29.8) ---------------------

class _Embedding(torch.autograd.Function):
    """h = weight[tokens], an exact gather (then exactly upcast); dweight[v] = the row fold of the rows whose token
    is v (spec 29.8), rounded once to weight's dtype (as the upcast's own backward would)."""

    @staticmethod
    def forward(ctx, module, tokens, weight):
        ctx.module, ctx.vocab, ctx.dtype = module, weight.shape[0], weight.dtype
        ctx.save_for_backward(tokens)
        return weight.detach()[tokens].to(torch.float32)

    @staticmethod
    def backward(ctx, g):
        _refuse_double_backward("embedding")
        (tokens,) = ctx.saved_tensors
        g = _dense(g)
        fold = _backend_function(ctx.module, "fold_rows")
        grad = fold(g, tokens, _rows(tokens.shape[0], g.device), tokens.shape[0], ctx.vocab)
        return None, None, grad.to(ctx.dtype)


def embedding(module, tokens, weight):
    """tokens int64 [M] (checked by ops.py), weight float [V, D] dense (float32, bfloat16 or float16) -> float32
    [M, D], differentiable in weight. The rows are gathered before the upcast: no float32 copy of the table."""
    if torch.is_grad_enabled() and weight.requires_grad and module.NAME != "native":
        return _Embedding.apply(module, tokens, weight)
    return weight[tokens].to(torch.float32)


def _moe_routing(module, x, router, top_k, norm_topk_prob):
    """Spec 24.6's router: (weights [M, k], chosen [M, k], probs [M, E] or None). The top_k experts by router logit;
    with norm_topk_prob their weights are the softmax over the chosen logits (probs None), without it the softmax
    over all E logits (probs) taken at the chosen experts."""
    logits = module.linear(x, router, None)                                        # [M, E]
    top_logits, chosen = module.topk(logits, top_k)                                # [M, k], rank order
    ones = torch.ones(x.shape[0], dtype=torch.float32, device=x.device)
    if norm_topk_prob:
        return module.softmax(top_logits.contiguous(), None, ones), chosen, None   # [M, k]
    probs = module.softmax(logits.contiguous(), None, ones)                        # [M, E]
    return probs.gather(1, chosen), chosen, probs


def _moe_forward(module, x, router, gate, up, down, top_k, norm_topk_prob):
    """Spec 24.6, keeping what the backward reads: (out [M, D], weights [M, k], chosen [M, k], per-expert
    (token, slot, h, z, u, act) for the experts with tokens, outputs [M, k, D], probs [M, E] or None)."""
    weights, chosen, probs = _moe_routing(module, x, router, top_k, norm_topk_prob)
    outputs = torch.empty(x.shape[0], top_k, x.shape[1], dtype=torch.float32, device=x.device)   # [M, k, D]
    routed = {}
    for e in range(router.shape[0]):
        token, slot = torch.nonzero(chosen == e, as_tuple=True)                    # token ascending
        if token.numel() == 0:
            continue
        h = x[token]
        z, u = module.linear(h, gate[e], None), module.linear(h, up[e], None)
        act = module.silu_mul(z.reshape(-1), u.reshape(-1)).reshape(z.shape)
        outputs[token, slot] = module.linear(act, down[e], None)
        routed[e] = (token, slot, h, z, u, act)
    weighted = weights[:, :, None] * outputs                                       # one multiply per term
    out = module.sum(weighted.transpose(1, 2).reshape(-1, top_k).contiguous(), None).reshape(x.shape)
    return out, weights, chosen, routed, outputs, probs


def _moe_router_grad(module, weights, chosen, probs, d_weights, experts):
    """Spec 29.7's dl [M, E] from dwt [M, k]: with the top-k softmax (probs None), spec 26.4 over the k chosen
    logits placed at the chosen experts (+0.0 elsewhere); with the softmax over all experts, dwt placed at the
    chosen experts (+0.0 elsewhere) and the backend's spec 26.4 over all E."""
    tokens = weights.shape[0]
    placed = torch.zeros(tokens, experts, dtype=torch.float32, device=weights.device)
    if probs is None:
        big_g = module.sum((d_weights * weights).contiguous(), None)                              # G
        return placed.scatter_(1, chosen, weights * (d_weights - big_g[:, None]))                 # dlt_s placed
    ones = torch.ones(tokens, dtype=torch.float32, device=weights.device)
    return module.softmax_backward(probs, None, ones, placed.scatter_(1, chosen, d_weights))      # dp -> dl


class _Moe(torch.autograd.Function):

    @staticmethod
    def forward(ctx, module, top_k, norm_topk_prob, x, router, gate, up, down):
        ctx.module, ctx.top_k, ctx.norm_topk_prob = module, top_k, norm_topk_prob
        ctx.save_for_backward(x, router, gate, up, down)
        return _moe_forward(module, x.detach(), router.detach(), gate.detach(), up.detach(), down.detach(), top_k,
                            norm_topk_prob)[0]

    @staticmethod
    def backward(ctx, g):
        """Spec 29.7, every step a backend op on the forward's recomputed bits or exact data movement."""
        _refuse_double_backward("moe")
        m = ctx.module
        x, router, gate, up, down = ctx.saved_tensors
        g = _dense(g)
        tokens, width = x.shape
        _, weights, chosen, routed, outputs, probs = _moe_forward(m, x, router, gate, up, down, ctx.top_k,
                                                                  ctx.norm_topk_prob)
        k = ctx.top_k
        d_weights = m.sum((g[:, None, :] * outputs).reshape(-1, width), None).reshape(tokens, k)    # dwt_s
        d_logits = _moe_router_grad(m, weights, chosen, probs, d_weights, router.shape[0])        # dl
        d_outputs = g[:, None, :] * weights[:, :, None]                                           # dy_s
        terms = torch.empty(tokens, 1 + 2 * k, width, dtype=torch.float32, device=x.device)
        terms[:, 0] = m.linear(d_logits, router.t().contiguous(), None)                           # r
        grads = [weight_grad(m, x, d_logits)] + [torch.full_like(w, -0.0) for w in (gate, up, down)]
        silu_backward = _backend_function(m, "silu_mul_backward")
        for e, (token, slot, h, z, u, act) in routed.items():
            dy = d_outputs[token, slot].contiguous()
            da = m.linear(dy, down[e].t().contiguous(), None)
            dz, du = (t.reshape(z.shape) for t in silu_backward(z.reshape(-1), u.reshape(-1), da.reshape(-1)))
            terms[token, 1 + 2 * slot] = m.linear(dz, gate[e].t().contiguous(), None)
            terms[token, 2 + 2 * slot] = m.linear(du, up[e].t().contiguous(), None)
            grads[1][e] = weight_grad(m, h, dz, token, tokens)
            grads[2][e] = weight_grad(m, h, du, token, tokens)
            grads[3][e] = weight_grad(m, act, dy, token, tokens)
        dx = m.sum(terms.transpose(1, 2).reshape(-1, 1 + 2 * k).contiguous(), None).reshape(x.shape)
        return (None, None, None, dx, *grads)


def moe(module, x, router, gate, up, down, top_k, norm_topk_prob=True):
    """Spec 24.6's block on dense float32 inputs, differentiable in all five tensors (spec 29.7). norm_topk_prob
    (checked by ops.py): the weights are the softmax over the top_k chosen logits (True) or the softmax over all
    experts taken at the chosen ones (False)."""
    tensors = (x, router, gate, up, down)
    if module.NAME == "native":                                  # torch's own autograd through torch's ops
        return _moe_forward(module, *tensors, top_k, norm_topk_prob)[0]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _Moe.apply(module, top_k, norm_topk_prob, *tensors)
    return _moe_forward(module, *(t.detach() for t in tensors), top_k, norm_topk_prob)[0]
