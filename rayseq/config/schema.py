"""The run config's schema: the run-level sections (task and algorithm sections: :mod:`rayseq.config.declared`),
:class:`RunConfig`, :func:`build_config` and :func:`config_to_dict`.

Every field is documented; an unknown key or a bad value raises :class:`ConfigError` naming the key.
A config is built from defaults, then an experiment YAML (``--config``), then ``key=value`` overrides
(``algo.eps=0.2 rollout.num_workers=0``; :mod:`rayseq.config.overrides`); values are parsed as YAML scalars
(``.inf``/``inf`` work). Derived values live in one place: the ``@property`` helpers at the bottom of each model.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from rayseq import registry
from rayseq.config.base import ConfigError, blame, did_you_mean
from rayseq.config.base import Section as _Section
from rayseq.config.declared import (
    AlgoConfig,
    TaskConfig,
    algorithm_config_model,
    algorithm_sections,
    builtin_algo_keys,
    builtin_sections,
    builtin_task_keys,
    check_applicable,
    check_pipeline,
    declared_algo_keys,
    declared_task_keys,
    given_later,
    resolve_algo_section,
    resolve_task_section,
    task_config_model,
)
from rayseq.config.env import EnvConfig
from rayseq.config.environment import transformers_problem
from rayseq.config.overrides import deep_merge, parse_overrides
from rayseq.config.paths import LOCAL_PATH, is_run, same_path

ALGOS = tuple(registry.ALGORITHMS)  # the names are listed once, in rayseq.registry; traits live on the classes
TASKS = tuple(registry.TASKS)


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (configs are validated on every actor)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


_TERM_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class _RewardFunction(_Section):
    """A section with a reward function ``fn``: a built-in name or an import path that must resolve."""

    @field_validator("fn", check_fields=False)
    @classmethod
    def _known_function(cls, v: str) -> str:
        registry.reward_function(v, check_kwargs=False)  # ValueError naming what is wrong
        return v


class RefreshConfig(_Section):
    """``refresh:`` of a reward-model term (``fn: reward_model`` on an ``algo.name=reward_model`` run): the reward model
    retrained online, on the learner, from Bradley–Terry pairs of the policy's own replies (``group_size`` replies to
    each of ``prompts`` prompts, the one the ``labeller`` scores higher preferred, ties dropped), every ``every``
    iterations; its new weights reach the scorers before the next batch is scored (rayseq/algos/reward_refresh.py)."""

    labeller: str = Field(description="The reward function that labels the pairs: a built-in (task: the task's own "
                          "reward, bleu, chrf, length, ...) or your own as an import path package.module:function "
                          "(e.g. a gold reward).")
    labeller_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the labeller.")
    every: int = Field(1, ge=1, description="Iterations of the train stage between two refreshes.")
    steps: int = Field(1, ge=1, description="Bradley–Terry steps per refresh, each on batch_size of its pairs.")
    prompts: int = Field(16, ge=1, description="Prompts sampled per refresh (each answered group_size times).")
    group_size: int = Field(4, ge=2, description="G: replies sampled per prompt; the pairs are those of a group.")
    batch_size: int = Field(32, ge=1, description="Pairs per step, drawn from the refresh's pairs (all when fewer).")
    lr: float = Field(1e-4, gt=0, description="Adam learning rate of the reward model's refresh.")
    temperature: float = Field(0.0, ge=0, description="0: the reply the labeller scores higher is preferred; τ > 0: "
                               "preferred with probability σ((s_i − s_j)/τ) (Bradley–Terry sampling).")
    preferences: str | None = Field(None, description="A fixed preference file (or datasets folder) of rows "
                                    "{prompt, chosen, rejected} with text prompts, mixed into every step.",
                                    json_schema_extra=LOCAL_PATH)
    mix: float | None = Field(None, ge=0.0, le=1.0, description="The fraction of each step's pairs drawn from "
                              "preferences (default 0.5 with a file).")

    @model_validator(mode="after")
    def _labeller_resolves(self) -> RefreshConfig:
        try:
            registry.reward_function(self.labeller, self.labeller_kwargs)
        except ValueError as exc:
            raise ValueError(f"labeller: {exc}") from None
        if self.mix is not None and self.preferences is None:
            raise ValueError("mix: the fraction of pairs drawn from a fixed preference file; set preferences too")
        if self.preferences is not None and not Path(self.preferences).expanduser().exists():
            raise ValueError(f"preferences={self.preferences}: no such file or folder")
        return self

    @property
    def fixed_fraction(self) -> float:
        """The fraction of each step's pairs from the fixed file (0 without one)."""
        return 0.0 if self.preferences is None else (0.5 if self.mix is None else self.mix)


def _check_refresh(fn: str, kwargs: dict, refresh: RefreshConfig | None) -> None:
    """A refresh belongs to a reward-model term scoring a rayseq reward model's run (its weights are retrained)."""
    if refresh is None:
        return
    if fn != "reward_model":
        raise ValueError(f"refresh: only a reward-model term (fn: reward_model) can be refreshed, not fn: {fn}")
    if not is_run(kwargs.get("path", "")):
        raise ValueError(f"refresh: path={kwargs.get('path')} is not a run of algo.name=reward_model; a refresh "
                         "retrains a rayseq reward model (a Hugging Face folder is scored as it is)")


class RewardTerm(_RewardFunction):
    """One term w · f(prompts, replies, references, **kwargs) of reward.terms."""

    fn: str = Field(description="A built-in reward (task, bleu, chrf, length) or your own function as an import path "
                    "package.module:function taking (prompts, replies, references).")
    weight: float = Field(1.0, description="Its weight w in the sum.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the function (bleu: "
                                   "max_order; chrf: char_order, word_order, beta; length: target).")
    name: str | None = Field(None, description="Logged as reward/<name>; default: the built-in's name or the "
                             "function's.")
    refresh: RefreshConfig | None = Field(None, description="A reward-model term retrained online from pairs of the "
                                          "policy's replies (RefreshConfig); None: fixed.")

    @model_validator(mode="after")
    def _resolves(self) -> RewardTerm:
        registry.reward_function(self.fn, self.kwargs)  # now with its kwargs
        _check_refresh(self.fn, self.kwargs, self.refresh)
        if not math.isfinite(self.weight):
            raise ValueError(f"weight must be finite, got {self.weight}")
        if self.name is not None and not _TERM_NAME.match(self.name):
            raise ValueError(f"name {self.name!r}: letters, digits, '_', '.', '-' only (it names a metric)")
        return self

    @property
    def metric_name(self) -> str:
        return self.name or self.fn.rpartition(":")[2]


class RewardConfig(_RewardFunction):
    """The reward the algorithm maximises and val/reward, test/reward report: the task's own (``task``), one function
    (``fn``, ``kwargs``) or a weighted sum (``terms``); functions take detokenised text (rayseq/rewards/library.py).
    Any reward other than the task's is computed on the scorer actors (``scorer.*``; 0 scorers: the rollout workers).
    """

    fn: str = Field(
        "task", description="A built-in reward: task (the task's own), bleu, chrf, length, hf_classifier (a local "
        "Hugging Face classifier: kwargs path, label), reward_model (a reward model's folder: kwargs path), "
        "remote_reward (a server speaking OpenRLHF's /get_reward: kwargs url), llm_judge (an OpenAI-compatible "
        "endpoint: kwargs base_url, model, template); or your own function as "
        "an import path package.module:function(prompts, replies, references) -> floats.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of reward.fn (bleu: max_order; chrf: char_order, "
        "word_order, beta; length: target; hf_classifier: path, label, with_prompt, batch_size, max_length; "
        "reward_model: path, batch_size, max_length; remote_reward: url, timeout_s, retries, backoff_s, api_key; "
        "llm_judge: base_url, model, template, min_score, max_score, normalize, api_key, max_tokens, temperature, "
        "timeout_s).")
    terms: list[RewardTerm] = Field(
        default_factory=list, description="A weighted sum instead of reward.fn: a list of {fn, weight, kwargs, name}; "
        "each term is logged as reward/<name>.")
    batch_size: int | None = Field(
        None, ge=1, description="Replies per call of a text reward function; None = all of a scorer's batch.")
    refresh: RefreshConfig | None = Field(
        None, description="reward.fn=reward_model retrained online from pairs of the policy's replies (keys: "
        "labeller, labeller_kwargs, every, steps, prompts, group_size, batch_size, lr, temperature); in reward.terms "
        "a term's own refresh.")

    @model_validator(mode="after")
    def _resolves(self) -> RewardConfig:
        if self.terms and (self.fn != "task" or self.kwargs or self.refresh):
            raise ValueError("reward.terms: a weighted sum replaces reward.fn and reward.kwargs (and reward.refresh: "
                             "a term has its own); give one or the other")
        if not self.terms:
            try:
                registry.reward_function(self.fn, self.kwargs)
            except ValueError as exc:
                raise ValueError(f"reward.kwargs: {exc}") from None
        names = [t.metric_name for t in self.resolved_terms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"reward.terms: more than one term is named {dup[0]!r}; give them names (name: ...)")
        if not self.terms:
            try:
                _check_refresh(self.fn, self.kwargs, self.refresh)
            except ValueError as exc:
                raise ValueError(f"reward.{exc}") from None
        if sum(t.refresh is not None for t in self.terms) > 1:
            raise ValueError("reward.terms: more than one term has a refresh; one reward model is refreshed a run")
        return self

    @property
    def refreshed(self) -> RewardTerm | None:
        """The reward-model term that is refreshed online (its ``refresh``), or None."""
        return next((t for t in self.resolved_terms if t.refresh is not None), None)

    @property
    def resolved_terms(self) -> list[RewardTerm]:
        """The terms of the sum: ``terms``, or ``fn`` with ``kwargs`` and weight 1."""
        return list(self.terms) or [RewardTerm(fn=self.fn, kwargs=self.kwargs, refresh=self.refresh)]

    @property
    def is_task(self) -> bool:
        """The task's own reward, unweighted (the default): nothing to compute besides the task's."""
        terms = self.resolved_terms
        return len(terms) == 1 and terms[0].fn == "task" and terms[0].weight == 1.0

    def needing_references(self) -> list[str]:
        """The built-in terms that compare replies with references (bleu, chrf)."""
        return [t.fn for t in self.resolved_terms if t.fn in ("bleu", "chrf")]


class ModelConfig(_Section):
    """The generator (policy). ``arch`` picks the class; the keys below say which architecture reads them (``rnn``:
    rayseq/models/generator.py, ``transformer``: rayseq/models/transformer.py, ``hf``: rayseq/models/hf.py); a shared
    key the chosen one does not read is ignored, an ``hf``-only key given to ``rnn``/``transformer`` is refused."""

    arch: str = Field(
        "rnn", description="Generator architecture: rnn (GRU/LSTM encoder-decoder; SeqGAN's LSTM for unconditional "
        "tasks), transformer (encoder-decoder; decoder-only for unconditional tasks; KV cache), hf (a local Hugging "
        "Face causal LM, model.path; the hf extra), or your own class as an import path package.module:Class "
        "following rayseq/models/protocol.py.",
    )
    emb_dim: int = Field(128, ge=1, description="rnn: token embedding size (the transformer's is hidden_dim).")
    hidden_dim: int = Field(
        128, ge=1, description="rnn: GRU/LSTM hidden size (paper: 128 for counting); transformer: the width d_model. "
        "Both: the size of the per-step states the value heads read.",
    )
    num_layers: int = Field(
        1, ge=1, description="rnn: recurrent layers in encoder and decoder; transformer: layers of the encoder and "
        "of the decoder (each).",
    )
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="rnn: between GRU layers and on outputs; transformer: on embeddings, "
        "attention weights, residual branches and outputs.",
    )
    cell: Literal["gru", "lstm"] = Field("gru", description="rnn: recurrent cell (SeqGAN's generator: lstm).")
    n_heads: int = Field(4, ge=1, description="transformer: attention heads (hidden_dim must be a multiple).")
    ff_dim: int = Field(256, ge=1, description="transformer: inner size of each layer's feed-forward block.")
    max_positions: int = Field(
        128, ge=2, description="transformer: learned position embeddings, the longest source and the longest "
        "decoded reply (+1 for <bos>) it can read.",
    )
    path: str | None = Field(
        None, description="hf: a local Hugging Face model directory (config.json, weights, tokenizer), loaded with "
        "local_files_only (never a download); its tokenizer replaces the task's vocabulary. A run keeps it as an "
        "absolute path.", json_schema_extra=LOCAL_PATH,
    )
    lora_r: int = Field(0, ge=0, description="hf: rank of LoRA adapters (peft) trained instead of the weights; 0 = "
                        "full fine-tuning. With adapters the KL reference is the model with them disabled.")
    lora_alpha: float = Field(16.0, gt=0, description="hf: LoRA scaling alpha (the update is alpha/r · B·A).")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="hf: dropout on the LoRA adapters' input.")
    lora_target_modules: list[str] | None = Field(
        None, description="hf: names of the modules that get adapters (e.g. [c_attn] for GPT-2, [q_proj, v_proj] "
        "for Llama); None = peft's default for the architecture.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Precision of the policy's compute: bfloat16 = the rollout workers sample with a bf16 "
        "copy (the weights are published in bf16), the KL reference is held in bf16, and the learner computes its "
        "forward passes in bf16 (autocast; FSDP's mixed precision when sharded) with fp32 master weights, gradients "
        "reduced in fp32 and fp32 optimizer state; log-probs and losses are computed in fp32 from the bf16 logits. "
        "(float16 would need loss scaling: not offered.)",
    )

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, v: str) -> str:
        if v == "hf" and not _installed("transformers"):
            raise ValueError("model.arch=hf needs the hf extra: pip install 'rayseq[hf]' (transformers, tokenizers, "
                             "safetensors, peft)")
        if v == "hf" and (problem := transformers_problem()):
            raise ValueError(f"model.arch=hf: {problem}")
        registry.model_class(v)  # ValueError naming what is wrong
        return v

    @model_validator(mode="after")
    def _check_heads(self) -> ModelConfig:
        if self.arch == "transformer" and self.hidden_dim % self.n_heads:
            raise ValueError(f"model.hidden_dim={self.hidden_dim} must be a multiple of model.n_heads={self.n_heads} "
                             "(each head gets hidden_dim / n_heads)")
        return self

    @model_validator(mode="after")
    def _check_hf(self) -> ModelConfig:
        if self.arch in ("rnn", "transformer"):  # (a user's own class may read model.path)
            given = [k for k in ("path", "lora_target_modules") if getattr(self, k) is not None]
            given += ["lora_r"] if self.lora_r else []
            if given:
                raise ValueError(f"model.{given[0]}: read only by model.arch=hf (model.arch={self.arch})")
            return self
        if self.arch != "hf":
            return self
        if not self.path:
            raise ValueError("model.arch=hf: set model.path to a local Hugging Face model directory (one that "
                             "save_pretrained wrote: config.json, weights, tokenizer files)")
        if not Path(self.path).expanduser().is_dir():
            raise ValueError(f"model.path={self.path}: no such directory")
        if not (Path(self.path).expanduser() / "config.json").is_file():
            raise ValueError(f"model.path={self.path}: no config.json there (not a Hugging Face model directory)")
        return self


# resources Ray names itself: reserved through the num_cpus / num_gpus keys, or not reservable per actor
_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def _custom_resources(v: dict[str, float], key: str) -> dict[str, float]:
    """Checks a ``{name: amount}`` of custom Ray resources (``ray start --resources``) reserved per actor."""
    for name, amount in v.items():
        if not name or name in _BUILTIN_RESOURCES or name.startswith("node:"):
            hint = " (use the num_cpus / num_gpus keys)" if name in ("CPU", "GPU") else ""
            raise ValueError(f"{key}: {name!r} is not a custom resource{hint}; name one a node advertises with "
                             "`ray start --resources`")
        if not math.isfinite(amount) or amount < 0:
            raise ValueError(f"{key}: {name}={amount} must be a finite number >= 0 (0 = not needed)")
    return v


class RolloutConfig(_Section):
    num_workers: int = Field(2, ge=0, description="RolloutWorker actors; 0 = sample in-process.")
    num_cpus_per_worker: float = Field(0.5, gt=0, description="CPUs reserved per worker.")
    num_gpus_per_worker: float = Field(0.0, ge=0, description="GPUs reserved per worker (fractions ok).")
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources reserved per worker, e.g. {rollout_node: 1}: the "
        "workers go to nodes started with `ray start --resources`. 0 = not needed (drops a saved key on --resume).",
    )
    placement_strategy: Literal["PACK", "SPREAD"] = Field(
        "PACK", description="How the run's placement group (learner, workers, scorers) lies on the cluster: PACK = "
        "on as few nodes as fit, SPREAD = over as many nodes as possible, so one node's loss takes fewer actors. "
        "Either way Ray re-creates a lost node's workers and scorers on the surviving nodes if they have room.",
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of training rollouts.")
    torch_threads: int = Field(1, ge=1, description="torch threads inside each worker.")
    max_restarts: int = Field(3, ge=0, description="Times a crashed worker actor is restarted.")
    worker_grace_s: float = Field(
        30.0, gt=0, description="How long a failed rollout worker's shard waits for Ray to re-create the worker "
        "before another live worker takes it. A worker not back by then (its node lost, no room elsewhere) is left "
        "out: each batch is split over the workers there are (rollout/live_workers), and it takes shards again "
        "once Ray has re-created it.",
    )
    max_staleness: int = Field(
        0, ge=0, description="Asynchronous rollouts with a bound: the workers sample up to k batches ahead of the "
        "learner, each with the weights published when it went out, so the learner updates on rollouts at most k "
        "updates old (logged as rollout/staleness; rollout/in_flight the batches still out). 0: sample, then "
        "update (synchronous); 1: batch k+1 is sampled during update k. For algorithms whose loss weighs tokens by "
        "π_θ / π_behaviour with the log-probs recorded at sampling (PPO, PPO-dynamic, GRPO, ...).",
    )
    pipeline: bool = Field(
        False, description="Shorthand for rollout.max_staleness=1 (where max_staleness is 0): the workers sample "
        "batch k+1 during update k.",
    )

    engine: Literal["builtin", "vllm"] = Field(
        "builtin", description="What the workers sample with (rayseq.engines): builtin = the policy's own "
        "decoding loop (every model.arch); vllm = vLLM for model.arch=hf (pip install -e '.[vllm]' on CPUs, the "
        "CUDA vllm package on GPUs), whose log-probs the ratio algorithms correct for (rollout.logp_correction).",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="rollout.engine=vllm: keyword arguments of vllm.LLM as they are, e.g. "
        "{kv_cache_memory_bytes: 268435456, enable_prefix_caching: false, tensor_parallel_size: 1, dtype: bfloat16} "
        "(defaults: dtype = model.dtype, prefix caching on, the run's seed; without kv_cache_memory_bytes or "
        "gpu_memory_utilization the engines on a node share its memory: on CPUs half of what it has available split "
        "among them, at most what an engine's sequences fill; on GPUs vLLM's 0.92 × rollout.num_gpus_per_worker).",
    )
    logp_correction: Literal["tis", "none"] = Field(
        "tis", description="Where the engine's log-probs are not the policy's own (rollout.engine=vllm; the builtin "
        "engine's are, so nothing is corrected there): tis = truncated importance sampling on the ratio algorithms' "
        "advantages, weight min(π_policy / π_engine, rollout.tis_cap) per sampled token; none = off (the mismatch is "
        "still logged: rollout/logp_diff_*, rollout/engine_kl).",
    )
    tis_cap: float = Field(2.0, gt=0, description="Truncated importance sampling: the cap C of min(ρ_engine, C).")
    weight_sync: Literal["object_store", "collective"] = Field(
        "object_store", description="How new weights reach the rollout workers under Ray: object_store = one packed "
        "copy per version in the object store, which each worker pulls; collective = the learner broadcasts the "
        "generator's weights over a gloo group of their own in the model dtype, in buckets (rollout.weight_bucket_mb), "
        "each worker checking their checksum; a failed broadcast (a worker lost) falls back to the object store for "
        "that version and the group is rebuilt. Not the default: on one node the object store is faster. Composes "
        "with rollout.max_staleness up to 1, rollout.engine=vllm and learner.strategy=fsdp (every rank gathers each "
        "tensor, rank 0 sends the buckets as they fill: about two buckets held beyond its shards).",
    )
    weight_bucket_mb: float = Field(64.0, gt=0, description="rollout.weight_sync=collective: MiB per broadcast.")
    weight_sync_timeout_s: float = Field(
        60.0, gt=0, description="rollout.weight_sync=collective: how long a member waits in a broadcast for the others "
        "(a lost worker: then that version goes through the object store and the group is rebuilt).")

    @field_validator("resources_per_worker")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        return _custom_resources(v, "rollout.resources_per_worker")

    @field_validator("logp_correction", mode="before")
    @classmethod
    def _no_correction(cls, v):
        """``none`` on the command line and YAML's null (what an override ``none`` parses to) are the value "none"."""
        return "none" if v is None else v

    @model_validator(mode="before")
    @classmethod
    def _pipeline(cls, data):
        """``pipeline: true`` is ``max_staleness: 1`` unless a bound is given."""
        if isinstance(data, dict) and data.get("pipeline") in (True, "true", "True", 1) and not data.get(
                "max_staleness"):
            data = {**data, "max_staleness": 1}
        return data


class ScorerConfig(_Section):
    """ScorerActors: rewards of sampled rollouts, and what an algorithm scores with a model of its own (SeqGAN)."""

    num_scorers: int = Field(
        1, ge=0, description="ScorerActor actors, used by tasks and algorithms whose scoring is expensive (BLEU, a "
        "reward model, SeqGAN's scoring model); cheap rewards (counting) are computed on the rollout workers.",
    )
    num_cpus_per_scorer: float = Field(0.5, gt=0, description="CPUs reserved per scorer.")
    num_gpus_per_scorer: float = Field(0.0, ge=0, description="GPUs reserved per scorer (fractions ok).")
    resources_per_scorer: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources reserved per scorer (as rollout.resources_per_worker).",
    )
    torch_threads: int = Field(1, ge=1, description="torch threads inside each scorer.")
    batch_size: int = Field(4096, ge=1, description="Sequences per forward pass of a scoring model.")

    @field_validator("resources_per_scorer")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        return _custom_resources(v, "scorer.resources_per_scorer")


class LearnerConfig(_Section):
    num_cpus: float = Field(1.0, gt=0, description="CPUs reserved for the learner actor.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs reserved for the learner actor.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources reserved for the learner, e.g. {learner_node: 1}: "
        "it goes to a node started with `ray start --resources` (its loss stops the run: --resume continues it).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda if reserved, else cpu.")
    torch_threads: int = Field(1, ge=1, description="torch threads of the learner.")
    num_learners: int = Field(
        1, ge=1, description="Data-parallel learner actors (one torch.distributed group: gloo on CPU, NCCL on GPU); "
        "each takes its rows of every minibatch, gradients are summed with each rank's share of the mean's "
        "denominator, so N learners make the update one learner makes on the same batch. Each reserves "
        "learner.num_cpus / num_gpus. N > 1 needs rollout.num_workers >= 1 and an algorithm whose update is "
        "data-parallel (MLE pretraining, REINFORCE, SCST, RLOO, the actor-critic, the PPO and GRPO families, "
        "SeqGAN-PPO's g- and d-steps, the reward model).",
    )
    strategy: Literal["replicated", "fsdp"] = Field(
        "replicated", description="How num_learners > 1 learners hold the model: replicated (each the whole model, "
        "gradients all-reduced) or fsdp (FSDP2: each 1/N of the parameters, gradients and optimizer state, gathered "
        "per layer around each forward; checkpoints written by every learner with torch.distributed.checkpoint, "
        "resumable with another num_learners).",
    )
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="num_learners > 1: the learners' torch.distributed backend. auto = NCCL on GPU learners "
        "with a GPU each (learner.num_gpus >= 1), gloo otherwise: on CPUs, and on GPUs shared by learners (NCCL "
        "takes one rank per device).",
    )
    cpu_offload: bool = Field(
        False, description="learner.strategy=fsdp: keep parameters and optimizer state in host memory between uses "
        "(GPU learners; on a CPU learner it changes nothing).",
    )
    activation_checkpointing: bool = Field(
        False, description="Recompute the policy's layer activations in the backward pass instead of keeping them "
        "(model.arch=transformer: each layer under torch.utils.checkpoint; hf: transformers' gradient "
        "checkpointing): less memory, about a third more compute; the same gradients. Passes without gradients "
        "(sampling, evaluation) are unchanged.",
    )
    micro_batch_size: int | None = Field(
        None, ge=1, description="Rows per forward pass on a learner: the passes without gradients and the gradient "
        "pass of every update but scheduled sampling's and SeqGAN-critic's (a preference pair is 2 rows), whose "
        "gradients are accumulated over the micro-batches of each minibatch, each loss scaled by its share of the "
        "denominator: the same update as one pass. Memory is bounded by the micro-batch instead of the batch (an HF "
        "policy's log-probs a few positions at a time). None = an HF policy takes max(1, 16384 // (prompt + reply "
        "length)) rows at a time; the built-in models take the whole batch in one pass.",
    )
    max_restarts: int = Field(
        1, ge=0, description="Times a lost learner (a dead learner actor) is rebuilt inside the run from the latest "
        "checkpoint (or from the start when there is none yet): at most train.checkpoint_every iterations are "
        "redone. 0 = a lost learner ends the run (--resume continues it).",
    )

    @field_validator("resources")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        return _custom_resources(v, "learner.resources")


class TrainConfig(_Section):
    pretrain_iters: int = Field(1000, ge=0, description="MLE pretraining iterations (stage `mle`).")
    pretrain_lr: float = Field(3e-3, gt=0, description="MLE learning rate (Adam).")
    pretrain_batch_size: int = Field(256, ge=1, description="MLE batch size (input/target pairs).")
    iters: int = Field(200, ge=0, description="Iterations of the algorithm stage (stage `train`).")
    batch_size: int = Field(256, ge=1, description="Rollouts per iteration (split across workers).")
    eval_every: int = Field(25, ge=0, description="Evaluate every this many iterations (0 = only at ends).")
    pretrain_eval_every: int | None = Field(
        None, ge=0, description="Evaluate every this many MLE iterations; None = train.eval_every."
    )
    checkpoint_every: int = Field(0, ge=0, description="Checkpoint every this many iterations (0 = end).")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept in run_dir/checkpoints.")
    init_from: str | None = Field(
        None, description="Start the algorithm stage from this run's checkpoint (file, run dir or URI), skipping "
        "pretraining: compare algorithms from one pretrained start (the generator, and what the algorithm pretrains "
        "itself when that run has it).", json_schema_extra=LOCAL_PATH,
    )
    best_metric: str | None = Field(
        None, description="Keep the algorithm stage's best evaluation by this validation metric (val/*, e.g. "
        "val/bleu2) in run_dir/best, a run folder of its own (serve, export and train.init_from read it); the start "
        "(the pretrained model, or the untrained one without pretraining) is the first candidate, so an evaluation "
        "must beat it. Its test figures are computed at the end (summary.json `best`). None = only the final model.",
    )
    best_mode: Literal["max", "min"] = Field("max", description="Whether a higher or a lower best_metric is better.")
    best_keep_start: list[str] = Field(
        default_factory=list, description="Validation metrics (val/*) an evaluation must keep at least at the "
        "start's value (the pretrained model's) to be the best, e.g. [val/distinct2, val/distinct_replies]: a gain "
        "that costs this diversity is not chosen.",
    )

    @field_validator("best_metric")
    @classmethod
    def _best_metric(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("val/"):
            raise ValueError(f"{v!r}: the best is chosen on validation metrics (val/...), never on test/*")
        return v

    @field_validator("best_keep_start")
    @classmethod
    def _best_keep_start(cls, v: list[str]) -> list[str]:
        if bad := [k for k in v if not k.startswith("val/")]:
            raise ValueError(f"{bad[0]!r}: only validation metrics (val/...) can be kept")
        return v

    @model_validator(mode="after")
    def _best_needs(self) -> TrainConfig:
        if self.best_keep_start and self.best_metric is None:
            raise ValueError("train.best_keep_start is read only with train.best_metric (set both)")
        return self


class RunConfig(_Section):
    """A run's whole config: the run-level sections below, and the chosen algorithm's own sections
    (``Algorithm.sections``), validated by their own models and read as attributes like the others."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)  # the extras: the algorithm's own sections

    seed: int = Field(0, description="Seed of models, sampling and data order.")
    name: str | None = Field(None, description="Run name; default `<task>-<algo>-s<seed>-<time>`.")
    run_dir: str | None = Field(None, description="Output directory; default `runs/<name>`.")
    progress: bool | Literal["bar", "lines"] = Field(
        True, description="Progress output (stderr): true = a bar per stage on a terminal, else a plain line every "
        "progress_every seconds (ray job logs, CI, a file); bar; lines; false = none.",
    )
    progress_every: float = Field(
        30.0, gt=0, description="Seconds between progress lines (and one at the end of each stage).",
    )
    deterministic: bool = Field(
        False, description="torch.use_deterministic_algorithms in the learner, rollout workers and scorers: on a GPU, "
        "bit-reproducible runs and resumes (slower kernels). CPU runs are reproducible without it.",
    )

    @field_validator("progress", mode="before")
    @classmethod
    def _progress_mode(cls, v: Any) -> Any:
        if v not in (True, False, "bar", "lines") or isinstance(v, int) and not isinstance(v, bool):
            raise ValueError("expected true, false, bar or lines")
        return v
    # the chosen task's and algorithm's sections are subclasses (their keys): dumped as what they are
    task: SerializeAsAny[TaskConfig] = Field(default_factory=TaskConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algo: SerializeAsAny[AlgoConfig] = Field(default_factory=AlgoConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    scorer: ScorerConfig = Field(default_factory=ScorerConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)

    @model_validator(mode="before")
    @classmethod
    def _resolve_algorithm(cls, data: Any) -> Any:
        """The chosen algorithm's section: its ``algo.<name>:`` keys, then its own defaults (``defaults`` of its
        class, e.g. SeqGAN-PPO-dynamic's clip bounds) under what is given; the same for the task (chitchat's corpus).
        Resolved once: the result holds plain values, so the config a run writes and every actor rebuilds from it
        is the one the learner uses."""
        if isinstance(data, dict) and isinstance(data.get("algo", {}), dict):
            algo = resolve_algo_section(data.get("algo", {}))
            own = algorithm_config_model(algo.get("name", AlgoConfig.model_fields["name"].default))
            algo = _without_unread(algo, own, builtin_algo_keys)
            data = {**data, "algo": _validate_own(own, AlgoConfig, algo, "algo.")}
        if isinstance(data, dict):
            algo = data.get("algo", {})
            name = algo.get("name") if isinstance(algo, dict) else getattr(algo, "name", None)
            data = _with_sections(data, algorithm_sections(name or AlgoConfig.model_fields["name"].default))
        if isinstance(data, dict):
            data = _with_environment(data)
        if isinstance(data, dict) and isinstance(data.get("task", {}), dict):
            task = resolve_task_section(data.get("task", {}))
            model = data.get("model")
            own = task_config_model(task.get("name", TaskConfig.model_fields["name"].default))
            if isinstance(model, dict) and model.get("arch") == "hf" and model.get("path") \
                    and "hf_tokenizer" in own.model_fields and task.get("hf_tokenizer") is None:
                task = {**task, "hf_tokenizer": model["path"]}  # the model's tokenizer replaces the vocabulary
            task = _without_unread(task, own, builtin_task_keys)
            data = {**data, "task": _validate_own(own, TaskConfig, task, "task.")}
        return data

    @model_validator(mode="after")
    def _check_task_algo(self) -> RunConfig:
        algo, task = self.algorithm, self.task_class
        algo.check_config(self)  # the algorithm's own checks across sections (ValueError naming the keys)
        getattr(task, "check_config", lambda cfg: None)(self)  # the task's (e.g. a prompt-only dataset: no MLE)
        if algo.regularized and self.algo.kl_target is not None and self.algo.kl_coef == 0:
            raise ValueError("algo.kl_target needs algo.kl_coef > 0: the controller starts from kl_coef")
        if algo.needs_task_reward and not task.has_reward:
            raise ValueError(f"algo.name={self.algo.name!r}: the {self.task.name} task has no task reward; use one "
                             f"of {', '.join(registry.names_with('algo', needs_task_reward=False))}")
        if algo.needs_references and not task.has_references:
            raise ValueError(f"algo.name={self.algo.name!r} samples tokens by their BLEU increment against reference "
                             f"replies; it needs a task with references: "
                             f"{', '.join(registry.names_with('task', has_references=True))}")
        if self.rollout.max_staleness:
            check_pipeline(algo, self.algo.name, self.rollout.max_staleness)
        if self.reward.refreshed is not None:
            self._check_refresh()
        if self.learner.num_learners > 1:
            check_data_parallel(self)
        if self.learner.cpu_offload and self.learner.strategy != "fsdp":
            raise ValueError("learner.cpu_offload offloads FSDP's shards: set learner.strategy=fsdp")
        if self.learner.num_learners > 1 and self.learner.backend == "nccl" and self.learner.num_gpus < 1:
            raise ValueError(f"learner.backend=nccl with learner.num_gpus={self.learner.num_gpus:g}: NCCL takes one "
                             "rank per GPU, and learners with less than a GPU each share one; use learner.backend=gloo "
                             "(or auto), or learner.num_gpus=1")
        if self.learner.strategy == "fsdp" and self.learner.num_learners > 1 and 0 < self.learner.num_gpus < 1:
            raise ValueError(f"learner.strategy=fsdp with learner.num_gpus={self.learner.num_gpus:g}: FSDP splits a "
                             "model over devices so that each holds a part; learners sharing one GPU would hold every "
                             "part on the same device (no memory saved, and FSDP2's gradient pass fails there over "
                             "gloo); use learner.strategy=replicated to share a GPU, or learner.num_gpus=1 per learner")
        if self.learner.activation_checkpointing and self.model.arch not in ("hf", "transformer"):
            raise ValueError(f"learner.activation_checkpointing recomputes the layers of a Transformer "
                             f"(model.arch=transformer or hf); model.arch={self.model.arch} has none to recompute")
        if self.learner.device == "cuda" and self.rollout.num_workers > 0 and self.learner.num_gpus == 0:
            raise ValueError("learner.device=cuda with learner.num_gpus=0: under Ray an actor sees only the GPUs it "
                             "reserves; set learner.num_gpus=1 (or learner.device=auto)")
        if self.rollout.engine != "builtin" and self.model.arch != "hf":
            raise ValueError(f"rollout.engine={self.rollout.engine} samples Hugging Face policies (model.arch=hf), not "
                             f"model.arch={self.model.arch}; use rollout.engine=builtin")
        if self.rollout.weight_sync == "collective" and self.rollout.num_workers == 0:
            raise ValueError("rollout.weight_sync=collective: the workers are Ray actors (rollout.num_workers >= 1); "
                             "in-process the weights are loaded directly")
        if self.rollout.weight_sync == "collective" and self.rollout.max_staleness > 1:
            raise ValueError(f"rollout.weight_sync=collective with rollout.max_staleness={self.rollout.max_staleness}: "
                             "a worker receives the broadcast behind the batches already queued on it, and the "
                             "learner's next update waits behind its send, so every update would wait for all "
                             "batches in flight (the overlap of max_staleness=1 at a staleness of "
                             f"{self.rollout.max_staleness}); set rollout.max_staleness=1 (or 0), or "
                             "rollout.weight_sync=object_store")
        if self.rollout.engine_kwargs and self.rollout.engine == "builtin":
            raise ValueError("rollout.engine_kwargs: read only by rollout.engine=vllm")
        if self.model.arch == "hf":
            if "hf_tokenizer" not in type(self.task).model_fields:
                raise ValueError(f"model.arch=hf replaces the task's vocabulary with the model's tokenizer; the "
                                 f"{self.task.name} task has its own (use a text task: pairs, chitchat, or a task "
                                 "class with hf_tokenizer in its fields)")
            if not same_path(self.task.hf_tokenizer, self.model.path):  # (a resumed run's is absolute)
                raise ValueError(f"task.hf_tokenizer={self.task.hf_tokenizer}: with model.arch=hf the tokenizer is "
                                 f"the model's (model.path={self.model.path}); leave task.hf_tokenizer out")
        needing = self.reward.needing_references()
        if needing and not task.has_references:
            raise ValueError(f"reward: {needing[0]} compares replies with reference replies; the {self.task.name} task "
                             f"has none (tasks with references: "
                             f"{', '.join(registry.names_with('task', has_references=True))})")
        return self

    @property
    def num_scorers(self) -> int:
        """Scorer actors this run creates (0 when the rollout workers score: cheap task rewards)."""
        if self.rollout.num_workers == 0:
            return 0
        return self.scorer.num_scorers if self.algorithm.own_reward or self.rollouts_scored_remotely else 0

    @property
    def rollouts_scored_remotely(self) -> bool:
        """Sampled rollouts are scored on the scorer actors (when there are any): the task's reward is expensive
        (chitchat's BLEU against all references), or the reward is configured (user code, maybe a GPU model)."""
        return self.task_class.scored_remotely or self.uses_reward_config

    def _check_refresh(self) -> None:
        """What a refreshed reward model needs of the rest of the run (rayseq/algos/reward_refresh.py)."""
        algo = self.algorithm
        if algo.own_reward or algo.kind != "rollout":
            raise ValueError(f"reward.refresh: algo.name={self.algo.name} does not learn from the configured reward "
                             "of sampled replies, so a refreshed reward model would score nothing; use a rollout "
                             "algorithm (reinforce, ppo, grpo, ...)")
        if not self.task_class.has_reward:
            raise ValueError(f"reward.refresh: the {self.task.name} task takes no configured reward")
        if self.rollout.max_staleness:
            raise ValueError(f"reward.refresh with rollout.max_staleness={self.rollout.max_staleness}: batches sampled "
                             "ahead are scored before a refresh's weights reach the scorers; set "
                             "rollout.max_staleness=0")
        if self.rollout.num_workers > 0 and self.scorer.num_scorers == 0:
            raise ValueError("reward.refresh with scorer.num_scorers=0: the refreshed weights go to the scorer actors, "
                             "which score the replies; set scorer.num_scorers >= 1 (or rollout.num_workers=0 to run "
                             "in-process)")

    @property
    def uses_reward_config(self) -> bool:
        """The reward is ``reward.*`` rather than the task's own (not read by tasks without a reward and by the
        algorithms with a reward of their own, ``own_reward``)."""
        return not self.reward.is_task and self.task_class.has_reward and not self.algorithm.own_reward

    @property
    def algorithm(self):
        """The class of the chosen algorithm (its traits: ``own_reward``, ``data_parallel``, ...)."""
        return registry.algorithm_class(self.algo.name)

    @property
    def task_class(self):
        """The class of the chosen task (its traits: ``has_reward``, ``has_references``, ``scored_remotely``)."""
        return registry.task_class(self.task.name)

    @property
    def train_stage_iters(self) -> int:
        """Iterations of stage ``train``: ``train.iters``, and what the algorithm adds (a warm-up of its own)."""
        return self.algorithm.train_iters(self)

    def __reduce__(self):
        """Pickled (to a Ray actor) as its resolved dict, validated again where it is loaded: the chosen algorithm's
        and task's sections are classes made at validation time, which pickle cannot name, and the actor's process
        makes its own."""
        return _validated, (config_to_dict(self),)


def _with_environment(data: dict) -> dict:
    """A run with ``env.name`` runs episodes: its task is ``env`` (the episodes' task, which reads the ``env:``
    section: handed to it as ``task.env``), and it has no MLE pretraining unless asked for (an environment has no
    reference replies). Derived here, once."""
    env = data.get("env")
    name = env.get("name") if isinstance(env, dict) else getattr(env, "name", None)
    task = data.get("task", {})
    tname = task.get("name") if isinstance(task, dict) else getattr(task, "name", None)
    if not name:
        if tname == "env":
            raise ConfigError("task.name=env runs episodes of an environment: set env.name (and leave task.name out)")
        return data
    if tname not in (None, "env"):
        raise ConfigError(f"env.name={name} runs episodes, whose task is the environment's; task.name={tname} cannot "
                          "be combined with it (leave task.name out)")
    if not isinstance(task, dict):
        return data
    env_dict = env.model_dump() if hasattr(env, "model_dump") else dict(env)
    data = {**data, "task": {**task, "name": "env", "env": env_dict}}
    train = data.get("train", {})
    if isinstance(train, dict) and "pretrain_iters" not in train:
        data["train"] = {**train, "pretrain_iters": 0}
    return data


def _validated(data: dict) -> RunConfig:
    """A RunConfig from :func:`config_to_dict`'s dict (how a pickled one comes back). What no longer holds where it
    is loaded (``model.path`` gone from an actor's node) is a ConfigError naming the key (:func:`blame`: the start-up
    report names it), as pydantic's own error cannot be pickled back to the driver."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        exc = ConfigError(_format_validation_error(err))
        if errors := err.errors():  # the key a section's check names first (model.path=...), else where it failed
            named = re.match(r"([a-z_]+(?:\.[A-Za-z0-9_]+)+)[=:]", errors[0]["msg"].removeprefix("Value error, "))
            blame(named.group(1) if named else ".".join(map(str, errors[0]["loc"])), exc)
        raise exc from None


def _known_keys(loc: tuple) -> list[str]:
    """The keys of the config section at ``loc`` (``("algo",)``): its fields, and for ``algo`` (``task``) every
    built-in algorithm's (task's) keys; [] where ``loc`` is no section."""
    model: type[BaseModel] = RunConfig
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    keys = [*model.model_fields]
    builtin = builtin_algo_keys() if model is AlgoConfig else builtin_task_keys() if model is TaskConfig else set()
    return [*keys, *sorted(builtin - set(keys))]


def _format_validation_error(err: ValidationError, prefix: str = "", own: tuple[str, ...] = ()) -> str:
    """One line naming each bad key; an unknown key with the closest known one (``own``: the chosen algorithm's or
    task's keys, first)."""
    lines = []
    for e in err.errors():
        key = prefix + ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            section = (*filter(None, prefix.split(".")), *e["loc"][:-1])
            known = [*own, *_known_keys(section)] if len(section) == 1 else _known_keys(section)
            msg = "unknown key" + did_you_mean(e["loc"][-1], known, ".".join(map(str, section)))
        elif "input" in e and not isinstance(e["input"], dict):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"{key}: {msg}" if key and not msg.startswith(key) else msg)  # a message may name its key
    return "invalid config: " + "; ".join(lines)


def _without_unread(section: dict, model: type, builtin) -> dict:
    """``section`` without the keys some built-in algorithm (task) reads and the chosen one, ``model``, does not: a
    config written before a run's config kept only the keys it reads (every algorithm's keys in one section) still
    loads on the actors, in serving and in evaluation. A user's config never gets here
    with such a key: :func:`build_config` refuses it first (:func:`check_applicable`)."""
    if all(k in model.model_fields for k in section):
        return section
    known = builtin()
    return {k: v for k, v in section.items() if k in model.model_fields or k not in known}


def _with_sections(data: dict, own: dict) -> dict:
    """``data`` with the chosen algorithm's own sections (``own``: name -> Section class) validated, the missing ones
    at their defaults; a section only other algorithms read is dropped (a config written by or for another
    algorithm: :func:`check_applicable` refuses it where a user gives it); any other unknown top-level key is an
    error naming it."""
    out = {}
    for key, value in data.items():
        if key in RunConfig.model_fields:
            out[key] = value
        elif key in own:
            out[key] = value if isinstance(value, own[key]) else _validate_own(own[key], None, value or {}, f"{key}.")
        elif key not in builtin_sections():
            known = [*RunConfig.model_fields, *own]
            raise ValueError(f"{key}: unknown key{did_you_mean(key, known)}")
    for key, model in own.items():
        out.setdefault(key, model())
    return out


def _validate_own(model: type, base: type | None, section: dict, prefix: str):
    """A section whose algorithm or task declares keys of its own (``model`` extends ``base``), or a section of the
    algorithm's own (``base`` None): validated with the rest, as that model (what RunConfig keeps); else left to
    RunConfig."""
    if model is base:
        return section
    try:
        return model.model_validate(section)
    except ValidationError as err:
        msg = _format_validation_error(err, prefix=prefix, own=tuple(model.model_fields))
        raise ValueError(msg.removeprefix("invalid config: ")) from None


def check_data_parallel(cfg: RunConfig) -> None:
    """``learner.num_learners=N > 1``: learner actors (Ray), an algorithm whose update shards its minibatches over
    the ranks (``Algorithm.data_parallel``), and at least N rows in every minibatch the ranks split (each rank a
    non-empty part: a mean over nothing has no share of the denominator to weight)."""
    n = cfg.learner.num_learners
    algo = cfg.algorithm
    if cfg.rollout.num_workers == 0:
        raise ValueError(f"learner.num_learners={n} runs learner actors under Ray: set rollout.num_workers >= 1")
    if not algo.data_parallel:
        raise ValueError(f"learner.num_learners={n}: algo.name={cfg.algo.name}'s update is not data-parallel; use one "
                         f"of {', '.join(registry.names_with('algo', data_parallel=True))} or learner.num_learners=1")
    sizes = {"train.pretrain_batch_size": cfg.train.pretrain_batch_size} if cfg.train.pretrain_iters else {}
    if algo.kind == "supervised":
        sizes["train.batch_size"] = cfg.train.batch_size
    else:
        batch = cfg.train.batch_size
        mb = min(getattr(cfg.algo, "minibatch_size", None) or batch, batch)  # one step on the whole batch: no key
        sizes["algo.minibatch_size"] = mb
        if batch % mb:
            sizes["train.batch_size mod algo.minibatch_size"] = batch % mb
    for key, size in sizes.items():
        if size < n:
            raise ValueError(f"learner.num_learners={n}: {key}={size} rows cannot give each learner one; use at "
                             f"least {n}")


def build_config(data: dict | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Defaults <- ``data`` (e.g. an experiment file's content) <- ``key=value`` overrides.

    Everything given is checked (:func:`check_applicable`); the result is resolved (:class:`RunConfig`)."""
    over = parse_overrides(overrides or [])
    algo_over = over.get("algo")
    merged = deep_merge(given_later(data or {}, algo_over if isinstance(algo_over, dict) else {}), over)
    check_applicable(merged)
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None


def config_to_dict(cfg: RunConfig) -> dict:
    """The resolved config as a JSON/YAML-safe dict (inf stays a float, which YAML writes as .inf), with the
    keys the run uses: of ``algo:`` and ``task:`` those the chosen algorithm and task read, and the algorithm's own
    sections (``Algorithm.sections``). So a run's config.yaml shows what the learner uses, and it is itself a valid
    ``--config`` (:func:`build_config` refuses keys that do not apply)."""
    d = cfg.model_dump(mode="python", serialize_as_any=True)  # an algorithm's own keys (a subclass) too
    algo = registry.algorithm_class(cfg.algo.name)
    reads = set(declared_algo_keys(cfg.algo.name))
    d["algo"] = {k: v for k, v in d["algo"].items() if k in reads}
    task_cls = registry.task_class(cfg.task.name)
    task_reads = set(declared_task_keys(cfg.task.name))
    d["task"] = {k: v for k, v in d["task"].items() if k in task_reads and k != "env"}  # env: the env: section's
    if cfg.env.name is None:  # a run without an environment has no env: section to show
        del d["env"]
    if algo.own_reward or not task_cls.has_reward:
        del d["reward"]
    elif cfg.reward.terms:
        d["reward"] = {"terms": [{k: v for k, v in t.items() if k != "refresh" or v is not None}  # fixed: no refresh
                                 for t in d["reward"]["terms"]], "batch_size": cfg.reward.batch_size}
    else:
        del d["reward"]["terms"]
        if d["reward"]["refresh"] is None:
            del d["reward"]["refresh"]
    return d
