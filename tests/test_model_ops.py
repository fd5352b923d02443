"""The model building blocks' API (spec 24): every bad input is rejected in ops.py, naming the argument."""

import pytest
import torch

from bitparity import ops

X = torch.randn(3, 8)
W = torch.randn(5, 8)
Q = torch.randn(2, 3, 4, 8)          # [B, H, Tq, D]
KV = torch.randn(2, 3, 6, 8)         # [B, H, Tk, D]
MOE = {"router_weight": torch.randn(4, 8), "gate_proj": torch.randn(4, 6, 8), "up_proj": torch.randn(4, 6, 8),
       "down_proj": torch.randn(4, 8, 6)}
META = torch.device("meta")          # a second device on a CPU-only machine: the checks only compare devices


def _moe(**changes):
    args = {"x": X, **MOE, "top_k": 2, **changes}
    return ops.moe(args.pop("x"), **args)


# -- linear --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", (torch.float64, torch.int64, torch.bool))
def test_linear_rejects_wrong_dtype(dtype):
    with pytest.raises(TypeError, match="x must be float32, bfloat16 or float16"):
        ops.linear(X.to(dtype), W)
    with pytest.raises(TypeError, match="weight must be float32, bfloat16 or float16"):
        ops.linear(X, W.to(dtype))


@pytest.mark.parametrize("weight,match", [
    (torch.randn(5, 7), r"weight must have shape \[N, K\] with K = x.shape\[-1\] = 8; got \(5, 7\)"),
    (torch.randn(2, 5, 8), r"weight must have shape \[N, K\]"),
    (torch.randn(8), "weight must have at least 2 dimension"),
])
def test_linear_rejects_weight_shape(weight, match):
    with pytest.raises(ValueError, match=match):
        ops.linear(X, weight)


def test_linear_rejects_bias_shape_and_device():
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\); got \(4,\)"):
        ops.linear(X, W, torch.randn(4))
    with pytest.raises(ValueError, match="weight must be on x's device"):
        ops.linear(X, W.to(META))
    with pytest.raises(ValueError, match="bias must be on x's device"):
        ops.linear(X, W, torch.randn(5, device=META))


@pytest.mark.parametrize("x,weight", [(torch.zeros(0, 8), W), (torch.zeros(3, 0), torch.zeros(5, 0)),
                                      (X, torch.zeros(0, 8))])
def test_linear_rejects_empty(x, weight):
    with pytest.raises(ValueError, match="must not be empty"):
        ops.linear(x, weight)


def test_linear_keeps_leading_dimensions():
    assert ops.linear(torch.randn(2, 3, 8), W, backend="cpu").shape == (2, 3, 5)


# -- rms_norm ------------------------------------------------------------------

@pytest.mark.parametrize("eps", (0.0, -1e-6, float("nan"), float("inf"), 1e-39, 1e-46, 1e39))
def test_rms_norm_rejects_eps_that_is_not_a_normal_float32(eps):
    with pytest.raises(ValueError, match="eps must"):
        ops.rms_norm(X, torch.ones(8), eps)


def test_rms_norm_rejects_bad_eps_type_weight_shape_and_device():
    with pytest.raises(TypeError, match="eps must be a real number"):
        ops.rms_norm(X, torch.ones(8), "1e-6")
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\); got \(7,\)"):
        ops.rms_norm(X, torch.ones(7))
    with pytest.raises(ValueError, match="weight must be on x's device"):
        ops.rms_norm(X, torch.ones(8, device=META))
    with pytest.raises(ValueError, match="x must not be empty"):
        ops.rms_norm(torch.zeros(0, 8), torch.ones(8))


# -- rotary --------------------------------------------------------------------

def test_rotary_rejects_odd_dimension_and_bad_tables():
    cos, sin = ops.rotary_tables(3, 8)
    with pytest.raises(ValueError, match="x's last dimension must be even"):
        ops.rotary(torch.randn(3, 7), cos[:, :3], sin[:, :3])
    with pytest.raises(ValueError, match=r"cos must broadcast to x.shape\[:-1\] \+ \(D/2,\) = \(3, 4\)"):
        ops.rotary(X, cos[:, :3], sin)
    with pytest.raises(ValueError, match="sin must broadcast"):
        ops.rotary(X, cos, torch.randn(2, 4))
    with pytest.raises(TypeError, match="sin must be float32"):
        ops.rotary(X, cos, sin.double())
    with pytest.raises(ValueError, match="cos must be on x's device"):
        ops.rotary(X, cos.to(META), sin)


@pytest.mark.parametrize("args,error,match", [
    ((3, 7), ValueError, "dim must be even"), ((0, 8), ValueError, "length must be in"),
    ((3, 8, 1.0), ValueError, "base must be finite and in"), ((3.0, 8), TypeError, "length must be an integer"),
])
def test_rotary_tables_reject_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        ops.rotary_tables(*args)


# -- attention -----------------------------------------------------------------

def test_attention_rejects_shapes():
    with pytest.raises(ValueError, match="q must have at least 4 dimension"):
        ops.attention(Q[0], KV, KV)
    with pytest.raises(ValueError, match=r"q must have shape \[B, H, Tq, D\]"):
        ops.attention(Q[None], KV, KV)
    with pytest.raises(ValueError, match=r"k must have shape \[B, H, Tk, D\] = \[2, 3, Tk, 8\]"):
        ops.attention(Q, KV[:, :2], KV[:, :2])
    with pytest.raises(ValueError, match="k must have shape"):
        ops.attention(Q, KV[..., :4], KV[..., :4])
    with pytest.raises(ValueError, match="v must have the shape of k"):
        ops.attention(Q, KV, KV[:, :, :5])
    with pytest.raises(TypeError, match="v must be float32"):
        ops.attention(Q, KV, KV.double())
    with pytest.raises(ValueError, match="k must be on q's device"):
        ops.attention(Q, KV.to(META), KV.to(META))


def test_attention_rejects_causal_with_more_queries_than_keys():
    with pytest.raises(ValueError, match="causal attention needs Tq <= Tk.*Tq=6, Tk=4"):
        ops.attention(torch.randn(1, 1, 6, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8))
    assert ops.attention(torch.randn(1, 1, 6, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8),
                         causal=False, backend="cpu").shape == (1, 1, 6, 8)
    with pytest.raises(TypeError, match="causal must be a bool"):
        ops.attention(Q, KV, KV, causal=1)


@pytest.mark.parametrize("lengths,match", [([0, 6], r"kv_lengths must lie in \[1, Tk\] = \[1, 6\]; got 0"),
                                           ([6, 7], r"kv_lengths must lie in \[1, Tk\] = \[1, 6\]; got 7"),
                                           ([-3, 2], "got -3")])
def test_attention_rejects_kv_lengths_out_of_range(lengths, match):
    with pytest.raises(ValueError, match=match):
        ops.attention(Q, KV, KV, kv_lengths=torch.tensor(lengths))


def test_attention_rejects_kv_lengths_type_and_shape():
    with pytest.raises(TypeError, match="kv_lengths must have dtype torch.int64"):
        ops.attention(Q, KV, KV, kv_lengths=torch.tensor([6, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"kv_lengths must have shape \[B\]"):
        ops.attention(Q, KV, KV, kv_lengths=torch.tensor([6, 6, 6]))
    with pytest.raises(TypeError, match="kv_lengths must be a torch.Tensor"):
        ops.attention(Q, KV, KV, kv_lengths=[6, 6])


def test_attention_rejects_empty():
    with pytest.raises(ValueError, match="q must not be empty"):
        ops.attention(torch.zeros(2, 3, 0, 8), KV, KV)
    with pytest.raises(ValueError, match="k must not be empty"):
        ops.attention(Q, torch.zeros(2, 3, 0, 8), torch.zeros(2, 3, 0, 8), causal=False)


# -- silu_mul ------------------------------------------------------------------

def test_silu_mul_rejects_mismatches():
    with pytest.raises(ValueError, match=r"up must have the shape of gate, \(3, 8\)"):
        ops.silu_mul(X, X[:, :4])
    with pytest.raises(TypeError, match="up must be float32"):
        ops.silu_mul(X, X.long())
    with pytest.raises(ValueError, match="up must be on gate's device"):
        ops.silu_mul(X, X.to(META))
    with pytest.raises(ValueError, match="gate must not be empty"):
        ops.silu_mul(torch.zeros(0), torch.zeros(0))


# -- moe -----------------------------------------------------------------------

@pytest.mark.parametrize("top_k", (0, 5, -1))
def test_moe_rejects_top_k_outside_one_to_experts(top_k):
    with pytest.raises(ValueError, match=r"top_k must be in \[1, 4\] \(the number of experts E\)"):
        _moe(top_k=top_k)


@pytest.mark.parametrize("changes,error,match", [
    ({"top_k": 2.0}, TypeError, "top_k must be an integer"),
    ({"norm_topk_prob": 1}, TypeError, "norm_topk_prob must be a bool; got int"),
    ({"norm_topk_prob": None}, TypeError, "norm_topk_prob must be a bool; got NoneType"),
    ({"x": torch.randn(2, 3, 8)}, ValueError, r"x must have shape \[M, D\]"),
    ({"router_weight": torch.randn(4, 7)}, ValueError, r"router_weight must have shape \(4, 8\)"),
    ({"gate_proj": torch.randn(4, 6, 7)}, ValueError, r"gate_proj must have shape \(4, 6, 8\)"),
    ({"up_proj": torch.randn(3, 6, 8)}, ValueError, r"up_proj must have shape \(4, 6, 8\)"),
    ({"down_proj": torch.randn(4, 6, 8)}, ValueError, r"down_proj must have shape \(4, 8, 6\)"),
    ({"down_proj": torch.randn(4, 8, 6).double()}, TypeError, "down_proj must be float32"),
    ({"up_proj": torch.randn(4, 6, 8, device=META)}, ValueError, "up_proj must be on x's device"),
    ({"x": torch.zeros(0, 8)}, ValueError, "x must not be empty"),
])
def test_moe_rejects_bad_arguments(changes, error, match):
    with pytest.raises(error, match=match):
        _moe(**changes)
