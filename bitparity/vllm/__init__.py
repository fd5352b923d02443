"""bitparity as a vLLM plugin: vLLM's engine runs `bitparity.patch`'s model, attention over its paged KV cache
and bitparity's sampler, so the tokens and log-probs it reports are the trainer's bits (spec 30.8,
docs/integrations.md "vLLM plugin: how it works").

- plugin.py: the `vllm.general_plugins` entry point (model names, attention backend, sampler);
- model.py: the model classes (Qwen3, Qwen3-MoE, Llama), the patched HF model driven on vLLM's tokens;
- attention.py: the attention backend over vLLM's paged KV cache;
- sampler.py: vLLM's V1 sampler replaced by bitparity.sample;
- rollout.py: `bitparity rl-check --rollout vllm`.

Importing this package does not import vLLM; its modules do.
"""
