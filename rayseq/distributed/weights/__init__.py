"""How the learner's weights reach the rollout workers: one buffer per version through the object store
(:mod:`.flat`), or broadcast over a standalone gloo group (:mod:`.collective`)."""
