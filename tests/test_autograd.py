"""No public op drops requires_grad silently: each one returns outputs with grad_fn or raises a clear error."""

import pytest
import torch

import bitparity as bp

B, T, V = 3, 8, 16


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).requires_grad_()


def _mask(*shape):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(1)) < 0.8


def _calls():
    """op -> a call on inputs that require grad (fresh each time), on the backend given."""
    tokens = torch.randint(0, V, (B,), generator=torch.Generator().manual_seed(2))
    positions, seeds = torch.zeros(B, dtype=torch.int64), torch.arange(B)
    cos, sin = bp.rotary_tables(T, 4)
    return {
        "sum": lambda be: bp.sum(_x(B, V), _mask(B, V), backend=be),
        "logsumexp": lambda be: bp.logsumexp(_x(B, V), _mask(B, V), 0.7, backend=be),
        "log_softmax": lambda be: bp.log_softmax(_x(B, V), backend=be),
        "softmax": lambda be: bp.softmax(_x(B, V), backend=be),
        "entropy": lambda be: bp.entropy(_x(B, V), backend=be),
        "token_logprobs": lambda be: bp.token_logprobs(_x(B, V), tokens, backend=be),
        "exp": lambda be: bp.exp(_x(B, V), backend=be),
        "masked_mean": lambda be: bp.masked_mean(_x(B, T), _mask(B, T), backend=be),
        "masked_whiten": lambda be: bp.masked_whiten(_x(B, T), _mask(B, T), backend=be),
        "kl_penalty": lambda be: bp.kl_penalty(_x(B, T), _x(B, T), "k3", backend=be),
        "ppo_policy_loss": lambda be: bp.ppo_policy_loss(_x(B, T), _x(B, T).detach(), _x(B, T).detach(),
                                                         _mask(B, T), backend=be)[0],
        "topk": lambda be: bp.topk(_x(B, V), 3, backend=be)[0],
        # Refused: no backward in spec 26.
        "log": lambda be: bp.log(_x(B, V).exp(), backend=be),
        "gae": lambda be: bp.gae(_x(B, T), _x(B, T), backend=be),
        "filter_logits": lambda be: bp.filter_logits(_x(B, V), top_k=2, backend=be),
        "sample": lambda be: bp.sample(_x(B, V), seeds, positions, backend=be),
        "rollout_correction": lambda be: bp.rollout_correction(_x(B, T), torch.randn(B, T), _mask(B, T), backend=be),
        "beam_search_step": lambda be: bp.beam_search_step(torch.zeros(2), _x(2, V), 2, backend=be),
        "beam_search": lambda be: bp.beam_search(lambda seq: _x(seq.shape[0], V), torch.zeros(1, 1, dtype=torch.int64),
                                                 num_beams=2, max_new_tokens=2, eos_token_id=0, backend=be),
        "linear": lambda be: bp.linear(_x(B, 4), torch.randn(5, 4), backend=be),
        "rms_norm": lambda be: bp.rms_norm(torch.randn(B, 4), _x(4), backend=be),
        "rotary": lambda be: bp.rotary(_x(T, 4), cos, sin, backend=be),
        "attention": lambda be: bp.attention(_x(1, 1, T, 4), torch.randn(1, 1, T, 4), torch.randn(1, 1, T, 4),
                                             backend=be),
        "silu_mul": lambda be: bp.silu_mul(_x(B, 4), torch.randn(B, 4), backend=be),
        "moe": lambda be: bp.moe(torch.randn(B, 4), _x(2, 4), torch.randn(2, 6, 4), torch.randn(2, 6, 4),
                                 torch.randn(2, 4, 6), 1, backend=be),
        "embedding": lambda be: bp.embedding(tokens, _x(V, 4), backend=be),
    }


DIFFERENTIABLE = ("sum", "logsumexp", "log_softmax", "softmax", "entropy", "token_logprobs", "exp", "masked_mean",
                  "masked_whiten", "kl_penalty", "ppo_policy_loss", "topk")
MODEL_BLOCKS = ("linear", "rms_norm", "rotary", "attention", "silu_mul", "moe", "embedding")     # spec 29
NOT_DIFFERENTIABLE = ("log", "gae", "filter_logits", "sample", "beam_search_step", "beam_search", "rollout_correction")
NO_TENSOR_INPUT = ("rotary_tables",)


def test_every_public_op_is_classified():
    ops = {name for name in bp.__all__ if callable(getattr(bp, name)) and not isinstance(getattr(bp, name), type)}
    # compat's and metrics' functions are compositions of these ops
    # patch/unpatch change a model (tests/test_hf.py checks its gradients)
    ops -= {"backends", "current_backend", "use_backend", "patch", "unpatch"}
    assert ops == set(DIFFERENTIABLE + MODEL_BLOCKS + NOT_DIFFERENTIABLE + NO_TENSOR_INPUT)
    assert set(_calls()) == set(DIFFERENTIABLE + MODEL_BLOCKS + NOT_DIFFERENTIABLE)


@pytest.mark.parametrize("op", DIFFERENTIABLE + MODEL_BLOCKS)
def test_differentiable_ops_carry_grad_fn_and_fill_grad(any_backend, op):
    y = _calls()[op](any_backend)
    assert y.grad_fn is not None and y.requires_grad
    leaves = [t for t in _leaves(y.grad_fn) if t.requires_grad]
    y.backward(torch.ones_like(y))
    assert leaves and all(leaf.grad is not None and leaf.grad.shape == leaf.shape for leaf in leaves)


def _leaves(fn, seen=None):
    """The leaf tensors an autograd graph reaches."""
    seen = set() if seen is None else seen
    for next_fn, _ in fn.next_functions:
        if next_fn is None or id(next_fn) in seen:
            continue
        seen.add(id(next_fn))
        if hasattr(next_fn, "variable"):
            yield next_fn.variable
        else:
            yield from _leaves(next_fn, seen)


@pytest.mark.parametrize("op", NOT_DIFFERENTIABLE)
def test_non_differentiable_ops_raise_naming_the_argument(op):
    with pytest.raises(ValueError, match=r"bitparity\.\w+ is not differentiable: \w+ requires grad"):
        _calls()[op]("numpy")


@pytest.mark.parametrize("op", NOT_DIFFERENTIABLE)
def test_refusing_ops_run_under_no_grad(op):
    with torch.no_grad():
        out = _calls()[op]("numpy")
    assert all(not t.requires_grad for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor))


def test_arguments_that_are_not_differentiable_are_refused():
    x, mask = _x(B, T), _mask(B, T)
    with pytest.raises(ValueError, match="old_logp requires grad but is not differentiable"):
        bp.ppo_policy_loss(x, _x(B, T), torch.randn(B, T), mask, backend="numpy")
    with pytest.raises(ValueError, match="advantages requires grad but is not differentiable"):
        bp.ppo_policy_loss(x.detach(), torch.randn(B, T), _x(B, T), mask, backend="numpy")
    with pytest.raises(ValueError, match=r"temperature is not differentiable.*temperature\.detach\(\)"):
        bp.token_logprobs(_x(B, V), torch.zeros(B, dtype=torch.int64), torch.ones(B).requires_grad_(), backend="numpy")


def test_outputs_that_carry_no_gradient_say_so():
    loss, clip_fraction = bp.ppo_policy_loss(_x(B, T), torch.randn(B, T), torch.randn(B, T), _mask(B, T),
                                             backend="numpy")
    values, indices = bp.topk(_x(B, V), 3, backend="numpy")
    assert loss.requires_grad and not clip_fraction.requires_grad
    assert values.requires_grad and not indices.requires_grad


def test_double_backward_raises_a_clear_error():
    x = _x(B, V)
    (g,) = torch.autograd.grad(bp.log_softmax(x, backend="numpy").sum(), x)
    assert g.grad_fn is None
    with pytest.raises(RuntimeError, match=r"bitparity\.log_softmax: double backward \(create_graph=True\)"):
        torch.autograd.grad(bp.log_softmax(x, backend="numpy").sum(), x, create_graph=True)


def test_native_backend_keeps_torchs_own_autograd():
    names = {type(fn).__name__ for fn in _functions(bp.log_softmax(_x(B, V), backend="native").grad_fn)}
    assert "LogSoftmaxBackward0" in names and "_BackendNodeBackward" not in names


def _functions(fn):
    yield fn
    for next_fn, _ in fn.next_functions:
        if next_fn is not None:
            yield from _functions(next_fn)
