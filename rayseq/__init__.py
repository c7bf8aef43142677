"""rayseq: reinforcement learning for sequence generators on Ray.

Layers (imports point down only, without cycles; tests/test_import_layers.py checks it, docs/concepts/index.md
explains it):
entry points (train, tune, serve) -> tuning, serving -> distributed -> algos
-> math (models, losses, rewards, tasks, data)
-> foundations (config, types, checkpoint, registry, seeding, storage, runlog, vocab).
"""

__version__ = "0.1.0"
