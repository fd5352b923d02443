"""Spec 26's gradients against float64 autograd, and the properties every canonical gradient has.

Accuracy: float64 torch autograd of the op's meaning (reference/float64.py's formulas, from the same
float32 scaled logits w = RN32(x * scale), spec 10), times the scale; for entropy, its closed form in float64
(_entropy_gradient64 says why). Errors are in float32 ulps of a
per-row floor, the scale each gradient is conditioned by (a sum of terms that may cancel is conditioned by
the sum of their magnitudes, as spec 10 measures sums):

| op | floor of row r (W = max(1, max abs(w)) over counted entries, spec 10's resolution of the log family) |
| --- | --- |
| logsumexp | W * abs(g) * max_i p_i |
| log_softmax | W * max_i (abs(g_i) + p_i * sum_j abs(g_j)) |
| softmax | max_i p_i * (abs(g_i) + sum_j p_j * abs(g_j)) |
| entropy | W * abs(g) * max_i p_i * (-log p_i + H) |
| token_logprobs | W * abs(g) |
| masked_mean | abs(g) / n |
| masked_whiten | max_i inv * (abs(g_i) + mean abs(g) + abs(z_i) * mean abs(g z)) |
"""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import bitparity as bp
from bitparity.reference import canonical

F32 = np.float32
# Tested bounds (ulps of the floor): the largest errors measured over the cases below, plus headroom.
# Measured (spec 26.12): logsumexp 0.24, log_softmax 0.12, softmax 1.78, entropy 0.43, token_logprobs 0.20,
# masked_mean 0.59, masked_whiten 0.73, kl_penalty 1.41 (k3), ppo_policy_loss 1.95.
BOUNDS = {"logsumexp": 1.0, "log_softmax": 1.0, "softmax": 2.5, "entropy": 1.5, "token_logprobs": 1.0,
          "masked_mean": 1.0, "masked_whiten": 2.0, "kl_penalty": 2.0, "ppo_policy_loss": 2.5}
VOCABS = (7, 1000, 32000, 151936)


def _ulps(got, ref, floor):
    spacing = np.spacing(np.maximum(np.abs(floor), np.finfo(F32).tiny).astype(F32)).astype(np.float64)
    return float(np.max(np.abs(got.astype(np.float64) - ref) / spacing))


def _rows(n, rows=8):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((rows, n)) * 3).astype(F32)
    x[0, 0] = 40.0                                          # one dominant token: a low-entropy row
    mask = rng.random((rows, n)) < 0.9
    return x, mask, rng.standard_normal((rows, n)).astype(F32), rng.standard_normal(rows).astype(F32)


def _entropy_gradient64(w, mask, scale, g_row):
    """dH/dx_i = p_i (a_i - H) * scale in closed form, in float64, with float64.py's accurate
    log S = log1p((count - 1) + rest) and a_i = log S - d_i. float64 autograd cannot be the yardstick here:
    at a dominant token it forms 1 - d(log S)/dw_0 with d(log S)/dw_0 = 1 - 1e-17, which cancels to 0."""
    wm = np.where(mask, w, -np.inf)
    d = wm - wm.max(1, keepdims=True)
    top = d == 0
    with np.errstate(invalid="ignore"):
        rest = np.where(top, 0.0, np.exp(d)).sum(1, keepdims=True)
        log_s = np.log1p((top.sum(1, keepdims=True) - 1) + rest)
        p = np.exp(d - log_s)
        a = np.where(mask, log_s - d, 0.0)
    h = (p * a).sum(1, keepdims=True)
    return np.where(mask, p * (a - h), 0.0) * g_row.astype(np.float64)[:, None] * float(scale)


def _float64_grads(x, mask, scale, g_rows, g_row, tokens):
    """{op: (d/dx in float64, floor per row [R, 1])} by torch autograd in float64."""
    w = torch.tensor((x * F32(scale)).astype(np.float64), requires_grad=True)
    m = torch.from_numpy(mask)
    wm = w.masked_fill(~m, -np.inf)
    p = torch.softmax(wm, 1).detach().numpy()
    lp = torch.log_softmax(wm, 1).detach().numpy()
    h = -(p * np.where(mask, lp, 0.0)).sum(1)
    gr, gv = g_row.astype(np.float64)[:, None], g_rows.astype(np.float64)
    # spec 10's factor for the log family: exp(w_i - shift) inherits the absolute rounding of w_i - shift.
    resolution = np.maximum(1.0, np.abs(np.where(mask, w.detach().numpy(), 0.0)).max(1, keepdims=True))
    out = {}

    def grad(y, g):
        (dw,) = torch.autograd.grad(y, w, torch.from_numpy(np.asarray(g, dtype=np.float64)), retain_graph=True)
        return dw.numpy() * float(scale)

    wm = w.masked_fill(~m, -np.inf)
    out["logsumexp"] = grad(torch.logsumexp(wm, 1), g_row), resolution * np.abs(gr) * p.max(1, keepdims=True)
    gm = np.where(mask, gv, 0.0)
    out["log_softmax"] = (grad(torch.log_softmax(wm, 1), gm),
                          resolution * (np.abs(gm) + p * np.abs(gm).sum(1, keepdims=True)).max(1, keepdims=True))
    out["softmax"] = (grad(torch.softmax(wm, 1), gv),
                      (p * (np.abs(gv) + (p * np.abs(gv)).sum(1, keepdims=True))).max(1, keepdims=True))
    out["entropy"] = (_entropy_gradient64(w.detach().numpy(), mask, scale, g_row),
                      resolution * np.abs(gr) * (p * (np.where(p > 0, -lp, 0.0) + h[:, None])).max(1, keepdims=True))
    chosen = torch.log_softmax(w, 1).gather(1, torch.from_numpy(tokens)[:, None])[:, 0]
    out["token_logprobs"] = grad(chosen, g_row), resolution * np.abs(gr)
    return out


def _canonical_grads(x, mask, scale, g_rows, g_row, tokens):
    gm = np.where(mask, g_rows, F32(0.0))
    return {
        "logsumexp": canonical.logsumexp_backward(x, mask, scale, g_row),
        "log_softmax": canonical.log_softmax_backward(canonical.log_softmax(x, mask, scale), mask, scale, gm),
        "softmax": canonical.softmax_backward(canonical.softmax(x, mask, scale), mask, scale, g_rows),
        "entropy": canonical.entropy_backward(x, mask, scale, canonical.entropy(x, mask, scale), g_row),
        "token_logprobs": canonical.token_logprobs_backward(x, tokens, scale, g_row),
    }


@pytest.mark.parametrize("n", VOCABS)
@pytest.mark.parametrize("temperature", (1.0, 0.7))
def test_softmax_family_gradients_within_bounds_of_float64(n, temperature):
    x, mask, g_rows, g_row = _rows(n)
    tokens = np.random.default_rng(n + 1).integers(0, n, x.shape[0])
    tokens[0] = 0                                                        # the dominant token itself
    scale = bp.ops.inverse_temperature(temperature)
    meaning = _float64_grads(x, mask, scale, g_rows, g_row, tokens)
    with np.errstate(all="ignore"):
        got = _canonical_grads(x, mask, np.full(x.shape[0], scale, dtype=F32), g_rows, g_row, tokens)
    for op, (ref, floor) in meaning.items():
        assert _ulps(got[op], ref, floor) <= BOUNDS[op], op


@pytest.mark.parametrize("n", (1, 2, 1000, 40000))
def test_masked_mean_and_whiten_gradients_within_bounds_of_float64(n):
    rng = np.random.default_rng(n)
    x0 = rng.standard_normal((1, n)).astype(F32)
    mask = rng.random((1, n)) < 0.8
    mask[0, 0] = True
    g = rng.standard_normal((1, n)).astype(F32)
    count = mask.sum()
    ref_mean = np.where(mask, g[:, :1].astype(np.float64) / count, 0.0)
    assert _ulps(canonical.masked_mean_backward(mask, g[:, 0]), ref_mean, g[0, 0] / count) <= BOUNDS["masked_mean"]
    eps = float(F32(1e-8))
    for shift_mean, unbiased, eps_mode, scale in ((True, True, "add", 1), (False, False, "add", 1),
                                                  (True, False, "clamp", 1), (True, False, "clamp", 1e-5)):
        # At scale 1e-5 the variance is below eps: "clamp" holds it constant, and c is +0.0 (spec 26.8).
        x = (x0 * F32(scale)).astype(F32)
        xt = torch.tensor(x.astype(np.float64), requires_grad=True)
        m = torch.from_numpy(mask)
        mean = xt[m].mean()
        d = xt - mean
        var = (d[m] ** 2).sum() / max(count - 1 if unbiased else count, 1)
        inv = 1 / torch.sqrt(var + eps if eps_mode == "add" else var.clamp(min=eps))
        out = d * inv + (0 if shift_mean else mean)
        gm = np.where(mask, g, 0.0)
        (ref,) = torch.autograd.grad(out, xt, torch.from_numpy(gm))
        z = (d * inv).detach().numpy()
        floor = float(inv.detach()) * (np.abs(gm) + np.abs(gm).sum() / count + np.abs(z) * np.abs(gm * z).sum() / count).max()
        got = canonical.masked_whiten_backward(x, mask, shift_mean, unbiased, F32(1e-8), eps_mode, g)
        assert _ulps(got, np.where(mask, ref.numpy(), 0.0), floor) <= BOUNDS["masked_whiten"]


def test_kl_and_ppo_gradients_within_bounds_of_float64():
    """Element-wise: relative ulps against float64 autograd from the same binary32 d (spec 16's yardstick)."""
    rng = np.random.default_rng(5)
    logp = -np.abs(rng.standard_normal((4, 500))).astype(F32)
    ref_logp = (logp + rng.standard_normal((4, 500)).astype(F32) * np.logspace(-6, 0.5, 500).astype(F32)).astype(F32)
    g = rng.standard_normal((4, 500)).astype(F32)
    d = torch.tensor((ref_logp - logp).astype(np.float64), requires_grad=True)
    for kind, meaning in (("k1", -d), ("abs", d.abs()), ("k2", d * d / 2), ("k3", torch.exp(d) - 1 - d)):
        (want,) = torch.autograd.grad(meaning, d, torch.from_numpy(g.astype(np.float64)))
        got = canonical.kl_penalty_backward(logp.ravel(), ref_logp.ravel(), kind, None, None, g.ravel())
        assert _ulps(got, want.numpy().ravel(), want.numpy().ravel()) <= BOUNDS["kl_penalty"], kind
    adv = rng.standard_normal((4, 500)).astype(F32)
    mask = rng.random((4, 500)) < 0.8
    lp = torch.tensor(logp.astype(np.float64), requires_grad=True)
    ratio = torch.exp(lp - torch.from_numpy(ref_logp.astype(np.float64)))
    a = torch.from_numpy(adv.astype(np.float64))
    loss = torch.maximum(-a * ratio, -a * ratio.clamp(float(F32(0.8)), float(F32(1.2))))
    (want,) = torch.autograd.grad((loss * torch.from_numpy(mask)).sum() / mask.sum(), lp)
    got = canonical.ppo_policy_loss_backward(logp, ref_logp, adv, mask, F32(0.8), F32(1.2), None, None,
                                             "token-mean", np.ones(1, F32))
    assert _ulps(got, want.numpy(), want.numpy()) <= BOUNDS["ppo_policy_loss"]


def test_token_logprobs_gradient_is_log_softmax_with_a_one_hot_gradient():
    """spec 26.6: the same bits as 26.3 when the upstream gradient is one-hot (and not -0.0)."""
    x, _, _, g_row = _rows(1000)
    tokens = np.arange(8) * 97
    one_hot = np.where(np.arange(1000)[None, :] == tokens[:, None], g_row[:, None], F32(0.0))
    scale = np.full(x.shape[0], 1.25, dtype=F32)
    with np.errstate(all="ignore"):
        via_rows = canonical.log_softmax_backward(canonical.log_softmax(x, None, scale), None, scale, one_hot)
        direct = canonical.token_logprobs_backward(x, tokens, scale, g_row)
    np.testing.assert_array_equal(direct.view(np.int32), via_rows.view(np.int32))


def test_per_row_temperature_gives_each_rows_scalar_gradient(any_backend):
    """spec 26.1: with a per-row temperature (the backend reads each row's scale) a row has its scalar call's bits."""
    x, _, _, g_row = _rows(1000, rows=4)
    temps = torch.tensor([0.3, 0.7, 1.0, 1.9])
    tokens = torch.tensor([0, 5, 999, 40])
    for op in ("logsumexp", "entropy", "token_logprobs"):
        args = (tokens,) if op == "token_logprobs" else (None,)
        xs = torch.from_numpy(x).requires_grad_()
        (per_row,) = torch.autograd.grad(getattr(bp, op)(xs, *args, temps, backend=any_backend), xs,
                                         torch.from_numpy(g_row))
        for r, t in enumerate(temps.tolist()):
            xr = torch.from_numpy(x[r:r + 1]).requires_grad_()
            rargs = (tokens[r:r + 1],) if op == "token_logprobs" else (None,)
            (alone,) = torch.autograd.grad(getattr(bp, op)(xr, *rargs, t, backend=any_backend), xr,
                                           torch.from_numpy(g_row[r:r + 1]))
            assert torch.equal(per_row[r:r + 1].view(torch.int32), alone.view(torch.int32)), (op, r)


def _grad_rows(backend, x, tokens, g):
    xs = x.clone().requires_grad_()
    return torch.autograd.grad(bp.token_logprobs(xs, tokens, 0.7, backend=backend), xs, g)[0]


def test_input_gradients_are_batch_invariant_and_repeatable(any_backend):
    """A row's gradient does not depend on the rows around it, their number or order, or the run."""
    x, _, _, g_row = _rows(3000, rows=6)
    x, g = torch.from_numpy(x), torch.from_numpy(g_row)
    tokens = torch.tensor([0, 1, 2999, 17, 1500, 3])
    batch = _grad_rows(any_backend, x, tokens, g)
    assert torch.equal(batch.view(torch.int32), _grad_rows(any_backend, x, tokens, g).view(torch.int32))
    order = torch.tensor([5, 3, 1, 0, 2, 4])
    permuted = _grad_rows(any_backend, x[order], tokens[order], g[order])
    assert torch.equal(permuted.view(torch.int32), batch[order].view(torch.int32))
    alone = _grad_rows(any_backend, x[2:3], tokens[2:3], g[2:3])
    assert torch.equal(alone.view(torch.int32), batch[2:3].view(torch.int32))


@given(rows=st.integers(1, 4), n=st.integers(1, 2100), temperature=st.sampled_from([1.0, 0.7, 3.0]),
       seed=st.integers(0, 2 ** 16), masked=st.booleans())
def test_cpu_gradients_have_the_numpy_bits(rows, n, temperature, seed, masked):
    """Property: for any shape, mask and temperature, the cpu backend's softmax-family gradients are numpy's bits."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=gen) * 5
    mask = (torch.rand(rows, n, generator=gen) < 0.7) if masked else None
    g = torch.randn(rows, n, generator=gen)
    for op in ("log_softmax", "softmax", "entropy"):
        grads = []
        for backend in ("numpy", "cpu"):
            xs = x.clone().requires_grad_()
            y = getattr(bp, op)(xs, mask, temperature, backend=backend)
            grads.append(torch.autograd.grad(y, xs, g if y.dim() == 2 else g[:, 0])[0])
        assert torch.equal(grads[0].view(torch.int32), grads[1].view(torch.int32)), op
