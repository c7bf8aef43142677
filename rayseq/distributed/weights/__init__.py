"""How the learner's weights reach the rollout workers: one buffer per version through the object store
(:mod:`.flat`), or also broadcast over a standalone gloo group (:mod:`.collective`); the rollout group's transport,
chosen once from ``rollout.weight_sync`` (:mod:`.transport`)."""
