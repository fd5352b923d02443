"""Gradients (spec 26): every canonical backend gives the numpy backend's bits through the public API and autograd.

The numpy gradients are computed once per case; each backend is compared with them bit for bit (NaN
canonicalised). Negative controls show the cases can tell orders apart: torch's own autograd and a
gradient whose row sum is torch's instead of spec 3's both fail the comparison.
"""

import functools

import numpy as np
import pytest
import torch

import bitparity as bp
from bitparity.reference import canonical

from .test_rl_bit_identity import assert_same_bits

SOFTMAX_OPS = ("logsumexp", "log_softmax", "softmax", "entropy", "token_logprobs")
# (rows, vocabulary): one element, short rows, one lane block plus one, two segments, Qwen's vocabulary.
SHAPES = ((1, 1), (3, 7), (6, 1000), (4, 1025), (2, 16385), (1, 151936))
TEMPERATURES = (1.0, 0.7, "per-row")


@functools.cache
def logits(rows, n):
    """Random rows with the special rows of spec 9 mixed in: -inf entries, a NaN, a +inf, a dominant token, ties."""
    rng = np.random.default_rng(rows * 31 + n)
    x = (rng.standard_normal((rows, n)) * 4).astype(np.float32)
    specials = [lambda r: r.__setitem__(slice(0, n, 3), -np.inf), lambda r: r.__setitem__(n // 2, 80.0),
                lambda r: r.__setitem__(n - 1, np.nan), lambda r: r.__setitem__(0, np.inf),
                lambda r: r.__setitem__(slice(None), 1.5)]
    for i in range(1, rows):
        specials[(i - 1) % len(specials)](x[i])
    mask = rng.random((rows, n)) < 0.8
    mask[-1] = False if rows > 2 else mask[-1]                    # a fully masked row
    return torch.from_numpy(x), torch.from_numpy(mask)


def _temperature(t, rows):
    return torch.linspace(0.5, 2.0, rows) if t == "per-row" else t


def softmax_gradient(op, backend, rows, n, temperature, masked, dtype=torch.float32):
    x, mask = logits(rows, n)
    x = x.to(dtype).clone().requires_grad_()
    g_shape = (rows, n) if op in ("log_softmax", "softmax") else (rows,)
    g = torch.randn(g_shape, generator=torch.Generator().manual_seed(rows + n))
    t = _temperature(temperature, rows)
    if op == "token_logprobs":
        tokens = torch.randint(0, n, (rows,), generator=torch.Generator().manual_seed(n))
        y = bp.token_logprobs(x, tokens, t, backend=backend)
    else:
        y = getattr(bp, op)(x, mask if masked else None, t, backend=backend)
    if op == "log_softmax" and masked:
        g = torch.where(mask, g, 0.0)        # no upstream gradient where the output is -inf by the mask
    (dx,) = torch.autograd.grad(y, x, g)
    return dx


@functools.cache
def reference_softmax_gradient(op, rows, n, temperature, masked, dtype=torch.float32):
    return softmax_gradient(op, "numpy", rows, n, temperature, masked, dtype)


# The full vocabulary runs for log_softmax and token_logprobs, what a trainer differentiates at that size; the other
# ops share their kernels' row statistics and are covered up to two segments.
SOFTMAX_CASES = [(op, rows, n) for op in SOFTMAX_OPS for rows, n in SHAPES
                 if n < 151936 or op in ("log_softmax", "token_logprobs")]


@pytest.mark.parametrize("op,rows,n", SOFTMAX_CASES, ids=str)
def test_softmax_family_gradients_match_numpy(backend, op, rows, n):
    for temperature in TEMPERATURES if n < 16385 else (0.7,):
        for masked in (False, True) if op != "token_logprobs" else (False,):
            assert_same_bits(softmax_gradient(op, backend, rows, n, temperature, masked),
                             reference_softmax_gradient(op, rows, n, temperature, masked))


def test_bf16_logits_give_the_same_gradient_bits(backend):
    """bf16 logits are widened exactly; their gradient is the float32 one rounded to bf16 by torch's own cast."""
    for op in ("log_softmax", "token_logprobs"):
        got = softmax_gradient(op, backend, 6, 1000, 0.7, False, torch.bfloat16)
        assert got.dtype == torch.bfloat16
        assert_same_bits(got.float(), reference_softmax_gradient(op, 6, 1000, 0.7, False, torch.bfloat16).float())


@functools.cache
def rl_inputs(b, t):
    rng = np.random.default_rng(b * 13 + t)
    logp = -np.abs(rng.standard_normal((b, t))).astype(np.float32)
    old = (logp + rng.standard_normal((b, t)).astype(np.float32) * 0.4).astype(np.float32)
    old[0, : min(t, 4)] = logp[0, : min(t, 4)] - np.float32(20.0)       # log-ratio exactly on the +20 clamp and past it
    adv = rng.standard_normal((b, t)).astype(np.float32)
    mask = rng.random((b, t)) < 0.75
    mask[-1] = False                                                       # an empty sequence
    return [torch.from_numpy(a) for a in (logp, old, adv, mask)]


RL_SHAPES = ((1, 1), (4, 33), (8, 1025), (2, 20000))


def rl_gradients(backend, b, t):
    """Every differentiable RL op and option on one batch -> the list of gradients, in a fixed order."""
    logp0, old, adv, mask = rl_inputs(b, t)
    out = []

    def grad_of(fn, *inputs):
        inputs = [i.clone().requires_grad_() for i in inputs]
        y = fn(*inputs)
        out.extend(torch.autograd.grad(y, inputs, torch.randn(y.shape, generator=torch.Generator().manual_seed(7))))

    grad_of(lambda x: bp.masked_mean(x, mask, backend=backend), adv)
    grad_of(lambda x: bp.masked_mean(x, mask, 1, backend=backend), adv)
    for shift_mean in (True, False):
        for unbiased, eps_mode, scale in ((True, "add", 1.0), (False, "add", 1.0), (False, "clamp", 1e-5)):
            # At scale 1e-5 the variance (~1e-10) is below eps, where "clamp" holds it constant.
            grad_of(lambda x: bp.masked_whiten(x * scale, mask, shift_mean=shift_mean, unbiased=unbiased,
                                               eps_mode=eps_mode, backend=backend), adv)
    for kind in bp.ops.KL_KINDS:
        for clamp, ratio_clamp in ((None, None), (0.5, None), (None, 20.0), (10.0, 0.3)):
            grad_of(lambda lp, ref: bp.kl_penalty(lp, ref, kind, clamp=clamp, log_ratio_clamp=ratio_clamp,
                                                  backend=backend), logp0, old)
    for agg in bp.ops.PPO_AGGS:
        for dual_clip, ratio_clamp in ((None, 20.0), (3.0, 20.0), (3.0, None)):
            grad_of(lambda lp: bp.ppo_policy_loss(lp, old, adv, mask, dual_clip=dual_clip, ratio_clamp=ratio_clamp,
                                                  agg=agg, backend=backend)[0], logp0)
    return out


@functools.cache
def reference_rl_gradients(b, t):
    return rl_gradients("numpy", b, t)


@pytest.mark.parametrize("b,t", RL_SHAPES, ids=str)
def test_rl_loss_gradients_match_numpy(backend, b, t):
    for got, want in zip(rl_gradients(backend, b, t), reference_rl_gradients(b, t), strict=True):
        assert_same_bits(got, want)


def test_kl_clamp_edges_take_the_stated_subgradient():
    """spec 26.9: a value on a clamp bound passes its gradient, one past it does not; abs has 0 at d = 0."""
    logp = torch.zeros(4, requires_grad=True)
    ref = torch.tensor([0.5, 0.75, 0.0, -0.5])
    (g,) = torch.autograd.grad(bp.kl_penalty(logp, ref, "k1", log_ratio_clamp=0.5, backend="numpy").sum(), logp)
    assert g.tolist() == [1.0, 0.0, 1.0, 1.0]
    (g,) = torch.autograd.grad(bp.kl_penalty(logp, ref, "abs", backend="numpy").sum(), logp)
    assert g.tolist() == [-1.0, -1.0, 0.0, 1.0]


def test_native_autograd_is_a_negative_control():
    """torch's own autograd on the same case does not give the canonical bits, so the comparison can fail."""
    with pytest.raises(AssertionError, match="differ"):
        assert_same_bits(softmax_gradient("log_softmax", "native", 6, 1000, 0.7, False),
                         reference_softmax_gradient("log_softmax", 6, 1000, 0.7, False))


def test_a_reordered_row_sum_is_a_negative_control():
    """The log_softmax gradient with G summed in torch's order instead of spec 3's fails the comparison."""
    x, _ = logits(6, 1000)
    g = torch.randn(6, 1000, generator=torch.Generator().manual_seed(1006))
    y = bp.log_softmax(x, backend="numpy").numpy()
    reordered = (g.numpy() - canonical.exp(y) * g.sum(dim=1, keepdim=True).numpy()) * np.float32(1.0)
    with pytest.raises(AssertionError, match="differ"):
        assert_same_bits(torch.from_numpy(reordered), softmax_gradient("log_softmax", "numpy", 6, 1000, 1.0, False))
