"""The operator API: validation errors, shapes, dtypes and backend selection."""

import inspect

import numpy as np
import pytest
import torch

import bitparity as bp
from bitparity.compare.metrics import canonical_bits

X = torch.randn(3, 7)
SOFTMAX_FAMILY = (bp.logsumexp, bp.log_softmax, bp.softmax, bp.entropy)


# -- errors: every input checked where it enters ------------------------------

@pytest.mark.parametrize("op", (bp.sum, *SOFTMAX_FAMILY, bp.exp, bp.log))
def test_rejects_non_tensors(op):
    name = next(iter(inspect.signature(op).parameters))        # the error names the argument: x, or entropy's logits
    with pytest.raises(TypeError, match=f"^{name} must be a torch.Tensor"):
        op([1.0, 2.0])


@pytest.mark.parametrize("op", (bp.sum, *SOFTMAX_FAMILY, bp.exp, bp.log))
@pytest.mark.parametrize("dtype", (torch.float64, torch.int64, torch.bool))
def test_rejects_wrong_dtype(op, dtype):
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        op(X.to(dtype))


@pytest.mark.parametrize("op", (bp.sum, *SOFTMAX_FAMILY, bp.exp))
@pytest.mark.parametrize("shape", ((0,), (3, 0), (0, 5)))
def test_rejects_empty(op, shape):
    with pytest.raises(ValueError, match="must not be empty"):
        op(torch.zeros(shape))


@pytest.mark.parametrize("op", (bp.sum, *SOFTMAX_FAMILY))
def test_rejects_scalars_where_a_last_dimension_is_needed(op):
    with pytest.raises(ValueError, match="at least 1 dimension"):
        op(torch.tensor(1.0))


@pytest.mark.parametrize("op", (bp.sum, *SOFTMAX_FAMILY))
def test_rejects_mask_of_wrong_shape(op):
    with pytest.raises(ValueError, match=r"mask must have the shape of x, \(3, 7\); got \(3, 6\)"):
        op(X, torch.ones(3, 6, dtype=torch.bool))


@pytest.mark.parametrize("op", (bp.sum, *SOFTMAX_FAMILY))
def test_rejects_non_bool_mask(op):
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        op(X, torch.ones(3, 7))


@pytest.mark.parametrize("op", (*SOFTMAX_FAMILY, ))
@pytest.mark.parametrize("temperature", (0.0, -1.0, float("inf"), float("nan"), 1e-50, 1e-39))
def test_rejects_bad_temperature(op, temperature):
    with pytest.raises(ValueError, match="temperature"):
        op(X, temperature=temperature)


@pytest.mark.parametrize("temperature", ("1.0", True, None))
def test_rejects_temperature_of_wrong_type(temperature):
    with pytest.raises(TypeError, match="temperature must be a real number"):
        bp.log_softmax(X, temperature=temperature)


def test_token_logprobs_rejects_out_of_range_ids():
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 7\).*got 7"):
        bp.token_logprobs(X, torch.tensor([0, 7, 1]))
    with pytest.raises(ValueError, match=r"got -1"):
        bp.token_logprobs(X, torch.tensor([0, -1, 1]))


def test_token_logprobs_rejects_wrong_token_dtype_and_shape():
    with pytest.raises(TypeError, match="tokens must have dtype torch.int64"):
        bp.token_logprobs(X, torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"tokens must have shape logits.shape\[:-1\] = \(3,\)"):
        bp.token_logprobs(X, torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="tokens must be a torch.Tensor"):
        bp.token_logprobs(X, [0, 1, 2])


def test_token_logprobs_rejects_bad_temperature():
    with pytest.raises(ValueError, match="temperature must be finite and > 0"):
        bp.token_logprobs(X, torch.tensor([0, 1, 2]), temperature=0.0)


def test_rejects_unknown_and_mismatched_backends():
    with pytest.raises(ValueError, match="backend must be one of"):
        bp.log_softmax(X, backend="tpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        bp.use_backend("tpu")


def test_rejects_wrong_device():
    meta = torch.empty(3, 7, device="meta")
    for backend in ("numpy", None):
        with pytest.raises(ValueError, match="x must hold data; got a tensor on the meta device"):
            bp.log_softmax(meta, backend=backend)


def test_rejects_mask_and_tokens_on_another_device():
    with pytest.raises(ValueError, match="mask must be on x's device"):
        bp.softmax(X, torch.ones(3, 7, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match="tokens must be on logits' device"):
        bp.token_logprobs(X, torch.zeros(3, dtype=torch.int64, device="meta"))


# -- shapes, dtypes, selection --------------------------------------------------

def test_leading_dimensions_are_kept():
    x = torch.randn(2, 3, 5)
    assert bp.log_softmax(x).shape == (2, 3, 5)
    assert bp.logsumexp(x).shape == (2, 3)
    assert bp.sum(torch.randn(5)).shape == ()
    assert bp.token_logprobs(x, torch.zeros(2, 3, dtype=torch.int64)).shape == (2, 3)
    assert bp.exp(torch.randn(2, 3)).shape == (2, 3)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_half_inputs_are_upcast_exactly(dtype):
    x = torch.randn(4, 300).to(dtype)
    got = bp.log_softmax(x, backend="numpy")
    assert got.dtype == torch.float32
    assert torch.equal(canonical_bits(got), canonical_bits(bp.log_softmax(x.float(), backend="numpy")))


def test_temperature_is_one_float32_reciprocal_then_a_multiply():
    x = torch.randn(2, 50)
    scale = np.float32(1.0) / np.float32(0.7)
    assert bp.ops.inverse_temperature(0.7) == float(scale)
    expected = bp.log_softmax(torch.from_numpy(x.numpy() * scale), backend="numpy")   # float32 * float32
    assert torch.equal(canonical_bits(bp.log_softmax(x, temperature=0.7, backend="numpy")), canonical_bits(expected))


def test_use_backend_sets_and_restores():
    assert bp.current_backend() is None
    with bp.use_backend("numpy"):
        assert bp.current_backend() == "numpy"
        with bp.use_backend("native"):
            assert bp.current_backend() == "native"
        assert bp.current_backend() == "numpy"
    assert bp.current_backend() is None
    bp.use_backend("numpy")
    try:
        assert bp.current_backend() == "numpy"
    finally:
        bp.use_backend(None)
    assert bp.current_backend() is None


def test_use_backend_changes_what_runs():
    x = torch.tensor([[0.1, 0.2, 0.3]])
    with bp.use_backend("native"):
        native = bp.softmax(x)
    assert torch.equal(native, torch.softmax(x, -1))


def test_backends_lists_every_backend_with_a_reason():
    listed = {b["name"]: b for b in bp.backends()}
    assert set(listed) == {"cpu", "numpy", "cuda", "ascend", "native"}
    for b in listed.values():
        assert isinstance(b["available"], bool) and b["reason"]
    assert listed["numpy"]["available"]
    if not torch.cuda.is_available():
        assert "interpreter" in listed["cuda"]["reason"].lower()
    assert "emulation" in listed["ascend"]["reason"].lower()


def test_default_backend_for_cpu_tensors_is_cpu():
    x = torch.randn(2, 9)
    assert torch.equal(canonical_bits(bp.log_softmax(x)), canonical_bits(bp.log_softmax(x, backend="cpu")))


# -- RL operators: errors ----------------------------------------------------------

B, T = 3, 6
R = torch.randn(B, T)
M = torch.ones(B, T, dtype=torch.bool)


def test_gae_rejects_bad_input():
    with pytest.raises(ValueError, match=r"values must have the shape of rewards, \(3, 6\)"):
        bp.gae(R, torch.randn(3, 5))
    with pytest.raises(ValueError, match=r"rewards must have shape \[B, T\]"):
        bp.gae(torch.randn(2, 3, 4), torch.randn(2, 3, 4))
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        bp.gae(R, R, M.float())
    with pytest.raises(ValueError, match="mask must have the shape of x"):
        bp.gae(R, R, M[:, :5])
    for name, kw in (("gamma", {"gamma": 1.5}), ("gamma", {"gamma": -0.1}), ("lam", {"lam": 2.0}),
                     ("lam", {"lam": float("nan")})):
        with pytest.raises(ValueError, match=rf"{name} must be finite and in \[0.0, 1.0\]"):
            bp.gae(R, R, **kw)
    with pytest.raises(ValueError, match="mask_mode must be one of carry, zero"):
        bp.gae(R, R, mask_mode="skip")
    with pytest.raises(ValueError, match=r"bootstrap must have shape \[B\] = \(3,\)"):
        bp.gae(R, R, bootstrap=torch.zeros(4))
    with pytest.raises(TypeError, match="rewards must be float32"):
        bp.gae(R.double(), R.double())


def test_masked_mean_and_whiten_reject_bad_input():
    with pytest.raises(TypeError, match=r"mask must be a torch.Tensor of dtype bool.*got None"):
        bp.masked_mean(R, None)
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        bp.masked_whiten(R, M.int())
    with pytest.raises(ValueError, match="mask must have the shape of x"):
        bp.masked_mean(R, M[:2])
    with pytest.raises(ValueError, match=r"dim must be None or an int in \[-2, 2\)"):
        bp.masked_mean(R, M, dim=2)
    for eps in (0.0, -1e-8, float("inf"), 1e-40):
        with pytest.raises(ValueError, match="eps must"):
            bp.masked_whiten(R, M, eps=eps)
    with pytest.raises(TypeError, match="shift_mean must be a bool"):
        bp.masked_whiten(R, M, shift_mean=1)


def test_kl_penalty_rejects_bad_input():
    with pytest.raises(ValueError, match="kind must be one of k1, k2, k3, abs; got 'k4'"):
        bp.kl_penalty(R, R, "k4")
    with pytest.raises(ValueError, match=r"ref_logp must have the shape of logp"):
        bp.kl_penalty(R, R[:, :2], "k1")
    for name in ("clamp", "log_ratio_clamp"):
        with pytest.raises(ValueError, match=rf"{name} must be finite and in \(0.0, inf\)"):
            bp.kl_penalty(R, R, "k3", **{name: 0.0})
        with pytest.raises(ValueError, match=rf"{name} must round to a normal float32"):
            bp.kl_penalty(R, R, "k3", **{name: 1e-50})


def test_ppo_policy_loss_rejects_bad_input():
    with pytest.raises(ValueError, match="agg must be one of token-mean, seq-mean-token-sum, seq-mean-token-mean"):
        bp.ppo_policy_loss(R, R, R, M, agg="sum")
    with pytest.raises(ValueError, match=r"advantages must have the shape of logp"):
        bp.ppo_policy_loss(R, R, R[:1], M)
    with pytest.raises(ValueError, match=r"clip_low must be finite and in \[0.0, 1.0\]"):
        bp.ppo_policy_loss(R, R, R, M, clip_low=-0.1)
    with pytest.raises(ValueError, match=r"clip_low must be in \[0, 1\)"):
        bp.ppo_policy_loss(R, R, R, M, clip_low=1.0)
    with pytest.raises(ValueError, match=r"clip_low must be in \[0, 1\) after rounding"):
        bp.ppo_policy_loss(R, R, R, M, clip_low=0.999999999)
    with pytest.raises(ValueError, match=r"clip_high must be finite and in \[0.0, inf\)"):
        bp.ppo_policy_loss(R, R, R, M, clip_high=float("inf"))
    with pytest.raises(ValueError, match=r"dual_clip must be finite and in \(1.0, inf\)"):
        bp.ppo_policy_loss(R, R, R, M, dual_clip=0.5)
    with pytest.raises(ValueError, match=r"ratio_clamp must be finite and in \(0.0, inf\)"):
        bp.ppo_policy_loss(R, R, R, M, ratio_clamp=-1.0)
    with pytest.raises(TypeError, match="mask must be a torch.Tensor of dtype bool"):
        bp.ppo_policy_loss(R, R, R, None)


def test_rl_ops_shapes():
    adv, ret = bp.gae(R, R, M, 0.9, 0.8)
    assert adv.shape == ret.shape == (B, T)
    assert bp.masked_mean(R, M).shape == ()
    assert bp.masked_mean(R, M, dim=0).shape == (T,)
    assert bp.masked_mean(R, M, dim=-1).shape == (B,)
    assert bp.masked_whiten(R, M).shape == (B, T)
    assert bp.kl_penalty(R, R, "k3").shape == (B, T)
    loss, frac = bp.ppo_policy_loss(R, R, R, M)
    assert loss.shape == frac.shape == ()


def test_masked_mean_along_a_dim_is_the_rowwise_mean():
    x = torch.randn(4, 5, 6)
    m = torch.rand(4, 5, 6) > 0.3
    along = bp.masked_mean(x, m, dim=1, backend="numpy")
    for i in range(4):
        for k in range(6):
            one = bp.masked_mean(x[i, :, k], m[i, :, k], backend="numpy")
            assert torch.equal(canonical_bits(along[i, k]), canonical_bits(one))
