"""RL operators: every canonical backend gives the numpy backend's bits, and GAE ignores padding."""

import functools

import numpy as np
import pytest
import torch

import bitparity as bp
from bitparity.compare import cases
from bitparity.compare.metrics import canonical_bits
from tests.conftest import _checked, backend_cases

SHAPES = ((1, 1), (3, 7), (257, 33), (16, 1025), (2, 8192))
GAMMA_LAMBDA = ((0.0, 0.0), (0.5, 0.5), (0.95, 0.95), (1.0, 1.0), (0.99, 0.0), (0.0, 1.0))


def assert_same_bits(got, want):
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        gb, wb = canonical_bits(g), canonical_bits(w)
        bad = (gb != wb).nonzero()
        assert bad.numel() == 0, f"{bad.shape[0]} of {gb.numel()} differ; first at {bad[0].tolist()}"


@functools.cache
def rl_batch(b, t):
    d = cases.make_rl_batch(b, t, seed=b * 7 + t)
    rng = np.random.default_rng(b + t)
    extreme = torch.from_numpy(rng.random((b, t)) < 0.01)
    d["rewards"] = torch.where(extreme, torch.tensor(1e30) * torch.sign(d["rewards"]), d["rewards"])
    d["random_mask"] = torch.from_numpy(rng.random((b, t)) < 0.7)
    return d


# GAE is a loop over time steps: the interpreter runs it up to t = 1025 (the 8192-step row took 80 s there).
@pytest.mark.parametrize("backend,b,t", backend_cases(SHAPES, lambda b, t: t <= 1025))
def test_gae_matches_canonical(backend, b, t):
    _checked(backend)
    d = rl_batch(b, t)
    boot = torch.randn(b, generator=torch.Generator().manual_seed(b))
    for mask_key in ("mask", "random_mask"):
        for gamma, lam in GAMMA_LAMBDA:
            for mode in ("carry", "zero"):
                args = (d["rewards"], d["values"], d[mask_key], gamma, lam)
                kw = {"bootstrap": boot, "mask_mode": mode}
                assert_same_bits(bp.gae(*args, **kw, backend=backend), bp.gae(*args, **kw, backend="numpy"))


@pytest.mark.parametrize("b,t", SHAPES, ids=str)
def test_masked_mean_and_whiten_match_canonical(backend, b, t):
    d = rl_batch(b, t)
    for mask_key in ("mask", "random_mask"):
        x, m = d["advantages"], d[mask_key]
        for dim in (None, 0, 1):
            assert_same_bits(bp.masked_mean(x, m, dim, backend=backend), bp.masked_mean(x, m, dim, backend="numpy"))
        for shift in (True, False):
            for unbiased, eps_mode in ((True, "add"), (False, "add"), (False, "clamp")):
                kw = {"shift_mean": shift, "unbiased": unbiased, "eps_mode": eps_mode}
                assert_same_bits(bp.masked_whiten(x, m, **kw, backend=backend),
                                 bp.masked_whiten(x, m, **kw, backend="numpy"))


@pytest.mark.parametrize("b,t", SHAPES, ids=str)
def test_kl_and_ppo_match_canonical(backend, b, t):
    d = rl_batch(b, t)
    logp, ref = d["logp"], d["ref_logp"]
    for kind in bp.ops.KL_KINDS:
        for kw in ({}, {"clamp": 10.0, "log_ratio_clamp": 20.0}):
            assert_same_bits(bp.kl_penalty(logp, ref, kind, **kw, backend=backend),
                             bp.kl_penalty(logp, ref, kind, **kw, backend="numpy"))
    for agg in bp.ops.PPO_AGGS:
        for kw in ({}, {"dual_clip": 3.0, "clip_high": 0.28}, {"ratio_clamp": None}):
            args = (logp, d["old_logp"], d["advantages"], d["random_mask"])
            assert_same_bits(bp.ppo_policy_loss(*args, agg=agg, **kw, backend=backend),
                             bp.ppo_policy_loss(*args, agg=agg, **kw, backend="numpy"))


def test_kl_specials_match_canonical(backend):
    inf, nan = float("inf"), float("nan")
    logp = torch.tensor([0.0, 0.0, 0.0, 0.0, -inf, 0.0, 1e-30, -50.0])
    ref = torch.tensor([inf, -inf, nan, 1e-7, 0.0, 100.0, 0.0, 40.0])
    for kind in bp.ops.KL_KINDS:
        for kw in ({}, {"clamp": 10.0, "log_ratio_clamp": 20.0}):
            assert_same_bits(bp.kl_penalty(logp, ref, kind, **kw, backend=backend),
                             bp.kl_penalty(logp, ref, kind, **kw, backend="numpy"))


@pytest.mark.parametrize("mode", ("carry", "zero"))
def test_gae_is_padding_invariant(any_backend, mode):
    """A sequence's advantages and returns are the same bits left-padded, right-padded or alone."""
    rng = np.random.default_rng(9)
    t, pad = 300, 77
    r = torch.from_numpy(rng.standard_normal(t).astype(np.float32))
    v = torch.from_numpy(rng.standard_normal(t).astype(np.float32))
    boot = torch.tensor([0.0 if mode == "zero" else 0.5])   # zero mode: TRL/OpenRLHF have no bootstrap
    junk = torch.from_numpy(rng.standard_normal(pad).astype(np.float32)) * 1e3
    alone = bp.gae(r[None], v[None], None, 0.97, 0.9, bootstrap=boot, mask_mode=mode, backend=any_backend)
    on = torch.ones(t, dtype=torch.bool)
    off = torch.zeros(pad, dtype=torch.bool)
    layouts = {
        "left": (torch.cat([junk, r]), torch.cat([junk, v]), torch.cat([off, on]), slice(pad, None)),
        "right": (torch.cat([r, junk]), torch.cat([v, junk]), torch.cat([on, off]), slice(0, t)),
    }
    for name, (rr, vv, mm, keep) in layouts.items():
        # The padded sequence sits in a batch with an unrelated one, in either row.
        other = torch.from_numpy(rng.standard_normal(t + pad).astype(np.float32))
        for row in (0, 1):
            rows = [other, rr] if row else [rr, other]
            vals = [other, vv] if row else [vv, other]
            masks = [torch.ones(t + pad, dtype=torch.bool), mm] if row else [mm, torch.ones(t + pad, dtype=torch.bool)]
            adv, ret = bp.gae(torch.stack(rows), torch.stack(vals), torch.stack(masks), 0.97, 0.9,
                              bootstrap=torch.cat([boot, boot]), mask_mode=mode, backend=any_backend)
            assert torch.equal(canonical_bits(adv[row, keep]), canonical_bits(alone[0][0])), (name, row)
            assert torch.equal(canonical_bits(ret[row, keep]), canonical_bits(alone[1][0])), (name, row)


def test_gae_rows_are_independent(any_backend):
    d = rl_batch(257, 33)
    full = bp.gae(d["rewards"], d["values"], d["random_mask"], 0.99, 0.95, backend=any_backend)
    for r in (0, 100, 256):
        alone = bp.gae(d["rewards"][r:r + 1], d["values"][r:r + 1], d["random_mask"][r:r + 1], 0.99, 0.95,
                       backend=any_backend)
        assert torch.equal(canonical_bits(alone[0][0]), canonical_bits(full[0][r]))
        assert torch.equal(canonical_bits(alone[1][0]), canonical_bits(full[1][r]))
