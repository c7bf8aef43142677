"""Episodes: a policy acting in an environment over several turns, trained with exact tokens.

- :mod:`~rayseq.episodes.protocol` — the environment protocol (``reset(seed, **row)``, ``step(action)`` ->
  ``(observation, reward, done, info)``), the built-in names and a user's class by import path (``env.name``);
- :mod:`~rayseq.episodes.games` — guess-the-number and tic-tac-toe; :mod:`~rayseq.episodes.adapters` — the
  environments of TRL (``environment_factory`` classes), reasoning-gym, TextArena, GEM and OpenEnv;
- :mod:`~rayseq.episodes.render` — observations as tokens: a chat template's suffix proven to extend the prefix, or
  rayseq's own vocabulary; :mod:`~rayseq.episodes.decode` — the policy's next action after the episode so far;
- :mod:`~rayseq.episodes.runner` — a batch of episodes run concurrently, kept as a rollout (sampled ids, the engine's
  log-probs, ``action_mask`` on sampled tokens only, each turn's reward on its last sampled token, turn boundaries),
  and the rollout worker's sampler; :mod:`~rayseq.episodes.pool` — environments in the worker's process, with
  timeouts (actors: :mod:`rayseq.distributed.env_actors`);
- :mod:`~rayseq.episodes.task` — the task of a run with ``env.name`` (``task.name=env``).

Algorithm layer: torch and numpy, no Ray (the actors live in ``rayseq.distributed``).
"""

from rayseq.episodes.protocol import Action, Environment, StepResult, make_environment

__all__ = ["Action", "Environment", "StepResult", "make_environment"]
