"""RolloutWorker: samples responses with the current weights, as the request's sampler draws them (π_θ through the
rollout engine unless the algorithm's request carries a sampler of its own: :mod:`rayseq.algos.sampling`), and scores
them with the task reward; runs what an algorithm asks of a shard (:meth:`RolloutWorker.run_shard`, e.g.
continuations of every prefix) with the copies the algorithm declared (``Algorithm.worker_modules``).

With an engine that runs a model of its own (``rollout.engine=vllm``) the worker holds no copy of the policy beside it
(:func:`rayseq.engines.holds_policy_weights`): the weights go to the engine alone, and the rollout carries the engine's
log-probs (``Rollout.engine_logp``) with ``Rollout.logp`` left for the learners to compute."""

from __future__ import annotations

import os
import time
from functools import partial

import numpy as np
import torch

from rayseq.algos.sampling import POLICY, Sampled, SamplingCall
from rayseq.config import RunConfig
from rayseq.distributed.runtime import bundles_on_this_node, placement_group_id
from rayseq.distributed.weights.flat import as_state_dicts
from rayseq.engines import holds_policy_weights, make_engine
from rayseq.models import make_generator
from rayseq.rewards.terminal import terminal_rewards
from rayseq.seeding import set_deterministic
from rayseq.tasks import make_task
from rayseq.tasks.evaluation import EvalDecode, plays_its_decodes, run_decode
from rayseq.types import PromptBatch, PromptKeys, Rollout, RolloutRequest, prompt_arrays, to_torch


class RolloutWorker:
    """One rollout worker (``index`` of the group); ``cfg``: the run's config. What an algorithm runs here
    (:meth:`run_shard`) reads ``cfg``, ``task``, ``device``, ``index``, ``generator`` and ``modules`` (the copies of the
    algorithm's that have received weights). ``generator`` is None where the engine holds the only copy of the weights
    (:func:`rayseq.engines.holds_policy_weights`); ``policy`` is the generator, or there its frame
    (:class:`rayseq.models.hf.HFPolicyFrame`: names, shapes and special ids, no weights)."""

    def __init__(self, cfg: RunConfig, index: int = 0):
        self.cfg = cfg
        self.index = index
        torch.set_num_threads(self.cfg.rollout.torch_threads)
        set_deterministic(self.cfg.deterministic)
        self.device = torch.device("cuda" if self.cfg.rollout.num_gpus_per_worker > 0 else "cpu")
        self.task = make_task(self.cfg.task, self.cfg.reward)
        dtype = getattr(torch, self.cfg.model.dtype)  # samples in the policy's compute precision (bf16: a bf16 copy)
        if holds_policy_weights(self.cfg):
            self.generator = make_generator(self.cfg, self.task).to(self.device, dtype)
            self.generator.eval()
            self.policy = self.generator
        else:  # the engine's model is the only copy of the weights here
            from rayseq.models.hf import HFPolicyFrame

            self.generator = None
            self.policy = HFPolicyFrame.from_config(self.cfg, self.task)
        # what samples (rollout.engine); vLLM's engines share their node's memory with the other workers' there
        self.engine = make_engine(self.cfg, self.policy, self.task, self.device,
                                  engines_on_node=bundles_on_this_node(range(1, 1 + self.cfg.rollout.num_workers)))
        # what a request without a sampler of its own draws: π_θ's replies, or episodes of the run's environment
        # (env.name: the environments in this process or in actors, rayseq.distributed.env_actors)
        self.sampler = POLICY
        if self.cfg.env.name:
            from rayseq.distributed.env_actors import environments

            self.sampler = self.task.episode_sampler(self.policy, self.engine, self.device,
                                                     environments(self.cfg, self.task))
        # what the algorithm keeps here (Algorithm.worker_modules), built now, not on the first weights (in-process
        # runs draw the same global random numbers before and after a resume); in ``modules`` once weights arrive
        self._held = {k: m.to(dtype) for k, m in self.cfg.algorithm.worker_modules(self.cfg, self.task,
                                                                                  self.device).items()}
        self.modules: dict = {}
        self.version = -1
        self.loads = 0  # weight loads (one per version)
        self.collective_loads = 0  # of them, received over the weights group (rollout.weight_sync=collective)

    def pid(self) -> int:
        return os.getpid()

    def stats(self) -> dict:
        """Diagnostics: pid, weights version and loads, a checksum of the weights (Σ w: the policy's, or where the
        engine holds the only copy, of the weights it was last given), the weights groups it is in."""
        from rayseq.distributed.weights import collective as weight_sync

        if self.generator is not None:
            checksum = float(sum(p.detach().double().sum() for p in self.generator.parameters()))
        else:
            checksum = self.engine.policy_checksum()[0]
        return {
            "pid": os.getpid(), "version": self.version, "loads": self.loads, "checksum": checksum,
            "collective_loads": self.collective_loads, "weight_groups": weight_sync.memberships(),
            "placement_group": placement_group_id(), **self.engine_stats(),
        }

    def engine_stats(self) -> dict:
        """The engine's name, weights version and what it took of its node's memory (vLLM: ``memory_note``; None for
        the built-in engine); an engine with a model of its own (vLLM) also gives the checksum
        (Σ w, Σ |w|) of what it runs beside the policy's (:func:`rayseq.engines.vllm_engine.weights_checksum`)."""
        out = {"engine": self.engine.name, "engine_version": self.engine.version,
               "engine_memory": getattr(self.engine, "memory_note", None)}
        if hasattr(self.engine, "checksum"):
            out["engine_checksum"], out["policy_checksum"] = self.engine.checksum(), self.engine.policy_checksum()
        return out

    def set_weights(self, weights, version: int) -> int:
        """``weights``: the learner's generator and what the algorithm publishes with it (``Learner.get_weights``:
        in-process), ``get_flat_weights()`` or a ``[ref]`` of it (fetched only when ``version`` is new here)."""
        if version != self.version:
            weights = as_state_dicts(weights)
            if self.generator is not None:
                self.generator.load_state_dict(weights["generator"])
            for name, state in weights.items():
                if name != "generator" and state is not None:
                    self._held[name].load_state_dict(state)
                    self.modules[name] = self._held[name]
            self.engine.load_weights(weights["generator"], version)
            self.version = version
            self.loads += 1
        return self.version

    def receive_weights(self, spec, rank: int, version: int, bucket_bytes: int, first: bool = False) -> None:
        """Weights ``version`` broadcast by the learner over the group ``spec`` (member ``rank``;
        ``rollout.weight_sync=collective``, :mod:`~rayseq.distributed.weights.collective`), checked against its checksum
        and loaded. ``first``: the group's first broadcast (this worker joins it)."""
        from rayseq.distributed.weights import collective as weight_sync

        if self._held:
            raise ValueError(f"rollout.weight_sync=collective carries the generator alone; algo.name="
                             f"{self.cfg.algo.name} keeps {sorted(self._held)} on the workers too: use object_store")
        state = weight_sync.receive(self.policy.state_dict(), spec, rank, bucket_bytes, first, device=self.device)
        self.set_weights({"generator": state}, version)
        self.collective_loads += 1

    def leave_weight_group(self, group_name: str) -> None:
        from rayseq.distributed.weights import collective as weight_sync

        weight_sync.leave(group_name)

    # -- the Ray groups' calls: (data, small info) as two return objects; the data goes on by reference to the
    # scorer or the learner, the driver reads the info only (rayseq.distributed.handles). The weights travel with
    # the work (``weights`` = [ref], ``version``: loaded first when the version is new here; one call, not two)
    def sample_shard(self, prompts: PromptBatch | PromptKeys, request: RolloutRequest, score: bool = True,
                     weights=None, version: int = -1, report_score: bool = False) -> tuple[Rollout, dict]:
        """:meth:`sample` with the weights ``version``, and its info (worker, timings, rows; with ``report_score``
        the rewards ``score`` (B,) and ``term_scores`` (B, K), for an iteration that decides on them: dynamic
        sampling). ``prompts``: the batch, or the keys of rows of the task's data (read here)."""
        if weights is not None:
            self.set_weights(weights, version)
        rollout = self.sample(prompt_arrays(prompts, self.task), request, score)
        report = {"score": rollout.score, "term_scores": rollout.term_scores} if report_score else {}
        return rollout, {**rollout.info, "rows": len(rollout), **report}

    def run_shard(self, fn, *args, weights=None, version: int = -1, **kwargs) -> tuple:
        """``fn(self, *args, **kwargs) -> (data, info)`` with the weights ``version``: what an algorithm runs on a shard
        here (a module-level function of the algorithm's, e.g. continuations of every prefix of the shard)."""
        if weights is not None:
            self.set_weights(weights, version)
        return fn(self, *args, **kwargs)

    def sample(self, prompts: PromptBatch, request: RolloutRequest, score: bool = True) -> Rollout:
        """Sample one response per prompt, drawn by the request's sampler (``request.sampler``; None: π_θ through the
        rollout engine); ``score`` computes the task reward here (cheap rewards), otherwise a ScorerActor does
        (:func:`score_rollout`)."""
        t0 = time.perf_counter()
        dev = self.device
        rng = None if request.seed is None else torch.Generator(device=dev).manual_seed(int(request.seed))
        src, src_len = to_torch(prompts.src, dev), to_torch(prompts.src_len, dev)
        if request.sampler is not None and self.generator is None:
            raise ValueError(f"algo.name={self.cfg.algo.name} samples with a sampler of its own on the worker's "
                             f"copy of the policy, which rollout.engine={self.cfg.rollout.engine} workers do not hold; "
                             "use rollout.engine=builtin")
        sampler = request.sampler or self.sampler
        drawn = sampler.sample(SamplingCall(
            policy=self.policy, task=self.task, prompts=prompts, src=src, src_len=src_len, max_len=request.max_len,
            temperature=request.temperature, rng=rng, engine=partial(self._engine_sample, src, src_len, request)))
        out = drawn.sample
        tokens = out.tokens.cpu().numpy()
        rows = prompts if drawn.prompts is None else drawn.prompts  # an episode's rows start from its observation
        inexact = drawn.engine_logp is not None  # the engine's log-probs: the policy's are the learners' to compute
        rollout = Rollout(
            src=rows.src, src_len=rows.src_len, tokens=tokens, token_mask=out.token_mask.cpu().numpy(),
            action_mask=out.action_mask.cpu().numpy(), logp=None if inexact else out.logp.cpu().numpy(),
            rewards=np.zeros(tokens.shape, np.float32), score=np.zeros(len(tokens), np.float32),
            tgt=rows.tgt, version=self.version, key=rows.key,
            info={"worker": self.index, "pid": os.getpid(), **drawn.info}, extras=dict(drawn.extras),
        )
        if inexact:
            rollout.engine_logp = drawn.engine_logp.float().cpu().numpy()
            # of the engine's last weights load against the weights given (0: the same weights), whoever drew the
            # rollout through it (π_θ's replies, an episode's turns)
            rollout.info["engine_checksum_diff"] = self.engine.checksum_diff
        rollout.info["sample_s"] = time.perf_counter() - t0
        return score_rollout(self.task, rollout, sampler) if score else rollout

    def _engine_sample(self, src: torch.Tensor, src_len: torch.Tensor, request: RolloutRequest) -> Sampled:
        """π_θ's replies to ``src`` (B, S) through the rollout engine, with the request's length, temperature and
        seed; where the engine's log-probs are not the policy's (``engine.exact`` False), they are returned as the
        engine's (``engine_logp``): the learners compute the policy's
        (:func:`rayseq.algos.common.behaviour_logprobs`)."""
        out = self.engine.generate(src, src_len, request.max_len, temperature=request.temperature, seed=request.seed)
        return Sampled(out) if self.engine.exact else Sampled(out, engine_logp=out.logp)


def decode_held_out(worker: RolloutWorker, decode: EvalDecode) -> tuple[tuple[np.ndarray, np.ndarray] | dict, dict]:
    """One decode of an evaluation (:class:`~rayseq.tasks.evaluation.EvalDecode`: a chunk of a held-out split's
    inputs, greedy or sampled with its seed) on ``worker``, through its rollout engine: ((tokens (n, max_len), mask
    (n, max_len)), info). The inputs are the worker's task's (:meth:`eval_inputs`); what it decodes with are the
    weights the call carried (:meth:`RolloutWorker.run_shard`). A task that plays its decodes (``eval_play``: the
    environment's episodes) plays this one with the worker's sampler (its engine, its environments) and returns
    what that gives (the task's compact result)."""
    t0 = time.perf_counter()
    if plays_its_decodes(worker.task):
        out = worker.task.eval_play(decode, worker.sampler)
    else:
        engine = worker.engine

        def sample(src, src_len, max_len, greedy, seed):
            return engine.generate(src, src_len, max_len, seed=seed, greedy=greedy)

        out = run_decode(sample, *worker.task.eval_inputs(decode), decode, worker.device)
    return out, {"worker": worker.index, "pid": os.getpid(), "rows": decode.rows, "version": worker.version,
                 "decode_s": time.perf_counter() - t0}


def score_rollout(task, rollout: Rollout, sampler=None) -> Rollout:
    """Fill ``rewards`` (B, T) and ``score`` (B,) with the task's reward (in place; returns it), ``term_scores``
    (B, K) with each term of a configured reward (``task.reward``, see :func:`rayseq.tasks.make_task`), and what the
    rollout's sampler scores of its extras (``sampler``: the request's, :meth:`rayseq.algos.sampling.Sampler.score`;
    None: nothing)."""
    if task.reward is not None:
        rollout.score, rollout.term_scores = task.reward.scores(rollout.src, rollout.src_len, rollout.tokens,
                                                           rollout.token_mask, key=rollout.key)
        rollout.rewards = terminal_rewards(rollout.score, rollout.token_mask)
    else:
        rollout.rewards, rollout.score = task.rewards(rollout.src, rollout.src_len, rollout.tokens,
                                                      rollout.token_mask, key=rollout.key)
    (sampler or POLICY).score(task, rollout)
    return rollout
