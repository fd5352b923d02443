"""Trainers run on canonical bits through their own extension points (docs/integrations.md).

- trl.py: TRL 1.16's GRPOTrainer (a subclass) and rollout functions for HF generate and the vLLM plugin.

Importing this package imports no trainer; its modules do.
"""
