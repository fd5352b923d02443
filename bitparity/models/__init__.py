"""Models built only from bitparity ops (docs/spec.md §25), and unmodified Hugging Face models patched onto them
as RL policies (hf_policy: transformers is imported only when one is built)."""

from .hf_policy import HFModel, HFPolicy
from .tiny_moe import ModelConfig, TinyMoEPolicy

__all__ = ["HFModel", "HFPolicy", "ModelConfig", "TinyMoEPolicy"]
