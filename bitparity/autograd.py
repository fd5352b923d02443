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

MODEL_BLOCKS = ("linear", "rms_norm", "rotary", "attention", "silu_mul", "moe")

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
    if op in MODEL_BLOCKS:
        return NotImplementedError(
            f"bitparity.{op}: {argument} requires grad, but the backward of the model blocks (linear, rms_norm, "
            f"rotary, attention, silu_mul, moe) lands with 'Train through bitparity'; spec 26 covers the softmax "
            f"family and the RL losses. Call it under torch.no_grad() or on detached inputs until then.")
    return ValueError(f"bitparity.{op} is not differentiable: {argument} requires grad; {_NOT_DIFFERENTIABLE[op]}")


def refuse_grad(op, **tensors):
    """Raise no_backward_error if grad mode is on and one of the named tensors requires grad."""
    if torch.is_grad_enabled():
        for name, t in tensors.items():
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise no_backward_error(op, name)


def _dense(g):
    """Upstream gradients arrive in any layout (sum().backward() gives a stride-0 expand); backends read dense float32."""
    return g.to(torch.float32).contiguous()


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
        if torch.is_grad_enabled():
            raise RuntimeError(f"bitparity.{ctx.op}: double backward (create_graph=True) is not supported; "
                               f"spec 26 defines first derivatives only")
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
