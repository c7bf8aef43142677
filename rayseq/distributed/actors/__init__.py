"""The actors of a run, plain classes that Ray runs as actors (or the groups hold in-process with
``rollout.num_workers=0``): the learner (:mod:`.learner`, with the FSDP2 helpers of :mod:`.sharding`), the rollout
worker (:mod:`.worker`) and the scorer (:mod:`.scorer`)."""
