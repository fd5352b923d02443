"""rl: how a last-bit difference between rollout and trainer becomes a biased PPO update.

The inference engine records log p(token) while sampling; the trainer
recomputes it.  PPO's importance ratio exp(logp_train - logp_rollout) is
exactly 1 on the first update when the two agree, and anything else is a
bias the algorithm did not ask for.  Until the end-to-end `bitparity
rl-check` (a later issue, which will replace this topic's stand-ins) runs a
real rollout/train pair, this topic builds the rollout side from differences
measured on this machine: torch's own log_softmax instead of bitparity's, the
LM-head matmul taken one token at a time instead of for the whole batch, and
a bfloat16 LM head as inference engines commonly run it.
"""

import numpy as np
import torch
from tabulate import tabulate

from .. import ops
from . import plots
from .common import heading

SEQUENCES, TOKENS, HIDDEN, VOCAB = 8, 64, 256, 8192
CLIP = 0.2

EXPLANATION = f"""
{SEQUENCES} sequences of {TOKENS} tokens, hidden size {HIDDEN}, vocabulary {VOCAB:,}.  The trainer computes
logits = h @ W for the whole batch and log p(token) with bitparity.token_logprobs.  The rollout
side computes the same quantity another way; PPO then sees
  logdiff = logp_train - logp_rollout,   ratio = exp(logdiff),
and bitparity.ppo_policy_loss (clip {CLIP}, one advantage per sequence) is compared with the loss
of exactly on-policy data (ratio 1 everywhere).  The torch rows all use torch's log_softmax;
the last two also compute the logits differently.
"""


def _logprobs_native(logits, tokens):
    return torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]


def _rollouts(h, w, logits, tokens):
    """(key, label, rollout log-probs) for each way the rollout side may compute them."""
    one_at_a_time = torch.stack([h_token[None] @ w for h_token in h.reshape(-1, HIDDEN)]).reshape(
        SEQUENCES, TOKENS, VOCAB)                    # decoding: one token's row through the LM head at a time
    bf16_logits = (h.bfloat16() @ w.bfloat16()).float()
    return (
        ("bitparity", "bitparity both sides, rollout per sequence",
         torch.stack([ops.token_logprobs(logits[i:i + 1], tokens[i:i + 1], backend="cpu")[0]
                      for i in range(SEQUENCES)])),
        ("native_log_softmax", "torch log_softmax, same logits", _logprobs_native(logits, tokens)),
        ("native_matmul_m1", "torch, LM head one token at a time", _logprobs_native(one_at_a_time, tokens)),
        ("bf16_lm_head", "torch, bfloat16 LM head", _logprobs_native(bf16_logits, tokens)),
    )


def run(plots_dir=None):
    heading("rl: from a last-bit difference to a biased PPO ratio", EXPLANATION)
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(SEQUENCES, TOKENS, HIDDEN, generator=generator)
    w = torch.randn(HIDDEN, VOCAB, generator=generator) / 4
    logits = h @ w
    tokens = torch.multinomial(torch.softmax(logits.reshape(-1, VOCAB), -1), 1, generator=generator).reshape(
        SEQUENCES, TOKENS)
    train = ops.token_logprobs(logits, tokens, backend="cpu")
    advantages = torch.randn(SEQUENCES, 1, generator=generator).expand(SEQUENCES, TOKENS).contiguous()
    mask = torch.ones(SEQUENCES, TOKENS, dtype=torch.bool)

    def loss(old):
        value, clipped = ops.ppo_policy_loss(train, old, advantages, mask, clip_low=CLIP, clip_high=CLIP,
                                             backend="cpu")
        return value.item(), clipped.item()

    on_policy_loss, _ = loss(train)
    table, result, ratios = [], {"on_policy_loss": on_policy_loss}, {}
    for key, label, rollout in _rollouts(h, w, logits, tokens):
        logdiff = (train - rollout).double()
        ratio = ops.exp(train - rollout, backend="cpu").double()
        value, clip_fraction = loss(rollout)
        ratios[label] = (ratio - 1).abs().flatten().numpy()
        result[key] = {"label": label, "max_abs_logdiff": float(logdiff.abs().max()),
                       "tokens_differing": int((logdiff != 0).sum()), "max_abs_ratio_minus_1": float(ratios[label].max()),
                       "loss_bias": value - on_policy_loss, "clip_fraction": clip_fraction}
        table.append((label, f"{int((logdiff != 0).sum())}/{logdiff.numel()}", f"{logdiff.abs().max():.3g}",
                      f"{ratios[label].max():.3g}", f"{value - on_policy_loss:+.3g}", f"{clip_fraction:.4f}"))
    print(tabulate(table, headers=("rollout side", "tokens differing", "max |logdiff|", "max |ratio - 1|",
                                   "loss bias", "clip fraction"), disable_numparse=True))
    print(f"\non-policy loss (ratio exactly 1): {on_policy_loss:.9g}.  Every other row should be 0 bias; "
          "only the canonical order on both sides is.")
    if plots_dir is not None:
        result["plot"] = _plot(plots_dir, ratios)
    return result


def _plot(plots_dir, ratios):
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    bins = np.logspace(-9, 0, 46)
    colours = iter((plots.CANONICAL, plots.OTHER, plots.NATIVE, "tab:purple"))
    for label, deviation in ratios.items():
        colour = next(colours)
        moved = deviation[deviation > 0]
        if moved.size == 0:
            ax.plot([], [], color=colour, linewidth=3, label=f"{label}: all {deviation.size} ratios exactly 1")
            continue
        ax.hist(moved, bins=bins, histtype="step", linewidth=2, color=colour,
                label=f"{label}: {moved.size} of {deviation.size} tokens, max {moved.max():.2g}")
    ax.set_xscale("log")
    ax.set_xlabel("|ratio - 1| per token, ratio = exp(logp_train - logp_rollout)")
    ax.set_ylabel("tokens")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.45)           # room for the legend above the peaks
    ax.set_title("Importance ratios of exactly on-policy data (should all be 1)")
    ax.legend(fontsize=8, loc="upper left")
    return plots.save(fig, plots_dir, "rl")
