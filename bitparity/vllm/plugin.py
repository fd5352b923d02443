"""The `vllm.general_plugins` entry point (pyproject: `bitparity = "bitparity.vllm.plugin:register"`).

vLLM calls `register()` once in every process it starts (the caller's, the engine core, each worker, the
model-inspection subprocess) unless `VLLM_PLUGINS` names other plugins (`VLLM_PLUGINS=""` loads none: the
stock engine). It registers:

- the model classes under their own architecture names, `BitparityQwen3ForCausalLM`,
  `BitparityQwen3MoeForCausalLM`, `BitparityLlamaForCausalLM`, which an engine selects with
  `LLM(model, hf_overrides={"architectures": ["BitparityQwen3ForCausalLM"]})`; with `BITPARITY_VLLM=1` in the
  environment of vLLM's processes also under the stock names `Qwen3ForCausalLM`, `Qwen3MoeForCausalLM` and
  `LlamaForCausalLM`, so that frameworks that build `LLM(model=path)` themselves (TRL, verl, OpenRLHF) run
  bitparity's models without a code change;
- the attention backend as `AttentionBackendEnum.CUSTOM`;
- the sampler: `vllm.v1.worker.gpu_model_runner.Sampler` becomes `CanonicalSampler`, which samples with
  bitparity only in engines whose model is one of the above (`serves`).
"""

import os

ARCHITECTURES = {"BitparityQwen3ForCausalLM": "Qwen3ForCausalLM",
                 "BitparityQwen3MoeForCausalLM": "Qwen3MoeForCausalLM",
                 "BitparityLlamaForCausalLM": "LlamaForCausalLM"}
TAKEOVER_ENV = "BITPARITY_VLLM"


def takes_over():
    """Whether this process serves the stock architecture names too (BITPARITY_VLLM=1)."""
    value = os.environ.get(TAKEOVER_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{TAKEOVER_ENV} must be 1 (serve Qwen3, Qwen3-MoE and Llama with bitparity's models) or "
                         f"0/unset; got {value!r}")
    return value == "1"


def serves(model_config):
    """Whether an engine with this vLLM ModelConfig runs a bitparity model class."""
    names = set(ARCHITECTURES) | (set(ARCHITECTURES.values()) if takes_over() else set())
    return bool(names & set(getattr(model_config.hf_config, "architectures", None) or ()))


def register():
    from vllm import ModelRegistry
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    from vllm.v1.worker import gpu_model_runner

    from .sampler import CanonicalSampler

    names = {ours: ours for ours in ARCHITECTURES}
    if takes_over():
        names.update({stock: ours for ours, stock in ARCHITECTURES.items()})
    for name, ours in names.items():
        ModelRegistry.register_model(name, f"bitparity.vllm.model:{ours}")
    register_backend(AttentionBackendEnum.CUSTOM, "bitparity.vllm.attention.PagedBackend")
    gpu_model_runner.Sampler = CanonicalSampler
