"""The compat modules' arguments, one row per out-of-domain value: the exception and a message naming the CALLER's
argument (verl's, TRL's or OpenRLHF's name, never the canonical op's), raised on every backend before any kernel
runs; and the defined results next to them (0/1 float masks, one-element tensor counts)."""

import inspect
import math
import re

import numpy as np
import pytest
import torch

import bitparity
from bitparity.compat import openrlhf, trl, verl

B, T, V = 3, 5, 7
BACKENDS = ("numpy", "cpu", "ascend", "cuda")       # every row raises before dispatch, so the interpreter is cheap
# The canonical ops' argument names: none may appear in a compat error unless the caller's function has it too.
OP_NAMES = ("x", "mask", "logp", "old_logp", "ref_logp", "clip_low", "clip_high", "dual_clip", "lam", "agg",
            "tokens", "dim", "rewards", "kind", "ratio_clamp")


def _batch():
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 3:] = False
    return {"a": torch.randn(B, T, generator=g), "b": torch.randn(B, T, generator=g),
            "c": torch.randn(B, T, generator=g), "logits": torch.randn(B, T, V, generator=g), "mask": mask}


def _good(d):
    """Each callable's valid keyword arguments (the row replaces one)."""
    logp, mask = -d["a"].abs(), d["mask"]
    return {
        verl.compute_gae_advantage_return: dict(token_level_rewards=d["a"], values=d["b"], response_mask=mask,
                                                gamma=0.99, lam=0.95),
        verl.masked_mean: dict(values=d["a"], mask=mask, axis=None),
        verl.masked_whiten: dict(values=d["a"], mask=mask, shift_mean=True),
        verl.logprobs_from_logits: dict(logits=d["logits"], labels=torch.zeros(B, T, dtype=torch.int64)),
        verl.agg_loss: dict(loss_mat=d["a"], loss_mask=mask, loss_agg_mode="seq-mean-token-sum-norm", dp_size=2,
                            batch_num_tokens=12, global_batch_size=6, loss_scale_factor=5),
        verl.kl_penalty: dict(logprob=logp, ref_logprob=d["b"], kl_penalty="low_var_kl"),
        verl.compute_policy_loss: dict(old_log_prob=logp, log_prob=logp, advantages=d["c"], response_mask=mask,
                                       cliprange=0.2, cliprange_low=None, cliprange_high=0.28, clip_ratio_c=3.0,
                                       loss_agg_mode="token-mean"),
        trl.compute_advantages: dict(rewards=d["a"], values=d["b"], padding_mask=~mask, padding_mask_p1=~mask,
                                     gamma=1.0, lam=0.95),
        trl.masked_mean: dict(values=d["a"], mask=mask, axis=None),
        trl.masked_var: dict(values=d["a"], mask=mask, unbiased=True),
        trl.masked_whiten: dict(values=d["a"], mask=mask, shift_mean=True),
        trl.selective_log_softmax: dict(logits=d["logits"], index=torch.zeros(B, T, dtype=torch.int64),
                                        temperature=0.7, row_mask=mask),
        trl.selective_log_softmax_and_entropy: dict(logits=d["logits"], index=torch.zeros(B, T, dtype=torch.int64),
                                                    entropy_requires_grad=True, temperature=0.7, row_mask=mask),
        trl.entropy_from_logits: dict(logits=d["logits"], chunk_size=128),
        openrlhf.compute_approx_kl: dict(log_probs=logp, log_probs_base=d["b"], kl_estimator="k3"),
        openrlhf.masked_mean: dict(tensor=d["a"], mask=mask, dim=None),
        openrlhf.normalize_advantages: dict(advantages=d["a"], action_mask=mask),
        openrlhf.get_advantages_and_returns: dict(values=d["a"], rewards=d["b"], action_mask=mask, gamma=1.0,
                                                  lambd=0.95),
        openrlhf.PolicyLoss: dict(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=3.0, token_level_loss=True),
        openrlhf.PolicyLoss.forward: dict(log_probs=logp, old_log_probs=logp, advantages=d["c"], action_mask=mask,
                                          rollout_log_probs=d["b"], dp_size=2, batch_num_tokens=12,
                                          global_batch_size=6),
    }


def _call(fn, kwargs):
    if fn is openrlhf.PolicyLoss.forward:
        return openrlhf.PolicyLoss()(**kwargs)
    return fn(**kwargs)


NAN_MASK = "nan mask"           # a float mask with one NaN entry (it used to count as True)
HALF_MASK = "0.5 mask"
SHORT = "wrong shape"           # the argument with one column fewer
ROWS = [  # (callable, argument, bad value, exception, message fragment)
    (verl.compute_gae_advantage_return, "token_level_rewards", [1.0], TypeError, "token_level_rewards must be a"),
    (verl.compute_gae_advantage_return, "values", SHORT, ValueError, "values must have the shape of token_level_rewa"),
    (verl.compute_gae_advantage_return, "response_mask", NAN_MASK, ValueError, "response_mask must hold only 0 and 1"),
    (verl.compute_gae_advantage_return, "response_mask", SHORT, ValueError, "response_mask must have the shape of "
                                                                             "token_level_rewards"),
    (verl.compute_gae_advantage_return, "gamma", 1.5, ValueError, "gamma must be finite and in [0.0, 1.0]"),
    (verl.compute_gae_advantage_return, "lam", math.nan, ValueError, "lam must be finite and in [0.0, 1.0]"),
    (verl.masked_mean, "values", "int", TypeError, "values must be float32"),
    (verl.masked_mean, "mask", HALF_MASK, ValueError, "mask must hold only 0 and 1"),
    (verl.masked_mean, "axis", 5, ValueError, "axis must be None or an int"),
    (verl.masked_whiten, "values", "int", TypeError, "values must be float32"),
    (verl.masked_whiten, "mask", NAN_MASK, ValueError, "mask must hold only 0 and 1"),
    (verl.masked_whiten, "shift_mean", "yes", TypeError, "shift_mean must be a bool"),
    (verl.logprobs_from_logits, "logits", "int", TypeError, "logits must be float32"),
    (verl.logprobs_from_logits, "labels", "float", TypeError, "labels must have dtype torch.int64"),
    (verl.logprobs_from_logits, "labels", "out of range", ValueError, "labels must lie in [0, 7)"),
    (verl.agg_loss, "loss_mat", [1.0], TypeError, "loss_mat must be a torch.Tensor"),
    (verl.agg_loss, "loss_mask", SHORT, ValueError, "loss_mask must have the shape of loss_mat"),
    (verl.agg_loss, "loss_mask", NAN_MASK, ValueError, "loss_mask must hold only 0 and 1"),
    (verl.agg_loss, "loss_agg_mode", "mean", ValueError, "loss_agg_mode must be one of"),
    (verl.agg_loss, "dp_size", 0, ValueError, "dp_size must be an int >= 1"),
    (verl.agg_loss, "dp_size", 1.5, ValueError, "dp_size must be an int >= 1"),
    (verl.agg_loss, "batch_num_tokens", math.nan, ValueError, "batch_num_tokens must be finite and > 0"),
    (verl.agg_loss, "global_batch_size", 0, ValueError, "global_batch_size must be finite and > 0"),
    (verl.agg_loss, "global_batch_size", 1e-300, ValueError, "global_batch_size = 1e-300 makes the scale factor"),
    (verl.agg_loss, "loss_scale_factor", math.inf, ValueError, "loss_scale_factor must be finite and > 0"),
    (verl.agg_loss, "loss_scale_factor", -1, ValueError, "loss_scale_factor must be finite and > 0"),
    (verl.kl_penalty, "logprob", [0.0], TypeError, "logprob must be a torch.Tensor"),
    (verl.kl_penalty, "ref_logprob", SHORT, ValueError, "ref_logprob must have the shape of logprob"),
    (verl.kl_penalty, "kl_penalty", "k4", NotImplementedError, "kl_penalty must be one of"),
    (verl.compute_policy_loss, "log_prob", "int", TypeError, "log_prob must be float32"),
    (verl.compute_policy_loss, "old_log_prob", SHORT, ValueError, "old_log_prob must have the shape of log_prob"),
    (verl.compute_policy_loss, "old_log_prob", [0.0], TypeError, "old_log_prob must be a torch.Tensor"),
    (verl.compute_policy_loss, "advantages", SHORT, ValueError, "advantages must have the shape of log_prob"),
    (verl.compute_policy_loss, "response_mask", NAN_MASK, ValueError, "response_mask must hold only 0 and 1"),
    (verl.compute_policy_loss, "response_mask", SHORT, ValueError, "response_mask must have the shape of log_prob"),
    (verl.compute_policy_loss, "cliprange", 1.5, ValueError, "cliprange must be finite and in [0.0, 1.0]"),
    (verl.compute_policy_loss, "cliprange_low", -0.1, ValueError, "cliprange_low must be finite and in [0.0, 1.0]"),
    (verl.compute_policy_loss, "cliprange_high", math.nan, ValueError, "cliprange_high must be finite"),
    (verl.compute_policy_loss, "clip_ratio_c", 0.5, ValueError, "clip_ratio_c must be finite and in (1.0, inf)"),
    (verl.compute_policy_loss, "loss_agg_mode", "mean", ValueError, "loss_agg_mode must be one of"),
    (trl.compute_advantages, "rewards", [1.0], TypeError, "rewards must be a torch.Tensor"),
    (trl.compute_advantages, "values", SHORT, ValueError, "values must have the shape of rewards"),
    (trl.compute_advantages, "padding_mask", NAN_MASK, ValueError, "padding_mask must hold only 0 and 1"),
    (trl.compute_advantages, "padding_mask", SHORT, ValueError, "padding_mask must have the shape of rewards"),
    (trl.compute_advantages, "padding_mask_p1", SHORT, ValueError, "padding_mask_p1 must have the shape of rewards"),
    (trl.compute_advantages, "gamma", -1.0, ValueError, "gamma must be finite and in [0.0, 1.0]"),
    (trl.compute_advantages, "lam", 2.0, ValueError, "lam must be finite and in [0.0, 1.0]"),
    (trl.masked_mean, "values", "int", TypeError, "values must be float32"),
    (trl.masked_mean, "mask", SHORT, ValueError, "mask must have the shape of values"),
    (trl.masked_mean, "axis", -9, ValueError, "axis must be None or an int"),
    (trl.masked_var, "values", SHORT, ValueError, "mask must have the shape of values"),
    (trl.masked_var, "mask", HALF_MASK, ValueError, "mask must hold only 0 and 1"),
    (trl.masked_var, "unbiased", "no", TypeError, "unbiased must be a bool"),
    (trl.masked_whiten, "values", [1.0], TypeError, "values must be a torch.Tensor"),
    (trl.masked_whiten, "mask", NAN_MASK, ValueError, "mask must hold only 0 and 1"),
    (trl.masked_whiten, "shift_mean", 1, TypeError, "shift_mean must be a bool"),
    (trl.selective_log_softmax, "index", "float", TypeError, "index must have dtype torch.int64"),
    (trl.selective_log_softmax, "index", "out of range", ValueError, "index must lie in [0, 7)"),
    (trl.selective_log_softmax, "index", "k out of range", ValueError, "index must lie in [0, 7)"),
    (trl.selective_log_softmax, "logits", "int", TypeError, "logits must be float32"),
    (trl.selective_log_softmax, "temperature", 0.0, ValueError, "temperature must be finite and > 0"),
    (trl.selective_log_softmax, "row_mask", NAN_MASK, ValueError, "row_mask must hold only 0 and 1"),
    (trl.selective_log_softmax, "row_mask", SHORT, ValueError, "row_mask must have index's shape"),
    (trl.selective_log_softmax_and_entropy, "logits", "int", TypeError, "logits must be float32"),
    (trl.selective_log_softmax_and_entropy, "index", "k out of range", ValueError,
     "index must have shape logits.shape[:-1]"),
    (trl.selective_log_softmax_and_entropy, "entropy_requires_grad", 1, TypeError,
     "entropy_requires_grad must be a bool"),
    (trl.selective_log_softmax_and_entropy, "temperature", math.nan, ValueError, "temperature must be finite"),
    (trl.selective_log_softmax_and_entropy, "row_mask", HALF_MASK, ValueError, "row_mask must hold only 0 and 1"),
    (trl.entropy_from_logits, "logits", "int", TypeError, "logits must be float32"),
    (trl.entropy_from_logits, "chunk_size", 0, ValueError, "chunk_size must be an int >= 1"),
    (openrlhf.compute_approx_kl, "log_probs", "int", TypeError, "log_probs must be float32"),
    (openrlhf.compute_approx_kl, "log_probs_base", SHORT, ValueError, "log_probs_base must have the shape of "
                                                                      "log_probs"),
    (openrlhf.compute_approx_kl, "kl_estimator", "k4", ValueError, "kl_estimator must be one of"),
    (openrlhf.masked_mean, "tensor", [1.0], TypeError, "tensor must be a torch.Tensor"),
    (openrlhf.masked_mean, "mask", NAN_MASK, ValueError, "mask must hold only 0 and 1"),
    (openrlhf.masked_mean, "dim", 9, ValueError, "dim must be None or an int"),
    (openrlhf.normalize_advantages, "advantages", "int", TypeError, "advantages must be float32"),
    (openrlhf.normalize_advantages, "action_mask", HALF_MASK, ValueError, "action_mask must hold only 0 and 1"),
    (openrlhf.get_advantages_and_returns, "rewards", [1.0], TypeError, "rewards must be a torch.Tensor"),
    (openrlhf.get_advantages_and_returns, "values", SHORT, ValueError, "values must have the shape of rewards"),
    (openrlhf.get_advantages_and_returns, "action_mask", NAN_MASK, ValueError, "action_mask must hold only 0 and 1"),
    (openrlhf.get_advantages_and_returns, "action_mask", SHORT, ValueError, "action_mask must have the shape of "
                                                                            "rewards"),
    (openrlhf.get_advantages_and_returns, "lambd", 2.0, ValueError, "lambd must be finite and in [0.0, 1.0]"),
    (openrlhf.get_advantages_and_returns, "gamma", math.inf, ValueError, "gamma must be finite"),
    (openrlhf.PolicyLoss, "clip_eps_low", 1.0, ValueError, "clip_eps_low must be in [0, 1) after rounding"),
    (openrlhf.PolicyLoss, "clip_eps_high", -1.0, ValueError, "clip_eps_high must be finite and in [0.0, inf)"),
    (openrlhf.PolicyLoss, "dual_clip", 1.0, ValueError, "dual_clip must be finite and in (1.0, inf)"),
    (openrlhf.PolicyLoss, "token_level_loss", "yes", TypeError, "token_level_loss must be a bool"),
    (openrlhf.PolicyLoss.forward, "log_probs", [0.0], TypeError, "log_probs must be a torch.Tensor"),
    (openrlhf.PolicyLoss.forward, "old_log_probs", SHORT, ValueError, "old_log_probs must have the shape of "
                                                                      "log_probs"),
    (openrlhf.PolicyLoss.forward, "advantages", [0.0], TypeError, "advantages must be a torch.Tensor"),
    (openrlhf.PolicyLoss.forward, "action_mask", NAN_MASK, ValueError, "action_mask must hold only 0 and 1"),
    (openrlhf.PolicyLoss.forward, "action_mask", SHORT, ValueError, "action_mask must have the shape of log_probs"),
    (openrlhf.PolicyLoss.forward, "rollout_log_probs", SHORT, ValueError, "rollout_log_probs must have the shape "
                                                                          "of log_probs"),
    (openrlhf.PolicyLoss.forward, "dp_size", True, ValueError, "dp_size must be an int >= 1"),
    (openrlhf.PolicyLoss.forward, "dp_size", 0, ValueError, "dp_size must be an int >= 1"),
    (openrlhf.PolicyLoss.forward, "batch_num_tokens", math.nan, ValueError, "batch_num_tokens must be finite and > 0"),
    (openrlhf.PolicyLoss.forward, "batch_num_tokens", "two elements", ValueError, "batch_num_tokens must be a number "
                                                                                  "or a one-element tensor"),
    (openrlhf.PolicyLoss.forward, "global_batch_size", -3, ValueError, "global_batch_size must be finite and > 0"),
]


def _bad(value, good):
    """The symbolic bad values, made from the argument's good value."""
    if value == NAN_MASK:
        m = good.float()
        m[0, 0] = math.nan
        return m
    if value == HALF_MASK:
        m = good.float()
        m[1, 1] = 0.5
        return m
    if value == SHORT:
        return good[..., :-1]
    if value == "int":
        return good.to(torch.int64)
    if value == "float":
        return good.float()
    if value == "out of range":
        bad = good.clone()
        bad[1, 2] = V
        return bad
    if value == "k out of range":
        return torch.full((B, T, 2), -1, dtype=torch.int64)
    if value == "two elements":
        return torch.tensor([1.0, 2.0])
    return value


def _caller_parameters(fn):
    if fn is openrlhf.PolicyLoss:
        return set(inspect.signature(openrlhf.PolicyLoss.__init__).parameters)
    return set(inspect.signature(fn).parameters)


def _row_id(row):
    fn, arg, value = row[:3]
    return f"{fn.__qualname__}-{arg}-{value}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, arg, value, error, fragment", ROWS, ids=[_row_id(r) for r in ROWS])
def test_bad_argument_is_named_as_the_caller_wrote_it(backend, fn, arg, value, error, fragment):
    kwargs = _good(_batch())[fn]
    kwargs[arg] = _bad(value, kwargs[arg])
    with bitparity.use_backend(backend), pytest.raises(error) as raised:
        _call(fn, kwargs)
    message = str(raised.value)
    assert fragment in message
    leaked = [n for n in OP_NAMES if n not in _caller_parameters(fn) and re.search(rf"\b{n}\b", message)]
    assert not leaked, f"the canonical op's names {leaked} leak into {message!r}"


def test_every_argument_has_a_row():
    """The table covers each checked argument of every compat callable (the tensors' values aside)."""
    # inplace_backward: verl's, without effect here; PolicyLoss's four options: test_openrlhf.py's own table.
    unchecked = {"self", "inplace_backward", "policy_loss_type", "enable_vllm_is_correction",
                 "vllm_is_truncated_threshold", "vllm_is_correction_type"}
    for fn in _good(_batch()):
        missing = _caller_parameters(fn) - {arg for f, arg, *_ in ROWS if f is fn} - unchecked
        assert not missing, (fn.__qualname__, missing)


def test_valid_arguments_run():
    """Every callable runs on its good arguments, so each row fails only because of its one bad value."""
    for fn, kwargs in _good(_batch()).items():
        _call(fn, kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_a_0_1_mask_of_any_real_dtype_is_the_bool_mask(dtype):
    d = _batch()
    want = verl.compute_policy_loss(-d["a"].abs(), -d["b"].abs(), d["c"], d["mask"])
    got = verl.compute_policy_loss(-d["a"].abs(), -d["b"].abs(), d["c"], d["mask"].to(dtype))
    for w, g in zip(want, got):
        assert torch.equal(w.view(torch.int32), g.view(torch.int32))


def test_count_as_a_one_element_tensor_or_numpy_scalar_is_the_number():
    d = _batch()
    loss = openrlhf.PolicyLoss()
    want = loss(-d["a"].abs(), -d["b"].abs(), d["c"], d["mask"], dp_size=2, batch_num_tokens=12)[0]
    for count in (torch.tensor(12), torch.tensor([12.0]), np.int64(12), np.array([12.0])):
        got = loss(-d["a"].abs(), -d["b"].abs(), d["c"], d["mask"], dp_size=np.int64(2), batch_num_tokens=count)[0]
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
