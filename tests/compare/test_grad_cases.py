"""The gradient cases of the conformance suite (compare/grad_cases.py): every differentiable op of spec 26 and 29
and the training steps, named, tiered, rebuilt from the seed, each recorded tensor separate; and what the cases
compute is what the public API computes."""

import numpy as np
import pytest
import torch

from bitparity import ops, optim
from bitparity.autograd import RULES
from bitparity.compare import golden, grad_cases
from bitparity.compare.metrics import canonical_bits

# Spec 26 and 29's differentiable ops: autograd's backward rules, moe and the embedding (composites).
DIFFERENTIABLE = set(RULES) | {"moe", "embedding"}


def _bits_equal(a, b):
    return torch.equal(canonical_bits(a), canonical_bits(b))


def test_every_differentiable_op_and_training_step_has_cases_with_unique_names():
    quick, full = grad_cases.suite("quick"), grad_cases.suite("full")
    assert {c.op for c in quick} == {f"{op}.backward" for op in DIFFERENTIABLE} | set(grad_cases.STEP_OPS)
    assert set(grad_cases.GRAD_OPS) == {c.op for c in quick}
    assert len({c.name for c in full}) == len(full)
    assert [c.name for c in quick] == [c.name for c in full if c.tier == "quick"]
    assert all(c.name.startswith(c.op + "/") for c in full)
    assert {"AdamW.step", "SGD.step", "clip_grad_norm_", "GradientFold"} <= {c.op for c in quick}


def test_cases_carry_the_forward_suites_kinds_masks_specials_and_bfloat16():
    names = {c.name for c in grad_cases.suite("quick")}
    for op in ("log_softmax", "softmax", "entropy", "logsumexp"):
        for kind in ("masked", "specials", "wide", "peaked", "equal", "random-bf16", "neg_inf", "subnormal"):
            assert any(n.startswith(f"{op}.backward/{kind}/") for n in names), (op, kind)
    assert any(n.startswith("log_softmax.backward/random/") and n.endswith("/T0.7") for n in names)
    for op in ("linear", "rms_norm", "embedding"):
        assert any(n.startswith(f"{op}.backward/random-bf16/") for n in names), op
    case = next(c for c in grad_cases.suite("quick", ["log_softmax.backward"]) if "/masked/" in c.name)
    (x, mask), _, _ = case.inputs()
    assert mask is not None and not mask[0].any()                   # a fully masked row
    case = next(c for c in grad_cases.suite("quick", ["linear.backward"]) if "random-bf16" in c.name)
    (x, weight, _), _, _ = case.inputs()
    assert x.dtype == weight.dtype == torch.bfloat16
    out = case.run("numpy")
    assert all(t.dtype == torch.float32 and _bits_equal(t, t.to(torch.bfloat16).float()) for t in out.values())


def test_cases_rebuild_to_the_same_inputs_and_the_upstream_gradient_comes_from_the_seed():
    for op in ("entropy.backward", "attention.backward", "kl_penalty.backward", "AdamW.step", "clip_grad_norm_"):
        case = grad_cases.suite("quick", [op])[0]
        first, second = case.run("numpy"), case.run("numpy")
        assert list(first) == list(case.tensors) and all(_bits_equal(first[t], second[t]) for t in first)
    case = grad_cases.suite("quick", ["moe.backward"])[0]
    other = grad_cases.suite("quick", ["moe.backward"], seed=1)[0]
    assert case.name == other.name and case.shapes["g"] == list(case.inputs()[2][0].shape)
    assert not torch.equal(case.inputs()[2][0], other.inputs()[2][0])


@pytest.mark.parametrize("op", sorted(DIFFERENTIABLE))
def test_every_input_gradient_and_parameter_gradient_is_recorded_separately(op):
    for case in grad_cases.suite("quick", [f"{op}.backward"]):
        args, _, _ = case.inputs()
        tensors = [name for name, i in grad_cases.WRT[op] if i < len(args) and isinstance(args[i], torch.Tensor)]
        assert list(case.tensors) == tensors and list(case.run("numpy")) == tensors


def test_a_backward_case_is_torch_autograd_of_the_public_op():
    """Independent of the runner: the weighted sum of the output, differentiated by .backward()."""
    case = next(c for c in grad_cases.suite("quick", ["linear.backward"]) if "/bias/" in c.name)
    (x, weight, bias), _, (g,) = case.inputs()
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    ops.linear(*leaves, backend="cpu").backward(g)
    got = case.run("cpu")
    assert all(_bits_equal(got[name], leaf.grad) for name, leaf in zip(("dx", "dweight", "dbias"), leaves))


def test_the_adamw_case_is_three_steps_of_bitparity_optim():
    case = next(c for c in grad_cases.suite("quick", ["AdamW.step"]) if "/default/" in c.name)
    weight, grads, hyper = case.inputs()
    p = torch.nn.Parameter(weight.clone())
    opt = optim.AdamW([p], **hyper, backend="cpu")
    for g in grads:
        p.grad = g.clone()
        opt.step()
    got = case.run("cpu")
    assert _bits_equal(got["weight"], p.detach()) and _bits_equal(got["exp_avg_sq"], opt.state[p]["exp_avg_sq"])
    assert not _bits_equal(got["weight"], weight)


def test_the_gradient_fold_case_is_one_backward_over_all_rows():
    """Spec 29.1: micro-batches of a power-of-two number of rows (the last shorter), folded by GradientFold, give
    the bits of one call over every row; torch's `.grad +=` (native) adds left to right and need not."""
    (case,) = grad_cases.suite("quick", ["GradientFold"])
    x, weight, bias, g = case.inputs()
    w, b = torch.nn.Parameter(weight.clone()), torch.nn.Parameter(bias.clone())
    ops.linear(x, w, b, backend="numpy").backward(g)
    folded = case.run("numpy")
    assert _bits_equal(folded["dweight"], w.grad) and _bits_equal(folded["dbias"], b.grad)
    assert x.shape[0] % grad_cases.FOLD_SHAPE["quick"][3] and x.shape[0] > 2 * grad_cases.FOLD_SHAPE["quick"][3]


def test_the_specials_of_the_training_steps_are_in_their_gradients():
    case = next(c for c in grad_cases.suite("quick", ["AdamW.step"]) if "/specials/" in c.name)
    _, grads, _ = case.inputs()
    second = grads[1].numpy()
    assert np.isnan(second[0]) and np.isposinf(second[1]) and np.isneginf(second[2]) and second[3] == 3.0e38
    case = next(c for c in grad_cases.suite("quick", ["clip_grad_norm_"]) if "inf-gradient" in c.name)
    grads, max_norm = case.inputs()
    assert torch.isinf(grads[1]).any() and max_norm == 1.0


def test_gradient_digests_are_per_tensor():
    case = grad_cases.suite("quick", ["attention.backward"])[0]
    out = case.run("numpy")
    digests = golden.tensor_digests(out)
    assert list(digests) == ["dq", "dk", "dv"] and digests["dq"] == golden.digest(out["dq"])


def test_suite_rejects_unknown_gradient_ops():
    with pytest.raises(ValueError, match="ops must be among"):
        grad_cases.suite("quick", ["softplus.backward"])
