"""The actor groups an algorithm's iteration is written against, one file each: the learner group (:mod:`.learner`),
the rollout group (:mod:`.rollout`), the scorer group (:mod:`.scorer`); :class:`ActorGroups` builds the three for a
run (:mod:`.actor_groups`), in one placement group (:mod:`.placement`); the calls they send (:mod:`.calls`) and the
fault recovery they share (:mod:`.manager`)."""

from rayseq.distributed.groups.actor_groups import ActorGroups
from rayseq.distributed.groups.learner import LearnerGroup
from rayseq.distributed.groups.rollout import RolloutGroup
from rayseq.distributed.groups.scorer import ScorerGroup

__all__ = ["ActorGroups", "LearnerGroup", "RolloutGroup", "ScorerGroup"]
