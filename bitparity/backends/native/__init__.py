"""The `native` backend: torch's own ops for the same maths, on any device.

This is the baseline the comparison measures against: what an RL pipeline
computes when it calls torch directly (vLLM and verl compute token log-probs
as log_softmax + gather).  Its bits are whatever the platform's kernels give;
they are not expected to match the canonical order.  The temperature is
applied as x * scale, the same scaling the canonical backends use, so that the
comparison isolates the reduction order and the exp/log implementations.
"""

import torch

NAME = "native"


def availability():
    return True, f"torch {torch.__version__} ops on the input's device"


def _scaled(x, mask, scale):
    w = x * scale
    return w if mask is None else w.masked_fill(~mask, float("-inf"))


def sum(x, mask):  # noqa: A001 - the op's public name
    return (x if mask is None else x.masked_fill(~mask, 0.0)).sum(dim=-1)


def logsumexp(x, mask, scale):
    return torch.logsumexp(_scaled(x, mask, scale), dim=-1)


def log_softmax(x, mask, scale):
    return torch.log_softmax(_scaled(x, mask, scale), dim=-1)


def softmax(x, mask, scale):
    return torch.softmax(_scaled(x, mask, scale), dim=-1)


def entropy(x, mask, scale):
    # The usual RL formulation (verl's entropy_from_logits): logsumexp - sum p * logits.
    w = _scaled(x, mask, scale)
    p = torch.softmax(w, dim=-1)
    return torch.logsumexp(w, dim=-1) - (p * w.masked_fill(p == 0, 0.0)).sum(dim=-1)


def token_logprobs(x, tokens, scale):
    return torch.log_softmax(x * scale, dim=-1).gather(-1, tokens[:, None])[:, 0]


def exp(x):
    return torch.exp(x)


def log(x):
    return torch.log(x)
