"""The model building blocks (spec 24): accuracy of the canonical order against float64, and the batch
properties the order exists for (row and token independence, decode == prefill, moe's tie rule).

Accuracy is measured in float32 ulps of a floor, the scale each result is conditioned by (spec 10).
The properties run through ops.py on the numpy reference and the cpu backend: every canonical
backend must have them, and test_model_ops_bit_identity.py ties the others to these two bit for bit.
"""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from bitparity import ops
from bitparity.compare import metrics
from bitparity.reference import canonical, float64

from .test_canonical import sum_depth

F32 = np.float32
BACKENDS = ("numpy", "cpu")


def _randn(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F32)


def _bits(t):
    return metrics.canonical_bits(t)


# -- accuracy against float64 ------------------------------------------------------

@pytest.mark.parametrize("k", [1, 7, 64, 1100, 20000])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_within_the_sum_bound(k, with_bias):
    # Each product rounds once (within u |x_k w_k|, u = 2^-24: together u F, under one ulp of the floor
    # F = sum_k |x_k w_k| (+ |b|)), the canonical sum adds at most depth(K) ulps of F (spec 10.1), and a bias
    # one more rounding of a result no larger than F: at most depth(K) + 1 (+ 1 with a bias) ulps of F, analytic.
    rng = np.random.default_rng([k, with_bias])
    x = _randn(rng, 4, k) * np.exp(rng.uniform(-5, 5, (4, k))).astype(F32)     # mixed magnitudes and signs
    w = _randn(rng, 8, k)
    b = _randn(rng, 8, scale=10.0) if with_bias else None
    got = canonical.linear(x, w, b)
    ref, floor = float64.linear(x, w, b), float64.linear_magnitude(x, w, b)
    bound = sum_depth(k) + 1 + with_bias
    assert metrics.max_or_zero(metrics.ulp_error(got, ref, floor)) <= bound


@pytest.mark.parametrize("d", [8, 64, 1100, 20000])
def test_rms_norm_within_three_and_a_half_ulps(d):
    # x * rsqrt(ms + eps) * w: rsqrt is within 2 ulps (spec 15.2); the mean square's relative error (the sum's
    # depth(D) half-ulps on terms of one sign, and the reciprocal's half ulp) enters halved through the square
    # root; the two multiplies add half an ulp each. Measured at most 2.84 ulps (D = 1100, rows at scale 3);
    # the bound keeps the spec's half-ulp-plus headroom over that.
    rng = np.random.default_rng(d)
    x, w, eps = _randn(rng, 16, d, scale=3.0), _randn(rng, d), F32(1e-6)
    ref = float64.rms_norm(x, w, eps)
    assert metrics.max_or_zero(metrics.ulp_error(canonical.rms_norm(x, w, eps), ref)) <= 3.5


def test_silu_mul_within_four_ulps():
    # exp (1 ulp), 1 + e and the reciprocal (half an ulp each), e * r for g < 0, g * sigmoid and * up (half an ulp
    # each): 3.5 ulps to first order; measured 3.41 over 3e5 gates in [-80, 80] and N(0, 8^2).
    rng = np.random.default_rng(5)
    g = np.concatenate([_randn(rng, 200000, scale=8.0), rng.uniform(-80, 80, 100000).astype(F32)])
    u = _randn(rng, g.size)
    err = metrics.ulp_error(canonical.silu_mul(g, u), float64.silu_mul(g, u), np.finfo(F32).tiny)   # floor: no subnormal ulps
    assert metrics.max_or_zero(err) <= 4.0


def test_rotary_within_two_ulps_of_its_terms():
    # y = a - b with a = RN(x1 cos), b = RN(x2 sin), each rounding within u |value| (u = 2^-24): |error| <=
    # u (|a| + |b|) + u |a - b| <= 2 u F, F = |x1 cos| + |x2 sin|, and an ulp of F is more than u F, so at most
    # 2 ulps of F: analytic, cancellation included. Measured 1.22.
    rng = np.random.default_rng(6)
    x = _randn(rng, 64, 128)
    angles = rng.uniform(0, 1000, (64, 64))
    cos, sin = np.cos(angles).astype(F32), np.sin(angles).astype(F32)
    ref, floor = float64.rotary(x, cos, sin), float64.rotary_magnitude(x, cos, sin)
    assert metrics.max_or_zero(metrics.ulp_error(canonical.rotary(x, cos, sin), ref, floor)) <= 2.0


@pytest.mark.parametrize("g,t,d", [(8, 48, 16), (4, 300, 64), (2, 1100, 8)])
def test_attention_within_five_ulps_of_the_weighted_magnitude(g, t, d):
    # Floor: sum_j p_j |v_j|, the scale of the output's sum. Each score has an absolute error of about
    # (depth(D) + 0.5) u sum_d |q_d k_d| * scale, which perturbs each p_j relatively by up to twice that; the
    # softmax adds its 2.5 ulps (spec 10) and the value sum depth(Tk) + 0.5 ulps of the floor. Measured at most
    # 3.66 ulps on these shapes (causal, unit normal q, k, v); the bound is the measurement plus headroom.
    rng = np.random.default_rng([g, t, d])
    q, k, v = _randn(rng, g, t, d), _randn(rng, g, t, d), _randn(rng, g, t, d)
    lengths = np.full(g, t)
    scale = float(F32(1.0 / np.sqrt(d)))
    got = canonical.attention(q, k, v, lengths, True, scale)
    ref = float64.attention(q, k, v, lengths, True, scale)
    floor = float64.attention_magnitude(q, k, v, lengths, True, scale)
    assert metrics.max_or_zero(metrics.ulp_error(got, ref, floor)) <= 5.0


# -- batch properties ------------------------------------------------------------------

def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


@pytest.mark.parametrize("backend", BACKENDS)
@given(st.integers(1, 12), st.integers(1, 80), st.integers(1, 20), st.randoms(use_true_random=False))
def test_linear_rows_are_independent(backend, m, k, n, rnd):
    # Any reordering or subset of the rows gives each row the bits it had in the full call.
    rng = np.random.default_rng(rnd.getrandbits(32))
    x, w, b = _t(_randn(rng, m, k)), _t(_randn(rng, n, k)), _t(_randn(rng, n))
    full = ops.linear(x, w, b, backend=backend)
    rows = torch.from_numpy(rng.permutation(m)[:rng.integers(1, m + 1)])
    assert torch.equal(_bits(ops.linear(x[rows], w, b, backend=backend)), _bits(full[rows]))


@pytest.mark.parametrize("backend", BACKENDS)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(1, 20), st.sampled_from([1, 4, 16, 24]),
       st.integers(0, 5), st.randoms(use_true_random=False))
def test_attention_decode_step_equals_prefill(backend, batch, heads, t, d, pad, rnd):
    # Query i of a causal prefill over each batch row's first L_b tokens has the bits of a one-token step
    # against a cache of t + pad slots holding those i + 1 keys and garbage (NaN) after them (spec 24.4).
    rng = np.random.default_rng(rnd.getrandbits(32))
    q, k, v = (_t(_randn(rng, batch, heads, t, d)) for _ in range(3))
    lengths = torch.from_numpy(rng.integers(1, t + 1, batch))
    prefill = ops.attention(q, k, v, kv_lengths=lengths, backend=backend)
    garbage = torch.full((batch, heads, pad, d), float("nan"))
    cache_k, cache_v = torch.cat([k, garbage], dim=2), torch.cat([v, garbage], dim=2)
    i = int(rng.integers(0, int(lengths.min())))
    step = ops.attention(q[:, :, i:i + 1], cache_k, cache_v, kv_lengths=torch.full((batch,), i + 1),
                         backend=backend)
    assert torch.equal(_bits(step), _bits(prefill[:, :, i:i + 1]))


def _moe_weights(rng, experts, d, inter):
    return (_t(_randn(rng, experts, d)), _t(_randn(rng, experts, inter, d, scale=0.3)),
            _t(_randn(rng, experts, inter, d, scale=0.3)), _t(_randn(rng, experts, d, inter, scale=0.3)))


@pytest.mark.parametrize("backend", BACKENDS)
@given(st.integers(2, 10), st.integers(1, 6), st.randoms(use_true_random=False))
def test_moe_is_invariant_to_permuting_and_splitting_the_tokens(backend, m, experts, rnd):
    # A token's output depends on that token only: how tokens are grouped per expert changes no bit.
    rng = np.random.default_rng(rnd.getrandbits(32))
    weights = _moe_weights(rng, experts, 12, 5)
    top_k = int(rng.integers(1, experts + 1))
    x = _t(_randn(rng, m, 12))
    full = ops.moe(x, *weights, top_k, backend=backend)
    perm = torch.from_numpy(rng.permutation(m))
    assert torch.equal(_bits(ops.moe(x[perm], *weights, top_k, backend=backend)), _bits(full[perm]))
    cut = int(rng.integers(1, m))
    parts = [ops.moe(x[:cut], *weights, top_k, backend=backend), ops.moe(x[cut:], *weights, top_k, backend=backend)]
    assert torch.equal(_bits(torch.cat(parts)), _bits(full))


def _expert(x, gate, up, down, backend):
    """One expert's MLP, down(silu(gate x) * up x), through the same ops."""
    act = ops.silu_mul(ops.linear(x, gate, backend=backend), ops.linear(x, up, backend=backend), backend=backend)
    return ops.linear(act, down, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_ties_pick_the_lowest_expert(backend):
    # Experts 1, 2 and 3 have the same router row (equal logits for every token), above experts 0 and 4:
    # top-1 must take expert 1 and top-2 experts 1 and 2, each weighted exactly 1/2 (softmax of equal logits).
    rng = np.random.default_rng(8)
    router, gate, up, down = _moe_weights(rng, 5, 12, 5)
    x = _t(np.abs(_randn(rng, 6, 12)))
    router[1:4] = 1.0
    router[[0, 4]] = -1.0
    top1 = ops.moe(x, router, gate, up, down, 1, backend=backend)
    assert torch.equal(_bits(top1), _bits(_expert(x, gate[1], up[1], down[1], backend)))
    top2 = ops.moe(x, router, gate, up, down, 2, backend=backend)
    half = [0.5 * _expert(x, gate[e], up[e], down[e], backend) for e in (1, 2)]
    assert torch.equal(_bits(top2), _bits(ops.sum(torch.stack(half, dim=-1), backend=backend)))


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_moe_against_float64_qwen3_moe(norm_topk_prob):
    # Qwen3-MoE in float64 from the same float32 inputs: softmax over all experts, the top-k (the experts the float32
    # router logits choose, float64.moe_routing), renormalised by their sum (norm_topk_prob) or not, SiLU MLPs,
    # weighted sum. Each stage's error is a few ulps of its magnitudes
    # (linear: depth + 1 ulps of sum |a||b|; silu_mul: 4; softmax: 2.5), and the sums inside an expert cancel,
    # so the scale is the magnitude path F = sum_s wt_s |down_s| (|gate_s||x| * |up_s||x|), which bounds how far
    # any rounding in the expert can move the output (|silu(g)| <= |g|, sigmoid' <= 1/4). Tolerance 2^-19 of F
    # = 32 u, first order: depth(64) + 1 = 7 ulps in each of three linears, 4 in silu_mul, 2.5 in the weights
    # (the softmax over the k chosen logits, or over all E without renormalisation: one §8 softmax either way).
    # Measured 6.0e-9 of F (0.1 u) in both modes; over seeds 9-29, at most 1.5e-8 (0.25 u): the worst case is far
    # from typical.
    rng = np.random.default_rng(9)
    m, d, inter, experts, top_k = 32, 64, 32, 8, 2
    router, gate, up, down = _moe_weights(rng, experts, d, inter)
    x = _t(_randn(rng, m, d))
    got = ops.moe(x, router, gate, up, down, top_k, norm_topk_prob=norm_topk_prob, backend="cpu").double().numpy()
    inputs = [t.numpy() for t in (x, router, gate, up, down)]
    ref = float64.moe(*inputs, top_k, norm_topk_prob)
    scale = float64.moe_magnitude(*inputs, top_k, norm_topk_prob)
    assert float((np.abs(got - ref) / scale).max()) <= 2.0 ** -19


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_moe_against_hf_transformers_qwen3_moe_block(norm_topk_prob):
    # HF transformers' own Qwen3MoeSparseMoeBlock (hidden 32, 4 experts, top 2), run in float64 on the same float32
    # weights: its router takes the softmax over all experts in float32 (softmax(..., dtype=torch.float)) and the
    # top 2 of those probabilities, divided by their sum only with norm_topk_prob; its experts are float64.
    # bitparity.moe gets its gate.weight as the router, experts.gate_up_proj split into gate [:, :I] and up [:, I:],
    # and experts.down_proj. Same tolerance and scale as against float64 above: 2^-19 of the magnitude path (HF's
    # float32 softmax adds a few ulps to the weights, inside the 2.5 u budgeted for ours). Measured 1.6e-8 of F
    # (0.26 u) without renormalisation, 2.1e-8 (0.35 u) with it (seeds 0-9: at most these). Both choose the same
    # experts here (checked), and the other mode misses by far more: the bound tells the modes apart.
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    rng = np.random.default_rng(0)
    m, d, inter, experts, top_k = 24, 32, 16, 4, 2
    config = Qwen3MoeConfig(hidden_size=d, moe_intermediate_size=inter, num_experts=experts,
                            num_experts_per_tok=top_k, norm_topk_prob=norm_topk_prob)
    config._experts_implementation = "eager"          # the block standalone: its own loop over the experts
    block = Qwen3MoeSparseMoeBlock(config).double()
    x = _t(_randn(rng, m, d))
    with torch.no_grad():
        block.gate.weight.copy_(_t(_randn(rng, experts, d)))
        block.experts.gate_up_proj.copy_(_t(_randn(rng, experts, 2 * inter, d, scale=0.3)))
        block.experts.down_proj.copy_(_t(_randn(rng, experts, d, inter, scale=0.3)))
        want = block(x.double()[None])[0].numpy()
        hf_chosen = block.gate(x.double())[2]
    router, gate_up, down = (p.detach().float() for p in (block.gate.weight, block.experts.gate_up_proj,
                                                           block.experts.down_proj))
    weights = (router, gate_up[:, :inter].contiguous(), gate_up[:, inter:].contiguous(), down)
    assert torch.equal(ops.topk(ops.linear(x, router, backend="cpu"), top_k, backend="cpu")[1], hf_chosen)
    scale = float64.moe_magnitude(x.numpy(), *(w.numpy() for w in weights), top_k, norm_topk_prob)

    def error(norm):
        got = ops.moe(x, *weights, top_k, norm_topk_prob=norm, backend="cpu").double().numpy()
        return float((np.abs(got - want) / scale).max())

    assert error(norm_topk_prob) <= 2.0 ** -19
    assert error(not norm_topk_prob) > 2.0 ** -12          # measured 2.0e-3 and 1.9e-3 of F
