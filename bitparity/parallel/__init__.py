"""Model parallelism with the bits of one process (spec 31): tensor-parallel linear, vocab-parallel log-probs
and sampling, expert-parallel MoE, and the sharding of a patched Hugging Face model, over torch.distributed
process groups. Only exact data crosses the network: integers, maxima and whole binary32 values gathered in rank
order; no float addition happens inside a collective."""

from .linear import column_parallel_linear, row_parallel_linear, shard_range  # noqa: F401
from .moe import expert_range, moe  # noqa: F401
from .vocab import entropy, logsumexp, sample, token_logprobs, vocab_shard  # noqa: F401 - spec 31.3
