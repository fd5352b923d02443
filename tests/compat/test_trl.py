"""bitparity.compat.trl against float64 renderings of TRL 1.10's PPO advantages and masked statistics, and its
TRL 1.16 log-prob helpers against float64, against TRL's own functions (when TRL is installed) and across
backends, bit for bit."""

import numpy as np
import pytest
import torch

import bitparity
from bitparity.compat import trl

from .batches import masked_whiten64


def _trl_batch(b=6, t=30, seed=1):
    """TRL's layout: right-padded responses; sequence_lengths is the last kept index (-1 for an empty one)."""
    rng = np.random.default_rng(seed)
    seq_len = rng.integers(-1, t - 1, b)
    seq_len[0], seq_len[1] = -1, t - 1                           # an empty response and a full one
    idx = np.arange(t)[None, :]
    padding_mask = torch.from_numpy(idx > seq_len[:, None])
    padding_mask_p1 = torch.from_numpy(idx > seq_len[:, None] + 1)
    rewards = torch.from_numpy(rng.standard_normal((b, t)).astype(np.float32)).masked_fill(padding_mask_p1, 0.0)
    values = torch.from_numpy(rng.standard_normal((b, t)).astype(np.float32))
    return rewards, values, padding_mask, padding_mask_p1


def _advantages64(r, v, padding_mask, padding_mask_p1, gamma, lam):
    v = np.where(padding_mask_p1, 0.0, v)
    adv, last = np.zeros_like(r), np.zeros(r.shape[0])
    for t in reversed(range(r.shape[1])):
        next_v = v[:, t + 1] if t + 1 < r.shape[1] else 0.0
        last = (r[:, t] + gamma * next_v - v[:, t]) + gamma * lam * last
        adv[:, t] = last
    returns = adv + v
    return np.where(padding_mask, 0.0, masked_whiten64(adv, ~padding_mask)), returns


def test_compute_advantages_reproduces_the_trainer():
    r, v, pm, pm1 = _trl_batch()
    adv, ret = trl.compute_advantages(r, v, pm, pm1, 1.0, 0.95)
    want_adv, want_ret = _advantages64(r.double().numpy(), v.double().numpy(), pm.numpy(), pm1.numpy(), 1.0, 0.95)
    for got, want in ((adv, want_adv), (ret, want_ret)):
        np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=4e-6 * np.abs(want).max())


def test_the_ordinary_response_mask_is_not_trls_layout():
    """With ~padding_mask in place of ~padding_mask_p1 the advantages come out visibly different."""
    r, v, pm, pm1 = _trl_batch()
    right, _ = trl.compute_advantages(r, v, pm, pm1, 1.0, 0.95)
    wrong, _ = trl.compute_advantages(r, v, pm, pm, 1.0, 0.95)
    assert (right - wrong).abs().max() > 1e-2 * right.abs().max()


def test_masked_statistics():
    r, v, pm, _ = _trl_batch()
    m = ~pm
    x = v.double().numpy()[m.numpy()]
    np.testing.assert_allclose(float(trl.masked_mean(v, m)), x.mean(), rtol=1e-6)
    np.testing.assert_allclose(float(trl.masked_var(v, m)), x.var(ddof=1), rtol=1e-5)
    np.testing.assert_allclose(float(trl.masked_var(v, m, unbiased=False)), x.var(), rtol=1e-5)
    with pytest.raises(ValueError, match="mask has no True entry"):
        trl.masked_var(v, torch.zeros_like(m))


LOGITS = 3 * torch.randn(3, 5, 100, generator=torch.Generator().manual_seed(0))
INDEX = torch.randint(0, 100, (3, 5), generator=torch.Generator().manual_seed(1))
INDEX_K = torch.randint(0, 100, (3, 5, 2), generator=torch.Generator().manual_seed(2))
ROW_MASK = torch.rand(3, 5, generator=torch.Generator().manual_seed(3)) > 0.3


def _log_softmax64(temperature):
    return torch.log_softmax(LOGITS.double() / temperature, -1)


def _entropy64(temperature):
    logp = _log_softmax64(temperature)
    return -(logp.exp() * logp).sum(-1)


# float64 bound: a log-prob is w_i - max - log S with w = x * RN32(1/T) (spec 8.1): a few float32 roundings of
# |w| <= 3 * 4.3 / 0.7, plus the 1/T rounding's relative 2^-24 of |w|
ATOL = 4e-6


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selective_log_softmax_one_or_k_indices(temperature):
    want = _log_softmax64(temperature)
    got = trl.selective_log_softmax(LOGITS, INDEX, temperature)
    np.testing.assert_allclose(got.double(), want.gather(-1, INDEX[..., None])[..., 0], rtol=0, atol=ATOL)
    got_k = trl.selective_log_softmax(LOGITS, INDEX_K, temperature=temperature)
    np.testing.assert_allclose(got_k.double(), want.gather(-1, INDEX_K), rtol=0, atol=ATOL)
    masked = trl.selective_log_softmax(LOGITS, INDEX, temperature, row_mask=ROW_MASK.int())
    assert torch.equal(masked[~ROW_MASK], torch.zeros(int((~ROW_MASK).sum())))
    assert torch.equal(masked[ROW_MASK].view(torch.int32), got[ROW_MASK].view(torch.int32))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropies(temperature):
    logprobs, entropy = trl.selective_log_softmax_and_entropy(LOGITS, INDEX, temperature=temperature,
                                                             row_mask=ROW_MASK)
    want = _entropy64(temperature)
    np.testing.assert_allclose(entropy[ROW_MASK].double(), want[ROW_MASK], rtol=0, atol=ATOL)
    assert torch.equal(entropy[~ROW_MASK], torch.zeros(int((~ROW_MASK).sum())))
    assert torch.equal(logprobs.view(torch.int32),
                       trl.selective_log_softmax(LOGITS, INDEX, temperature, ROW_MASK).view(torch.int32))
    np.testing.assert_allclose(trl.entropy_from_logits(LOGITS).double(), _entropy64(1.0), rtol=0, atol=ATOL)
    assert torch.equal(trl.entropy_from_logits(LOGITS, chunk_size=1).view(torch.int32),
                       trl.entropy_from_logits(LOGITS).view(torch.int32))
    leaf = LOGITS.clone().requires_grad_()
    _, kept = trl.selective_log_softmax_and_entropy(leaf, INDEX, temperature=temperature)
    _, detached = trl.selective_log_softmax_and_entropy(leaf, INDEX, entropy_requires_grad=False,
                                                        temperature=temperature)
    assert kept.requires_grad and not detached.requires_grad


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trl_1_16_functions_give_close_values(temperature):
    """TRL's own functions (the torch path on a CPU: divide by T, logsumexp, gather) and compat's, same
    signatures, within twice the float64 bound."""
    utils = pytest.importorskip("trl.trainer.utils")
    pairs = [(utils.selective_log_softmax(LOGITS, INDEX, temperature, ROW_MASK),
              trl.selective_log_softmax(LOGITS, INDEX, temperature, ROW_MASK)),
             (utils.selective_log_softmax(LOGITS, INDEX_K, temperature),
              trl.selective_log_softmax(LOGITS, INDEX_K, temperature)),
             (utils.entropy_from_logits(LOGITS / temperature, chunk_size=4),
              trl.entropy_from_logits(LOGITS / temperature, chunk_size=4))]
    theirs, ours = utils.selective_log_softmax_and_entropy(LOGITS, INDEX, False, temperature, ROW_MASK), \
        trl.selective_log_softmax_and_entropy(LOGITS, INDEX, False, temperature, ROW_MASK)
    pairs += list(zip(theirs, ours))
    for theirs, ours in pairs:
        assert theirs.shape == ours.shape
        np.testing.assert_allclose(ours.double(), theirs.double(), rtol=0, atol=2 * ATOL)


def test_log_prob_helpers_have_the_same_bits_on_every_backend():
    results = {}
    for name in ("numpy", "cpu", "ascend", "cuda"):
        with bitparity.use_backend(name):
            leaf = LOGITS.clone().requires_grad_()
            logprobs, entropy = trl.selective_log_softmax_and_entropy(leaf, INDEX, temperature=0.7,
                                                                     row_mask=ROW_MASK)
            (logprobs.sum() + entropy.sum()).backward()
            k = trl.selective_log_softmax(LOGITS, INDEX_K, 0.7)
            results[name] = [t.detach().view(torch.int32) for t in (logprobs, entropy, leaf.grad, k)]
    for name, got in results.items():
        assert all(torch.equal(a, b) for a, b in zip(got, results["numpy"])), name


@pytest.mark.parametrize("call, error, match", [
    (lambda: trl.selective_log_softmax(LOGITS, INDEX, 0.0), ValueError, "temperature"),
    (lambda: trl.selective_log_softmax(LOGITS, INDEX, 1.0, ROW_MASK[:, :2]), ValueError,
     r"row_mask must have index's shape \(3, 5\)"),
    (lambda: trl.selective_log_softmax(LOGITS, INDEX, 1.0, ROW_MASK * 0.5), ValueError,
     "row_mask must hold only 0 and 1"),
    (lambda: trl.selective_log_softmax(LOGITS, INDEX + 100), ValueError, "index"),
    (lambda: trl.entropy_from_logits(LOGITS, chunk_size=0), ValueError, "chunk_size must be an int >= 1"),
    (lambda: trl.entropy_from_logits([1.0]), TypeError, "logits"),
    (lambda: trl.selective_log_softmax_and_entropy(LOGITS, INDEX, entropy_requires_grad=1), TypeError,
     "entropy_requires_grad must be a bool"),
    (lambda: trl.selective_log_softmax_and_entropy(LOGITS, INDEX_K), ValueError,
     r"index must have shape logits.shape\[:-1\]"),
])
def test_log_prob_helper_argument_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
