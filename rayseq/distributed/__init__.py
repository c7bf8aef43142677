"""Orchestration: rollout workers, learner, weight sync, the driver loop. The only layer that uses Ray.

``RolloutWorker``, ``ScorerActor`` and ``Learner`` are plain classes; :mod:`rayseq.distributed.groups` runs them as
Ray actors in one placement group, or in-process when ``rollout.num_workers=0``.
"""
