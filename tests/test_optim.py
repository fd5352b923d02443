"""bitparity.optim: AdamW, SGD and the gradient-norm clip give the same bits on every backend (spec 29.10-29.12)
and torch's values within stated bounds; GradientFold makes gradients independent of the micro-batch size."""

import math

import numpy as np
import pytest
import torch

import bitparity as bp
from bitparity import optim
from bitparity.backends import _module


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
    # Micro-batches of whole 32-row blocks (spec 29.2) fold to one backward's bits, weight and bias; folding
    # micro-batches of 16 rows (which GradientFold refuses) and torch's left-to-right .grad += do not.
    gen = torch.Generator().manual_seed(4)
    x, g = torch.randn(256, 24, generator=gen), torch.randn(256, 16, generator=gen)
    w = torch.nn.Parameter(torch.randn(16, 24, generator=gen))
    b = torch.nn.Parameter(torch.randn(16, generator=gen))
    bp.linear(x, w, b, backend="numpy").backward(g)
    whole = [w.grad.clone(), b.grad.clone()]
    for micro in (32, 64, 128, 256):
        w.grad = b.grad = None
        fold = optim.GradientFold([w, b])
        for i in range(0, 256, micro):
            bp.linear(x[i:i + micro], w, b, backend="numpy").backward(g[i:i + micro])
            fold.add(micro)
        fold.finish()
        assert torch.equal(_bits(w.grad), _bits(whole[0])) and torch.equal(_bits(b.grad), _bits(whole[1])), micro
    halves = []
    for i in range(0, 256, 16):                                   # blocks cut in two: other roundings
        w.grad = None
        bp.linear(x[i:i + 16], w, backend="numpy").backward(g[i:i + 16])
        halves.append(w.grad.reshape(-1).clone())
    assert not torch.equal(_bits(_module("numpy").fold_rows(
        torch.stack(halves), torch.zeros(16, dtype=torch.int64), torch.arange(16), 16, 1)[0].reshape(16, 24)),
        _bits(whole[0]))
    w.grad = None
    for i in range(0, 256, 32):                                   # torch's own accumulation: left to right
        bp.linear(x[i:i + 32], w, backend="numpy").backward(g[i:i + 32])
    assert not torch.equal(_bits(w.grad), _bits(whole[0]))


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


# -- every binary32 input (spec 29.10-29.12, 1.7.0) ----------------------------------------------------------

# gradients whose g * g overflows (from 2^64) while c2 * g^2 fits (up to about 5.8e20 at beta2 = 0.999), whose
# term does not fit, infinities and NaN, and a normal one
SPECIAL_GRADIENTS = [1e20, -1e20, 2.0 ** 64, -5e20, 7e20, 1e30, float("inf"), float("-inf"), float("nan"), 1.0]


def _adamw_first_step(values, backend, lr):
    p = torch.nn.Parameter(torch.ones(len(values)))
    p.grad = torch.tensor(values)
    if backend is None:
        torch.optim.AdamW([p], lr=lr, weight_decay=0.0).step()
    else:
        optim.AdamW([p], lr=lr, weight_decay=0.0, backend=backend).step()
    return p.detach()


@pytest.mark.parametrize("lr", [1e-3, 0.0])
def test_adamw_on_overflowing_infinite_and_nan_gradients_is_torchs_value(any_backend, lr):
    """The issue's reproducer: g = +-1e20 moved w = 1 to -+inf (lr = 1e-3) or NaN (lr = 0) in 1.5.0. Now the step
    is the formula's: on a fresh state m/den = sign(g) (bias-corrected), so w = 1 - lr * sign(g) while c2 * g^2
    fits; w keeps its value where v overflows (1e30, 7e20) and is NaN for +-inf and NaN (inf/inf), as torch."""
    ours, theirs = _adamw_first_step(SPECIAL_GRADIENTS, any_backend, lr), _adamw_first_step(SPECIAL_GRADIENTS, None, lr)
    meaning = [1.0 - lr * np.sign(g) if abs(g) < 5.8e20 else 1.0 for g in SPECIAL_GRADIENTS[:6]]
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs))
    assert torch.isnan(ours[6:9]).all() and torch.isfinite(ours[[0, 1, 2, 3, 4, 5, 9]]).all()
    assert np.abs(ours[:6].double().numpy() - meaning).max() <= 2.0 ** -23
    assert float((ours - theirs).nan_to_num().abs().max()) <= 2.0 ** -23
    if lr == 0.0:
        assert torch.equal(ours[:6], torch.ones(6)) and float(ours[9]) == 1.0


def test_adamw_overflowing_square_is_not_the_unscaled_formula():
    """v holds c2 * g^2 rounded twice as with an unbounded exponent (float64 with exact power-of-two scaling here).
    Negative control: the formula evaluated as written, in numpy binary32 with IEEE's own 1/den, overflows g * g
    and leaves w = 1 (and 1.5.0's recip(+inf) = -inf gave +inf), so the test above tells the definitions apart."""
    p = torch.nn.Parameter(torch.ones(1))
    p.grad = torch.tensor([1e20])
    opt = optim.AdamW([p], lr=1e-3, weight_decay=0.0, backend="numpy")
    opt.step()
    g, c2 = float(np.float32(1e20)), float(np.float32(1 - 0.999))
    square = float(np.float32(g * g * 2.0 ** -128)) * 2.0 ** 128            # RN32 of g^2, exponent unbounded
    assert float(opt.state[p]["exp_avg_sq"]) == float(np.float32(c2 * square)) == pytest.approx(1e37, rel=1e-6)
    assert float(p.detach()) == pytest.approx(0.999, abs=2e-7)
    f = np.float32
    with np.errstate(over="ignore"):
        v = f(c2) * (f(g) * f(g))
        den = np.sqrt(v) * f(1 / math.sqrt(1 - 0.999)) + f(1e-8)
        written = f(1.0) - (f(0.1) * f(g) * (f(1.0) / den)) * f(1e-3 / 0.1)
    assert v == np.inf and written == 1.0


def test_adamw_keeps_later_steps_defined_after_an_overflow(any_backend):
    """After a 1e30 gradient v is +inf for good (the binary32 state cannot hold c2 * 1e60): later steps leave w
    as it is, as torch's AdamW does; the other elements keep moving, the same bits on every backend."""
    def run(backend):
        p = torch.nn.Parameter(torch.ones(2))
        opt = optim.AdamW([p], lr=1e-2, weight_decay=0.0, backend=backend)
        for g in ([1e30, 1.0], [1.0, 1.0], [-3.0, 2.0]):
            p.grad = torch.tensor(g)
            opt.step()
        return p.detach()
    ours = run(any_backend)
    assert float(ours[0]) == 1.0 and float(ours[1]) < 1.0
    assert torch.equal(_bits(ours), _bits(run("numpy")))


@pytest.mark.parametrize("eps", [2.0 ** -126, 1e-30, 3.4e38])
def test_adamw_eps_at_the_ends_of_its_domain(any_backend, eps):
    """eps32 = 2^-126 (den = eps32 where v = 0, recip's smallest input) and 3.4e38 (den >= 2^127, recip's e = 127
    scaling into the subnormal range): finite, the bits of numpy, within 2 ulp of torch's AdamW."""
    def run(backend):
        p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5, 3.0]))
        p.grad = torch.tensor([0.0, 1e-3, -4.0, 1e10])
        kw = {"lr": 1e-2, "eps": eps, "weight_decay": 0.0}
        (optim.AdamW([p], backend=backend, **kw) if backend else torch.optim.AdamW([p], **kw)).step()
        return p.detach()
    ours = run(any_backend)
    assert torch.isfinite(ours).all() and torch.equal(_bits(ours), _bits(run("numpy")))
    assert float((ours - run(None)).abs().max()) <= 2 * 2.0 ** -24 * 3.0


def test_sgd_infinite_gradient_and_zero_lr_are_ieee_as_torch(any_backend):
    for lr in (1e-2, 0.0):
        values = [float("inf"), -1e38, 1.0]
        ours, theirs = (torch.nn.Parameter(torch.ones(3)) for _ in range(2))
        ours.grad, theirs.grad = torch.tensor(values), torch.tensor(values)
        optim.SGD([ours], lr=lr, backend=any_backend).step()
        torch.optim.SGD([theirs], lr=lr).step()
        assert torch.equal(_bits(ours.detach()), _bits(theirs.detach()))


def _clip(grads, backend, **kw):
    params = [torch.nn.Parameter(torch.zeros(len(g))) for g in grads]
    for p, g in zip(params, grads):
        p.grad = torch.tensor(g, dtype=torch.float32)
    if backend is None:
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0, **kw)
    else:
        norm = optim.clip_grad_norm_(params, 1.0, backend=backend, **kw)
    return norm, [p.grad for p in params]


def test_clip_nan_gradient_makes_every_gradient_nan_as_torch(any_backend):
    """The issue's reproducer: 1.5.0 returned a NaN norm and left the gradients as they were (min(1.0, nan) is
    1.0 in Python). Now the coefficient is NaN, as torch.clamp gives."""
    norm, grads = _clip([[1.0, float("nan")], [2.0]], any_backend)
    _, theirs = _clip([[1.0, float("nan")], [2.0]], None)
    assert torch.isnan(norm) and all(torch.isnan(g).all() for g in grads) and all(torch.isnan(g).all() for g in theirs)


def test_clip_infinite_gradient_gives_coefficient_zero_as_torch(any_backend):
    norm, grads = _clip([[3.0, float("inf"), -2.0]], any_backend)
    _, theirs = _clip([[3.0, float("inf"), -2.0]], None)
    assert float(norm) == float("inf")
    assert torch.equal(_bits(grads[0]), _bits(torch.tensor([0.0, float("nan"), -0.0])))
    assert torch.equal(_bits(grads[0]), _bits(theirs[0]))


def test_clip_overflowing_squares_give_the_finite_norm(any_backend):
    """Finite gradients of norm 5e19: the squares overflow, the 2^-64-scaled sums do not, so the norm is the
    true one (within sqrt32's ulp of float64) and the gradients are scaled to norm 1. torch's norm is inf and it
    zeroes them (a documented difference), its error_if_nonfinite=True raises; ours does not."""
    values = [[3e19, 4e19], [1e-3, 2.5]]
    norm, grads = _clip(values, any_backend)
    want = math.sqrt(sum(v * v for g in values for v in g))
    assert abs(float(norm) - want) <= 2.0 ** -23 * want
    for g, v in zip(grads, values):
        assert torch.allclose(g.double(), torch.tensor(v, dtype=torch.float64) / want, rtol=2.0 ** -22, atol=0)
    assert torch.equal(_bits(torch.cat(grads)), _bits(torch.cat(_clip(values, "numpy")[1])))
    theirs_norm, theirs = _clip(values, None)
    assert float(theirs_norm) == float("inf") and float(torch.cat(theirs).abs().max()) == 0.0
    assert float(_clip(values, any_backend, error_if_nonfinite=True)[0]) == float(norm)     # finite: no error
    with pytest.raises(RuntimeError, match="non-finite"):
        _clip(values, None, error_if_nonfinite=True)


def test_clip_error_if_nonfinite_raises_before_any_gradient_changes(any_backend):
    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    p.grad, q.grad = torch.tensor([1.0, 2.0]), torch.tensor([float("inf")])
    with pytest.raises(RuntimeError, match="non-finite"):
        optim.clip_grad_norm_([p, q], 1.0, error_if_nonfinite=True, backend=any_backend)
    assert p.grad.tolist() == [1.0, 2.0]
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_([p, q], 1.0, error_if_nonfinite=True)        # torch raises the same


def test_clip_takes_torchs_signature_and_tensor_arguments(any_backend):
    values = [[3.0, 4.0], [], [1.0]]                           # a zero-size gradient is skipped
    base_norm, base = _clip(values, any_backend)
    for max_norm in (np.float32(1.0), np.float64(1.0), torch.tensor(1.0), torch.tensor([1.0])):
        params = [torch.nn.Parameter(torch.zeros(len(g))) for g in values]
        for p, g in zip(params, values):
            p.grad = torch.tensor(g, dtype=torch.float32)
        norm = optim.clip_grad_norm_(params, max_norm, 2, False, True, backend=any_backend)
        assert torch.equal(_bits(norm), _bits(base_norm))
        assert all(torch.equal(_bits(p.grad), _bits(g)) for p, g in zip(params, base))


def test_adamw_takes_numpy_and_tensor_hyper_parameters_as_torch(any_backend):
    def run(**kw):
        p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        p.grad = torch.tensor([0.5, 3.0])
        optim.AdamW([p], backend=any_backend, **kw).step()
        return _bits(p.detach())
    base = run(lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)
    assert torch.equal(run(lr=np.float64(1e-2), betas=(np.float64(0.9), torch.tensor(0.99)), eps=torch.tensor(1e-6,
                           dtype=torch.float64), weight_decay=np.float64(0.1)), base)
    assert torch.equal(run(lr=torch.tensor([1e-2], dtype=torch.float64), betas=(0.9, 0.99), eps=1e-6,
                           weight_decay=0.1), base)


def _state_bits(p, opt):
    return _bits(p.detach().clone()), {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                                       for k, v in opt.state[p].items()}


@pytest.mark.parametrize("key,value", [("lr", float("nan")), ("lr", -1e-3), ("eps", 0.0),
                                       ("weight_decay", float("inf")), ("betas", (0.9, 1.0))])
def test_a_scheduler_changed_group_is_refused_at_step_before_anything_changes(key, value):
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = optim.AdamW([p], lr=1e-2, backend="numpy")
    p.grad = torch.tensor([0.1, -0.2])
    opt.step()
    before = _state_bits(p, opt)
    opt.param_groups[0][key] = value
    with pytest.raises(ValueError, match=rf"param_groups\[0\]\['{key}'\]"):
        opt.step()
    after = _state_bits(p, opt)
    assert torch.equal(before[0], after[0]) and before[1]["step"] == after[1]["step"] == 1
    assert all(torch.equal(before[1][k], after[1][k]) for k in ("exp_avg", "exp_avg_sq"))


def test_a_step_that_would_overflow_is_refused_before_anything_changes():
    """lr / (1 - beta1^t) beyond binary32 at t = 1 (lr = 3e38, beta1 = 0.9); a second parameter is not updated
    either (every parameter's update is planned before any runs)."""
    p, q = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    p.grad, q.grad = torch.ones(1), torch.ones(1)
    opt = optim.AdamW([{"params": [p], "lr": 1e-3}, {"params": [q], "lr": 3e38}], weight_decay=0.0, backend="numpy")
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['lr'\].*t = 1"):
        opt.step()
    assert float(p.detach()) == 1.0 and float(q.detach()) == 1.0 and not opt.state[p]


def test_gradient_fold_counts_any_number_of_micro_batches_and_a_shorter_last():
    """3 micro-batches of 32 rows, and 32 + 32 + 26 rows: the fold pads with -0.0 subtrees, so both are one
    backward's bits (spec 29.1); so is one micro-batch of any size."""
    gen = torch.Generator().manual_seed(5)
    for total, micro in ((96, 32), (90, 32), (7, 7)):
        x, g = torch.randn(total, 8, generator=gen), torch.randn(total, 4, generator=gen)
        w = torch.nn.Parameter(torch.randn(4, 8, generator=gen))
        bp.linear(x, w, backend="numpy").backward(g)
        whole, w.grad = w.grad.clone(), None
        fold = optim.GradientFold([w])
        for i in range(0, total, micro):
            bp.linear(x[i:i + micro], w, backend="numpy").backward(g[i:i + micro])
            fold.add(len(range(i, min(i + micro, total))))
        fold.finish()
        assert torch.equal(_bits(w.grad), _bits(whole)), (total, micro)


def test_gradient_fold_refuses_layouts_that_are_not_one_backward_before_taking_the_gradient():
    """3 + 3 rows fold as ((c0+c1)+(c2+-0)) + ((c3+c4)+(c5+-0)), not one call's ((c0+c1)+(c2+c3)) + ((c4+c5)+-0):
    the second add is refused and .grad is left where it was; so are a larger and a second shorter micro-batch,
    and micro-batches of fewer rows than a linear gradient block (spec 29.2)."""
    w = torch.nn.Parameter(torch.zeros(2))
    for rows, message in (((3, 3), "not a power of two"), ((32, 64), "more than the first's 32"),
                          ((64, 32, 32), "only the last micro-batch may be shorter"),
                          ((16, 16), "fewer than the 32 of a linear gradient block")):
        fold = optim.GradientFold([w])
        for k, r in enumerate(rows):
            w.grad = torch.full((2,), float(k + 1))
            if k < len(rows) - 1:
                fold.add(r)
        with pytest.raises(ValueError, match=message):
            fold.add(rows[-1])
        assert w.grad.tolist() == [float(len(rows))] * 2


def test_gradient_fold_refuses_bf16_parameters_and_sparse_gradients():
    with pytest.raises(TypeError, match=r"params\[1\] has dtype torch.bfloat16.*float32 master"):
        optim.GradientFold([torch.nn.Parameter(torch.zeros(2)),
                            torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))])
    frozen = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16), requires_grad=False)
    optim.GradientFold([frozen]).add(4)                       # no gradient ever: nothing to round
    optim.AdamW([frozen, torch.nn.Parameter(torch.zeros(2))]).step()
    w = torch.nn.Parameter(torch.zeros(3))
    w.grad = torch.zeros(3).to_sparse()
    with pytest.raises(TypeError, match=r"params\[0\] is torch.sparse_coo"):
        optim.GradientFold([w]).add(4)
    assert w.grad.layout == torch.sparse_coo


@pytest.mark.parametrize("cls,kw", [(optim.AdamW, {"lr": 1e-2}), (optim.SGD, {"lr": 1e-2, "momentum": 0.9})])
def test_zero_size_parameters_are_stepped_as_nothing(any_backend, cls, kw):
    """A parameter with no elements is a defined no-op on every backend; its neighbour gets the bits it gets alone."""
    def run(with_empty):
        empty, q = torch.nn.Parameter(torch.zeros(0, 3)), torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        opt = cls([empty, q] if with_empty else [q], backend=any_backend, **kw)
        for g in ([0.5, 3.0], [-1.0, 0.25]):
            empty.grad, q.grad = torch.zeros(0, 3), torch.tensor(g)
            opt.step()
        return empty.detach(), _bits(q.detach())
    empty, with_empty = run(True)
    assert empty.shape == (0, 3) and torch.equal(with_empty, run(False)[1])


# -- the argument table: each argument, an out-of-domain value, the error and the words it must contain -------

def _adamw(**kw):
    return lambda backend: optim.AdamW([torch.nn.Parameter(torch.zeros(2))], backend=backend, **kw)


def _sgd(**kw):
    return lambda backend: optim.SGD([torch.nn.Parameter(torch.zeros(2))], backend=backend, **kw)


def _clip_with(*args, **kw):
    def call(backend):
        p = torch.nn.Parameter(torch.zeros(2))
        p.grad = torch.ones(2)
        optim.clip_grad_norm_([p], *args, backend=backend, **kw)
    return call


def _fold_add(rows):
    return lambda backend: optim.GradientFold([torch.nn.Parameter(torch.zeros(2))]).add(rows)


def _step_with(cls, grad, dtype=torch.float32, **kw):
    def call(backend):
        p = torch.nn.Parameter(torch.zeros(3, dtype=dtype))
        opt = cls([p], backend=backend, **kw)
        p.grad = grad
        opt.step()
    return call


def _added_group(**kw):
    def call(backend):
        opt = optim.AdamW([torch.nn.Parameter(torch.zeros(2))], backend=backend)
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))], **kw})
    return call


ARGUMENT_TABLE = [
    # (call, argument, bad value, exception, fragment of the message)
    (_adamw(lr=-1e-3), "lr", -1e-3, ValueError, "lr must be finite, >= 0"),
    (_adamw(lr=float("nan")), "lr", "nan", ValueError, "lr must be finite"),
    (_adamw(lr=float("inf")), "lr", "inf", ValueError, "lr must be finite"),
    (_adamw(lr=1e39), "lr", 1e39, ValueError, "at most 3.4e38"),
    (_adamw(lr=True), "lr", True, TypeError, "lr must be a real number"),
    (_adamw(lr="1e-3"), "lr", "'1e-3'", TypeError, "lr must be a real number"),
    (_adamw(lr=torch.tensor([1e-3, 1e-3])), "lr", "2-element tensor", TypeError, "lr as a tensor must hold one"),
    (_adamw(eps=0.0), "eps", 0.0, ValueError, "eps must be > 0"),
    (_adamw(eps=1e-40), "eps", "subnormal", ValueError, "eps must round to a normal binary32"),
    (_adamw(eps=1e39), "eps", 1e39, ValueError, "eps must be > 0 and finite"),
    (_adamw(eps=float("inf")), "eps", "inf", ValueError, "eps must be > 0 and finite"),
    (_adamw(betas=(1.0, 0.999)), "betas", "(1.0, 0.999)", ValueError, r"betas\[0\] must be in \[0, 1\)"),
    (_adamw(betas=(0.9, -0.1)), "betas", "(0.9, -0.1)", ValueError, r"betas\[1\] must be in \[0, 1\)"),
    (_adamw(betas=(0.9,)), "betas", "(0.9,)", ValueError, "betas must be a pair"),
    (_adamw(weight_decay=-0.1), "weight_decay", -0.1, ValueError, "weight_decay must be finite, >= 0"),
    (_adamw(lr=1e30, weight_decay=1e30), "lr * weight_decay", 1e60, ValueError, "decay factor"),
    (_added_group(eps=1e-45), "param_groups[1]['eps']", 1e-45, ValueError, r"param_groups\[1\]\['eps'\]"),
    (_sgd(lr=-1.0), "lr", -1.0, ValueError, "lr must be finite, >= 0"),
    (_sgd(momentum=float("nan")), "momentum", "nan", ValueError, "momentum must be finite"),
    (_sgd(momentum=-0.5), "momentum", -0.5, ValueError, "momentum must be finite, >= 0"),
    (_sgd(momentum=1e-50), "momentum", 1e-50, ValueError, "round to a nonzero binary32"),
    (_sgd(dampening=float("inf")), "dampening", "inf", ValueError, "dampening must be finite"),
    (_sgd(weight_decay=-1.0), "weight_decay", -1.0, ValueError, "weight_decay must be finite, >= 0"),
    (_sgd(nesterov=True), "nesterov", "True with momentum 0", ValueError, "nesterov needs momentum > 0"),
    (_sgd(momentum=0.9, nesterov="yes"), "nesterov", "'yes'", TypeError, "nesterov must be a bool"),
    (_step_with(optim.AdamW, torch.zeros(3).to_sparse()), "grad", "sparse", TypeError, "is torch.sparse_coo"),
    (_step_with(optim.SGD, torch.zeros(3).to_sparse()), "grad", "sparse", TypeError, "is torch.sparse_coo"),
    (_step_with(optim.AdamW, torch.zeros(3, dtype=torch.bfloat16), torch.bfloat16), "params", "bf16", TypeError,
     "float32 master weights"),
    (_step_with(optim.SGD, torch.zeros(3, dtype=torch.float16), torch.float16), "params", "fp16", TypeError,
     "float32 master weights"),
    (_clip_with(0.0), "max_norm", 0.0, ValueError, "max_norm must be finite and > 0"),
    (_clip_with(float("nan")), "max_norm", "nan", ValueError, "max_norm must be finite and > 0"),
    (_clip_with(float("inf")), "max_norm", "inf", ValueError, "max_norm must be finite and > 0"),
    (_clip_with(True), "max_norm", True, TypeError, "max_norm must be a real number"),
    (_clip_with(1.0, float("inf")), "norm_type", "inf", ValueError, "norm_type must be 2.0"),
    (_clip_with(1.0, "inf"), "norm_type", "'inf'", ValueError, "norm_type must be 2.0"),
    (_clip_with(1.0, 1), "norm_type", 1, ValueError, "norm_type must be 2.0"),
    (_clip_with(1.0, error_if_nonfinite="yes"), "error_if_nonfinite", "'yes'", TypeError,
     "error_if_nonfinite must be a bool"),
    (_clip_with(1.0, foreach=1), "foreach", 1, TypeError, "foreach must be a bool"),
    (_fold_add(0), "rows", 0, ValueError, "rows must be a positive int"),
    (_fold_add(4.0), "rows", 4.0, ValueError, "rows must be a positive int"),
    (_fold_add(True), "rows", True, ValueError, "rows must be a positive int"),
]


@pytest.mark.parametrize("call,argument,value,error,fragment", ARGUMENT_TABLE,
                         ids=[f"{i}-{row[1]}={row[2]}" for i, row in enumerate(ARGUMENT_TABLE)])
def test_argument_table(any_backend, call, argument, value, error, fragment):
    with pytest.raises(error, match=fragment):
        call(any_backend)


def test_clip_sparse_gradient_is_refused_by_name():
    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    p.grad, q.grad = torch.ones(2), torch.zeros(3).to_sparse()
    with pytest.raises(TypeError, match=r"parameters\[1\] must be dense float32"):
        optim.clip_grad_norm_([p, q], 1.0)
    assert p.grad.tolist() == [1.0, 1.0]


def test_native_backend_has_no_canonical_step():
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.ones(2)
    with pytest.raises(ValueError, match="no canonical adamw_step"):
        optim.AdamW([p], backend="native").step()


def test_state_dict_round_trip_continues_with_the_same_bits():
    """A checkpoint mid-training (torch's state_dict, with the binary64 beta powers) resumes to the bits of an
    uninterrupted run; a loaded group with an out-of-domain value is refused at the next step."""
    gen = torch.Generator().manual_seed(8)
    grads = [torch.randn(5, generator=gen) for _ in range(4)]

    def run(checkpoint_at, load=True):
        p = torch.nn.Parameter(torch.linspace(-1, 1, 5))
        opt = optim.AdamW([p], lr=1e-2, backend="cpu")
        for t, g in enumerate(grads):
            if t == checkpoint_at:
                saved_p, saved = p.detach().clone(), opt.state_dict()
                p = torch.nn.Parameter(saved_p)
                opt = optim.AdamW([p], lr=1e-2, backend="cpu")
                if load:
                    opt.load_state_dict(saved)
            p.grad = g.clone()
            opt.step()
        return _bits(p.detach()), opt
    straight, _ = run(None)
    resumed, opt = run(2)
    assert torch.equal(straight, resumed)
    assert not torch.equal(straight, run(2, load=False)[0])          # negative control: a fresh state differs
    saved = opt.state_dict()
    saved["param_groups"][0]["eps"] = 0.0
    opt.load_state_dict(saved)
    opt.param_groups[0]["params"][0].grad = grads[0].clone()
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['eps'\]"):
        opt.step()
