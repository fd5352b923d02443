"""The float64 backward meanings compare measures against (reference/float64.py): each closed form equals float64
torch autograd of the op's formula, an independent computation, on ordinary inputs (where autograd does not
cancel); and the spec's special-value conventions hold where the closed forms carry them."""

import numpy as np
import torch

from bitparity.reference import float64

F64 = torch.float64


def _grad(fn, inputs, g):
    leaves = [torch.tensor(a, dtype=F64, requires_grad=True) for a in inputs]
    return [t.numpy() for t in torch.autograd.grad(fn(*leaves), leaves, torch.tensor(g, dtype=F64))]


def _close(a, b):
    return np.allclose(a, b, rtol=1e-11, atol=1e-13 * max(1.0, float(np.abs(b).max())))


def _rows(shape, seed, scale=3.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def test_softmax_family_closed_forms_are_float64_autograd():
    x, g_rows, g_row = _rows((5, 40), 0), _rows((5, 40), 1, 1.0), _rows((5,), 2, 1.0)
    mask = np.random.default_rng(3).random((5, 40)) < 0.8
    tokens = np.array([0, 3, 39, 7, 11])
    scale = np.float32(1 / 0.7)
    w = (x * scale).astype(np.float64)
    m = torch.from_numpy(mask)

    def masked(t):
        return t.masked_fill(~m, -np.inf)
    cases = {"logsumexp": (mask, g_row, lambda t: torch.logsumexp(masked(t), 1)),
             "log_softmax": (mask, g_rows, lambda t: torch.log_softmax(masked(t), 1).masked_fill(~m, 0.0)),
             "softmax": (mask, g_rows, lambda t: torch.softmax(masked(t), 1)),
             "entropy": (mask, g_row, lambda t: -(torch.softmax(masked(t), 1)
                                                   * torch.log_softmax(masked(t), 1).masked_fill(~m, 0.0)).sum(1)),
             "token_logprobs": (tokens, g_row,
                                lambda t: torch.log_softmax(t, 1).gather(1, torch.from_numpy(tokens)[:, None])[:, 0])}
    for op, (second, g, fn) in cases.items():
        got, floor = float64.softmax_family_backward(op, x, second, scale, g)
        (want,) = _grad(fn, [w], g.astype(np.float64))
        assert _close(got, want * float(scale)), op
        assert floor.shape == (5, 1) and np.all(floor > 0), op


def test_entropy_gives_zero_where_exp_underflows_even_in_a_nan_row():
    x = np.array([[0.0, 1.0, -np.inf], [np.inf, 0.0, 1.0]], dtype=np.float32)
    dx, _ = float64.softmax_family_backward("entropy", x, None, 1.0, np.ones(2, dtype=np.float32))
    assert dx[0, 2] == 0.0 and np.isnan(dx[1, 0]) and np.all(dx[1, 1:] == 0.0)     # spec 26.5's select


def test_rl_loss_closed_forms_are_float64_autograd():
    rng = np.random.default_rng(4)
    x, g = _rows((3, 17), 5), _rows((3, 17), 6, 1.0)
    mask = rng.random((3, 17)) < 0.7
    for shift_mean, unbiased in ((True, True), (False, False)):
        got, _ = float64.masked_whiten_backward(x, mask, shift_mean, unbiased, 1e-8, "add", g)
        for r in range(3):
            def whiten(t, r=r):
                m = torch.from_numpy(mask[r])
                n = m.sum()
                mean = t[m].sum() / n
                var = ((t - mean)[m] ** 2).sum() / ((n - 1) if unbiased else n)
                out = (t - mean) / torch.sqrt(var + float(np.float32(1e-8))) + (0.0 if shift_mean else mean)
                return torch.where(m, out, 0.0)
            (want,) = _grad(whiten, [x[r].astype(np.float64)], g[r].astype(np.float64))
            assert _close(got[r], want)
    logp, ref_logp, upstream = -np.abs(_rows((4, 9), 7, 1.0)), -np.abs(_rows((4, 9), 8, 1.0)), _rows((4, 9), 24, 1.0)
    d = (ref_logp - logp).astype(np.float64)          # the binary32 log-ratio the spec starts from (spec 16)
    for kind, fn in (("k1", lambda t: -t), ("k2", lambda t: 0.5 * t * t), ("k3", lambda t: torch.expm1(t) - t)):
        dlogp, dref = float64.kl_penalty_backward(logp, ref_logp, kind, None, None, upstream)
        (want,) = _grad(fn, [d], upstream)
        assert _close(dref, want) and _close(dlogp, -want), kind


def test_model_block_closed_forms_are_float64_autograd():
    x, w, g = _rows((6, 8), 9, 1.0), _rows((5, 8), 10, 1.0), _rows((6, 5), 11, 1.0)
    bias = _rows((5,), 12, 1.0)
    got = float64.linear_backward(x, w, bias, g)
    want = _grad(lambda a, b, c: a @ b.T + c, [x, w, bias], g)
    assert all(_close(a, b) for a, b in zip(got, want))
    weight, gn = _rows((8,), 13, 1.0), _rows((6, 8), 14, 1.0)
    got = float64.rms_norm_backward(x, weight, 1e-6, gn)
    eps = float(np.float32(1e-6))
    want = _grad(lambda a, b: a / torch.sqrt((a * a).mean(1, keepdim=True) + eps) * b, [x, weight], gn)
    assert all(_close(a, b) for a, b in zip(got, want))
    gate, up, gs = _rows((50,), 15), _rows((50,), 16, 1.0), _rows((50,), 17, 1.0)
    got = float64.silu_mul_backward(gate, up, gs)
    want = _grad(lambda a, b: a * torch.sigmoid(a) * b, [gate, up], gs)
    assert all(_close(a, b) for a, b in zip(got, want))
    q, k, v, ga = _rows((2, 4, 8), 18, 1.0), _rows((2, 6, 8), 19, 1.0), _rows((2, 6, 8), 20, 1.0), _rows((2, 4, 8), 21)
    lengths = np.array([6, 4])
    got = float64.attention_backward(q, k, v, lengths, False, 0.35, ga)
    keep = torch.from_numpy(np.arange(6)[None, None, :] < lengths[:, None, None])

    def attend(a, b, c):
        s = torch.einsum("gid,gjd->gij", a, b) * 0.35
        return torch.einsum("gij,gjd->gid", torch.softmax(s.masked_fill(~keep, -np.inf), -1), c)
    want = _grad(attend, [q, k, v], ga)
    assert all(_close(a, b) for a, b in zip(got, want))


def test_optimizer_meanings_follow_torch_in_float64():
    weight, grads = _rows((30,), 22, 1.0), [_rows((30,), 23 + i, 0.1) for i in range(3)]
    p = torch.nn.Parameter(torch.tensor(weight, dtype=F64))
    opt = torch.optim.AdamW([p], lr=1e-2, weight_decay=0.1)
    for gr in grads:
        p.grad = torch.tensor(gr, dtype=F64)
        opt.step()
    w, m, v = float64.adamw_steps(weight, grads, 1e-2, (0.9, 0.999), 1e-8, 0.1)
    assert _close(w, p.detach().numpy()) and _close(v, opt.state[p]["exp_avg_sq"].numpy())
    p = torch.nn.Parameter(torch.tensor(weight, dtype=F64))
    opt = torch.optim.SGD([p], lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False)
    for gr in grads:
        p.grad = torch.tensor(gr, dtype=F64)
        opt.step()
    w, buf = float64.sgd_steps(weight, grads, 0.05, 0.9, 0.1, 0.01)
    assert _close(w, p.detach().numpy()) and _close(buf, opt.state[p]["momentum_buffer"].numpy())
    norm, clipped = float64.clip_grad_norm([grads[0], np.array([np.inf], dtype=np.float32)], 1.0)
    assert norm == np.inf and np.all(clipped[0] == 0.0) and np.isnan(clipped[1][0])      # torch: coef 0, inf * 0
