"""Models built only from bitparity ops (docs/spec.md §25)."""

from .tiny_moe import ModelConfig, TinyMoEPolicy

__all__ = ["ModelConfig", "TinyMoEPolicy"]
