"""Drop-in functions with the names, arguments and semantics of verl, TRL and OpenRLHF, computed by
bitparity's canonical ops, so a trainer adopts bitparity by swapping one import.

    from bitparity.compat import verl as core_algos         # instead of verl.trainer.ppo.core_algos

The versions matched, and every place where a result differs from the library's (positions outside the
mask, empty masks), are listed in docs/conventions.md.
"""

from . import openrlhf, trl, verl

__all__ = ["openrlhf", "trl", "verl"]
