"""rayseq: reinforcement learning for sequence generators on Ray.

Layers (imports point down only, see DESIGN.md):
entry points (train, tune, serving) -> distributed -> algos -> math (models, losses, rewards, tasks, data)
-> foundations (config, types, checkpoint).
"""

__version__ = "0.1.0"
