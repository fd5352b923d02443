"""bitparity.optim: AdamW, SGD and the gradient-norm clip give the same bits on every backend (spec 29.10-29.12)
and torch's values within stated bounds; GradientFold makes gradients independent of the micro-batch size."""

import numpy as np
import pytest
import torch

import bitparity as bp
from bitparity import optim


def _bits(t):
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t).view(torch.int32)


def _run(cls, backend, steps=4, **kw):
    """A [6, 7] parameter (with exact zeros, tiny and large values) after `steps` updates by seeded gradients."""
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(6, 7, generator=gen)
    w[0, :3] = torch.tensor([0.0, -0.0, 1e-30])
    p = torch.nn.Parameter(w)
    opt = cls([p], backend=backend, **kw) if backend is not None else cls([p], **kw)
    for _ in range(steps):
        g = torch.randn(6, 7, generator=gen) * 10.0
        g[1, :3] = torch.tensor([0.0, 1e-20, -3e4])             # v = 0, v subnormal (sqrt32's floor), large
        p.grad = g
        opt.step()
    return p.detach()


SETTINGS = [(optim.AdamW, torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
            (optim.AdamW, torch.optim.AdamW, {"lr": 3e-4, "betas": (0.8, 0.99), "weight_decay": 0.0}),
            (optim.SGD, torch.optim.SGD, {"lr": 1e-2}),
            (optim.SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "weight_decay": 1e-3, "nesterov": True}),
            (optim.SGD, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "dampening": 0.5})]


@pytest.mark.parametrize("cls,_,kw", SETTINGS)
def test_optimizers_same_bits_on_every_backend(backend, cls, _, kw):
    assert torch.equal(_bits(_run(cls, backend, **kw)), _bits(_run(cls, "numpy", **kw)))


@pytest.mark.parametrize("cls,torch_cls,kw", SETTINGS)
def test_optimizers_follow_torch_within_rounding(cls, torch_cls, kw):
    ours, theirs = _run(cls, "numpy", **kw), _run(torch_cls, None, **kw)
    assert float((ours - theirs).abs().max()) <= 4 * 2.0 ** -24 * float(theirs.abs().max())


def test_adamw_is_not_torchs_bits():
    """The negative control: torch's AdamW (lerp, division, its sqrt) is another order."""
    kw = SETTINGS[0][2]
    assert not torch.equal(_bits(_run(optim.AdamW, "numpy", **kw)), _bits(_run(torch.optim.AdamW, None, **kw)))


def test_clip_grad_norm_same_bits_and_torchs_value(any_backend):
    gen = torch.Generator().manual_seed(2)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in ((5, 3), (40,), (1,))]
    grads = [torch.randn(p.shape, generator=gen) * 3 for p in params]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    norm = optim.clip_grad_norm_(params, 1.0, backend=any_backend)
    theirs = [torch.nn.Parameter(torch.zeros(p.shape)) for p in params]
    for p, g in zip(theirs, grads):
        p.grad = g.clone()
    want = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert abs(float(norm) - float(want)) <= 2 * 2.0 ** -24 * float(want)
    reference = [torch.nn.Parameter(torch.zeros(p.shape)) for p in params]
    for p, g in zip(reference, grads):
        p.grad = g.clone()
    optim.clip_grad_norm_(reference, 1.0, backend="numpy")
    for p, q in zip(params, reference):
        assert torch.equal(_bits(p.grad), _bits(q.grad))


def test_gradient_fold_is_micro_batch_invariant_and_torch_accumulation_is_not():
    gen = torch.Generator().manual_seed(4)
    x, g = torch.randn(32, 24, generator=gen), torch.randn(32, 16, generator=gen)
    w = torch.nn.Parameter(torch.randn(16, 24, generator=gen))
    bp.linear(x, w, backend="numpy").backward(g)
    whole = w.grad.clone()
    for micro in (1, 4, 8, 16, 32):
        w.grad = None
        fold = optim.GradientFold([w])
        for i in range(0, 32, micro):
            bp.linear(x[i:i + micro], w, backend="numpy").backward(g[i:i + micro])
            fold.add()
        fold.finish()
        assert torch.equal(_bits(w.grad), _bits(whole)), micro
    w.grad = None
    for i in range(0, 32, 4):                                     # torch's own accumulation: left to right
        bp.linear(x[i:i + 4], w, backend="numpy").backward(g[i:i + 4])
    assert not torch.equal(_bits(w.grad), _bits(whole))


def test_bad_arguments_are_named():
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="betas"):
        optim.AdamW([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([p], nesterov=True)
    with pytest.raises(ValueError, match="max_norm"):
        optim.clip_grad_norm_([p], 0.0)
    half = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    half.grad = torch.ones(2, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="float32 master weights"):
        optim.AdamW([half]).step()
    with pytest.raises(ValueError, match="no micro-batch"):
        optim.GradientFold([p]).finish()
    assert np.float32(optim.clip_grad_norm_([p], 1.0)) == 0.0
