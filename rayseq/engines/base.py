"""The generation-engine protocol and the built-in engine.

Shapes: B prompts, S prompt length, n completions per prompt, T generated length. Prompts are token ids (right-padded
``src`` (B, S) with ``src_len`` (B,)), completions come back as token ids (:class:`rayseq.models.protocol.SampleOutput`,
row b·n + j the j-th completion of prompt b, as ``PromptBatch.repeat`` lays out a group): nothing is decoded to text
and tokenised again between an engine and the learner.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from rayseq.models.protocol import SampleOutput


@runtime_checkable
class GenerationEngine(Protocol):
    """What a rollout worker samples with.

    Attributes:
        name: the ``rollout.engine`` value.
        exact: True when the engine's log-probs are the learner's own computation (the policy's ``sample``), so there
            is nothing to correct; False for an engine with kernels of its own (vLLM).
        version: the weights version loaded (−1: the initial weights).
    """

    name: str
    exact: bool
    version: int

    def generate(self, src: torch.Tensor, src_len: torch.Tensor, max_len: int, *, n: int = 1,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                 greedy: bool = False) -> SampleOutput:
        """Sample ``n`` completions per prompt (``greedy``: the most likely token at each step instead, the
        evaluation's greedy replies).

        Args:
            src: (B, S) int64 prompt ids, right-padded; src_len: (B,) their lengths.
            max_len: at most this many tokens per completion (the end token included).
            n: completions per prompt (rows b·n .. b·n + n − 1 of the result).
            temperature: y_t ~ softmax(logits / temperature); top_p: nucleus sampling (1 = off).
            seed: makes the call reproducible (None: the engine's own random state).

        Returns:
            ``SampleOutput`` (B·n, T): tokens (pad after the end), token_mask and action_mask (1 for real tokens, the
            end token included), logp: log π(y_t | x, y_<t) of the behaviour policy at temperature 1.
        """
        ...

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Take the policy's trained weights (``HFCausalLM.state_dict`` names: every parameter, or the LoRA adapters)
        as weights ``version``."""
        ...


class BuiltinEngine:
    """The policy's own decoding loop (:meth:`rayseq.models.protocol.StepDecoding.sample`): every architecture,
    reproducible per call with ``seed``. It samples the worker's generator itself, so the weights it takes are the ones
    the worker loaded."""

    name = "builtin"
    exact = True

    def __init__(self, generator: torch.nn.Module, device: torch.device):
        self.generator, self.device = generator, device
        self.version = -1

    def generate(self, src, src_len, max_len, *, n=1, temperature=1.0, top_p=1.0, seed=None,
                 greedy=False) -> SampleOutput:
        if top_p != 1.0:
            raise ValueError("rollout.engine=builtin samples from the whole distribution (top_p 1)")
        if n > 1:
            src, src_len = src.repeat_interleave(n, 0), src_len.repeat_interleave(n, 0)
        gen = None if seed is None else torch.Generator(device=self.device).manual_seed(int(seed))
        return self.generator.sample(src, src_len, max_len, temperature=temperature, greedy=greedy, generator=gen)

    def load_weights(self, weights, version: int) -> None:
        self.version = version  # the worker loaded them into the generator this engine samples


def holds_policy_weights(cfg) -> bool:
    """Whether a rollout worker of run config ``cfg`` holds the policy's weights beside its engine: the built-in engine
    samples the policy itself; vLLM runs a model of its own, the worker's only copy of the weights, and the policy's
    log-probs of its samples are the learners' to compute (:func:`rayseq.algos.common.behaviour_logprobs`). LoRA with
    vLLM: the whole policy is kept, whose base weights the adapters are merged into for the engine."""
    return cfg.rollout.engine == "builtin" or cfg.model.lora_r > 0


def make_engine(cfg, generator, task, device: torch.device, engines_on_node: int = 1):
    """The engine of ``cfg.rollout.engine`` for a worker whose policy is ``generator`` (for vLLM without LoRA its
    frame, :class:`rayseq.models.hf.HFPolicyFrame`: :func:`holds_policy_weights`); ``engines_on_node``: the rollout
    workers on its node, among which an engine with memory of its own shares the node's (vLLM)."""
    name = cfg.rollout.engine
    if name == "builtin":
        return BuiltinEngine(generator, device)
    if name == "vllm":
        from rayseq.engines.vllm_engine import VLLMEngine

        return VLLMEngine.for_policy(generator, seed=cfg.seed, engine_kwargs=cfg.rollout.engine_kwargs,
                                     engines_on_node=engines_on_node, gpu_share=cfg.rollout.num_gpus_per_worker)
    raise ValueError(f"rollout.engine={name!r}: one of builtin, vllm")
