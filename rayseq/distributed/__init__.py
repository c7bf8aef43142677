"""Orchestration, the only layer that uses Ray (and the only one that creates actors or calls ``ray.get``):

- :mod:`.actors`: the learner, the rollout worker and the scorer, plain classes that Ray runs as actors, or that the
  groups hold in-process with ``rollout.num_workers=0``;
- :mod:`.groups`: the three actor groups an algorithm's iteration calls (learner, rollout, scorer: one class each,
  in-process or on Ray actors), the placement group they share and their fault recovery;
- :mod:`.weights`: how the learner's weights reach the workers (the object store, a collective group);
- :mod:`.driver`: the run's stages, evaluation, checkpoints, logging and progress;
- :mod:`.handles` (shard handles resolved where the data is used) and :mod:`.runtime` (joining or starting Ray).
"""
