"""Typed, validated run configuration.

Every field is documented; an unknown key or a bad value raises :class:`ConfigError` naming the key.
A config is built from defaults, then an experiment YAML (``--config``), then ``key=value`` overrides
(``algo.eps=0.2 rollout.num_workers=0``); values are parsed as YAML scalars (``.inf``/``inf`` work).
Derived values live in one place: the ``@property`` helpers at the bottom of each model.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from rayseq import registry

ALGOS = tuple(registry.ALGORITHMS)  # the names are listed once, in rayseq.registry; traits live on the classes
TASKS = tuple(registry.TASKS)
REGULARIZER_KEYS = ("kl_coef", "kl_target", "entropy_coef")  # read by every algorithm with ``regularized``


class ConfigError(ValueError):
    """A bad config key or value; the message names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# old names of keys, still read: task.data_dir is task.data
TASK_ALIASES = {"data_dir": "data"}


class TaskConfig(_Section):
    name: str = Field(
        "counting", description="Task: data + reward + evaluation; a built-in name (counting, oracle, pairs, chitchat) "
        "or your own class as an import path package.module:Class.",
    )
    test_size: int = Field(
        2000, ge=100,
        description="Held-out test inputs (counting), oracle samples (NLL-test), prompts (pairs: of the prepared test "
        "split).",
    )
    test_seed: int = Field(
        2018, description="Seed of the held-out test set (counting, oracle) and of the sampled replies of "
        "test/reward, independent of `seed`.")
    val_size: int = Field(
        2000, ge=1, description="Validation inputs (counting), oracle samples (NLL of held-out data) or prompts "
        "(pairs: of the prepared valid split) evaluated as val/* every train.eval_every iterations; everything "
        "that selects (Tune, best/, ERPO interpolation's annealing) reads val/*, never test/*.",
    )
    val_seed: int = Field(
        2019, description="Seed of the validation set (counting, oracle) and of the sampled replies of val/reward, "
        "independent of `seed` and test_seed.")
    min_len: int = Field(1, ge=1, le=10, description="Counting: shortest input length N.")
    max_len: int = Field(10, ge=1, le=10, description="Counting: longest input length N.")
    oracle_path: str | None = Field(
        None, description="Oracle: .npz with the oracle LSTM's arrays (SeqGAN's original); None = a random one."
    )
    oracle_seed: int = Field(0, description="Oracle: seed of the random N(0,1) oracle (when no oracle_path).")
    vocab_size: int = Field(5000, ge=2, description="Oracle: vocabulary of a random oracle (a file sets its own).")
    oracle_hidden: int = Field(32, ge=1, description="Oracle: embedding and hidden size of a random oracle.")
    seq_len: int = Field(20, ge=2, description="Oracle: sequence length (no end token).")
    num_train: int = Field(10000, ge=1, description="Oracle: training sequences sampled from the oracle.")
    data_seed: int = Field(88, description="Oracle: seed of the training sequences (SeqGAN's code uses 88).")
    eval_samples: int = Field(10000, ge=1, description="Oracle: generator samples scored by NLL-oracle.")
    data: str | None = Field(
        None, description="Pairs: a dataset prepared by `python -m rayseq.data prepare SOURCE --out DIR` (chitchat: "
        "data/chitchat); the old name task.data_dir is read too.")
    source: str | None = Field(
        None, description="Pairs: what task.prepare prepares into task.data, e.g. jsonl:pairs.jsonl (chitchat: "
        "chitchat, the chitchat-dataset corpus).")
    prepare: bool = Field(
        False, description="Pairs: prepare task.source into task.data first if it holds no dataset."
    )
    tokenizer: Literal["words", "bpe"] | None = Field(
        None, description="Pairs: the vocabulary task.prepare prepares with (words: the most frequent words, others "
        "<unk>; bpe: subword pieces learned on the training split, never <unk> in a reply), and the one task.data must "
        "have been prepared with; None = prepare's default (words) and whatever task.data holds.")
    prepare_vocab_size: int | None = Field(
        None, ge=5, description="Pairs: vocabulary size (words or bpe pieces, the 4 specials included) task.prepare "
        "prepares with; None = prepare's default (4000).")
    hf_tokenizer: str | None = Field(
        None, description="Pairs: a local Hugging Face tokenizer directory whose tokens replace the prepared "
        "vocabulary (the dataset's text is re-tokenised with it); set from model.path when model.arch=hf.")

    @field_validator("name")
    @classmethod
    def _known_task(cls, v: str) -> str:
        registry.task_class(v)  # ValueError naming what is wrong
        return v

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return rename_aliases(data, TASK_ALIASES, "task") if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _check_lengths(self) -> TaskConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"task.min_len={self.min_len} > task.max_len={self.max_len}")
        if self.prepare and not self.source:
            raise ValueError("task.prepare=true: set task.source, what to prepare into task.data (e.g. "
                             "jsonl:pairs.jsonl)")
        return self


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (configs are validated on every actor)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def rename_aliases(section: dict, aliases: dict[str, str], where: str) -> dict:
    """``section`` with old key names replaced by the current ones (an error if both are given)."""
    if not any(old in section for old in aliases):
        return section
    out = dict(section)
    for old, new in aliases.items():
        if old in out:
            if new in out:
                raise ValueError(f"{where}.{old} is the old name of {where}.{new}; give one of them")
            out[new] = out.pop(old)
    return out


_TERM_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class _RewardFunction(_Section):
    """A section with a reward function ``fn``: a built-in name or an import path that must resolve."""

    @field_validator("fn", check_fields=False)
    @classmethod
    def _known_function(cls, v: str) -> str:
        registry.reward_function(v, check_kwargs=False)  # ValueError naming what is wrong
        return v


class RewardTerm(_RewardFunction):
    """One term w · f(prompts, replies, references, **kwargs) of reward.terms."""

    fn: str = Field(description="A built-in reward (task, bleu, chrf, length) or your own function as an import path "
                    "package.module:function taking (prompts, replies, references).")
    weight: float = Field(1.0, description="Its weight w in the sum.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the function (bleu: "
                                   "max_order; chrf: char_order, word_order, beta; length: target).")
    name: str | None = Field(None, description="Logged as reward/<name>; default: the built-in's name or the "
                             "function's.")

    @model_validator(mode="after")
    def _resolves(self) -> RewardTerm:
        registry.reward_function(self.fn, self.kwargs)  # now with its kwargs
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
        "Hugging Face classifier: kwargs path, label); or your own function as "
        "an import path package.module:function(prompts, replies, references) -> floats.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of reward.fn (bleu: max_order; chrf: char_order, "
        "word_order, beta; length: target; hf_classifier: path, label, with_prompt, batch_size, max_length).")
    terms: list[RewardTerm] = Field(
        default_factory=list, description="A weighted sum instead of reward.fn: a list of {fn, weight, kwargs, name}; "
        "each term is logged as reward/<name>.")
    batch_size: int | None = Field(
        None, ge=1, description="Replies per call of a text reward function; None = all of a scorer's batch.")

    @model_validator(mode="after")
    def _resolves(self) -> RewardConfig:
        if self.terms and (self.fn != "task" or self.kwargs):
            raise ValueError("reward.terms: a weighted sum replaces reward.fn and reward.kwargs; give one or the other")
        if not self.terms:
            try:
                registry.reward_function(self.fn, self.kwargs)
            except ValueError as exc:
                raise ValueError(f"reward.kwargs: {exc}") from None
        names = [t.metric_name for t in self.resolved_terms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"reward.terms: more than one term is named {dup[0]!r}; give them names (name: ...)")
        return self

    @property
    def resolved_terms(self) -> list[RewardTerm]:
        """The terms of the sum: ``terms``, or ``fn`` with ``kwargs`` and weight 1."""
        return list(self.terms) or [RewardTerm(fn=self.fn, kwargs=self.kwargs)]

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
        "Both: the size of the per-step states the value baseline and the critic read.",
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
        "local_files_only (never a download); its tokenizer replaces the task's vocabulary.",
    )
    lora_r: int = Field(0, ge=0, description="hf: rank of LoRA adapters (peft) trained instead of the weights; 0 = "
                        "full fine-tuning. With adapters the KL reference is the model with them disabled.")
    lora_alpha: float = Field(16.0, gt=0, description="hf: LoRA scaling alpha (the update is alpha/r · B·A).")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="hf: dropout on the LoRA adapters' input.")
    lora_target_modules: list[str] | None = Field(
        None, description="hf: names of the modules that get adapters (e.g. [c_attn] for GPT-2, [q_proj, v_proj] "
        "for Llama); None = peft's default for the architecture.",
    )

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, v: str) -> str:
        if v == "hf" and not _installed("transformers"):
            raise ValueError("model.arch=hf needs the hf extra: pip install 'rayseq[hf]' (transformers, tokenizers, "
                             "safetensors, peft)")
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


class DiscConfig(_Section):
    """SeqGAN's CNN discriminator (Yu et al. Sec. 4 and Appendix) and its training (Alg. 1)."""

    emb_dim: int = Field(64, ge=1, description="Token embedding size of D.")
    filter_sizes: list[int] = Field(
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20], min_length=1, description="Convolution window sizes (paper)."
    )
    num_filters: list[int] = Field(
        [100, 200, 200, 200, 200, 100, 100, 100, 100, 100, 160, 160], min_length=1,
        description="Feature maps per window size (paper).",
    )
    dropout: float = Field(0.25, ge=0.0, lt=1.0, description="Dropout before the output (code: keep 0.75).")
    l2_reg: float = Field(0.2, ge=0.0, description="L2 penalty on the output layer (SeqGAN code: 0.2).")
    lr: float = Field(1e-4, gt=0, description="Adam learning rate of D (SeqGAN code: 1e-4).")
    batch_size: int = Field(64, ge=1, description="D minibatch size.")
    pretrain_steps: int = Field(50, ge=0, description="D pretraining d-steps before adversarial training (paper: 50).")
    d_steps: int = Field(5, ge=0, description="d-steps per adversarial iteration (paper: 5).")
    epochs: int = Field(3, ge=1, description="k: epochs over each d-step's data (paper: 3).")
    num_negatives: int = Field(10000, ge=1, description="Fresh generated negatives (and as many positives) per d-step.")

    @model_validator(mode="after")
    def _check_filters(self) -> DiscConfig:
        if len(self.filter_sizes) != len(self.num_filters):
            raise ValueError(
                f"disc.filter_sizes has {len(self.filter_sizes)} entries "
                f"but disc.num_filters has {len(self.num_filters)}"
            )
        if min(self.filter_sizes) < 1 or min(self.num_filters) < 1:
            raise ValueError("disc.filter_sizes and disc.num_filters must be positive")
        return self


class AlgoConfig(_Section):
    """The algorithm stage. Keys an algorithm does not read are refused when given (:func:`build_config`); an
    experiment file shared by several algorithms puts such keys under the algorithm's name, e.g.
    ``algo: {name: ppo, scheduled_sampling: {ss_k: 30}}`` (used only when algo.name=scheduled_sampling)."""

    name: str = Field(
        "ppo_dynamic", description="Algorithm of the RL stage (after MLE pretraining): a built-in name "
        "(rayseq.registry) or your own class as an import path package.module:Class.",
    )
    lr: float = Field(3e-4, gt=0, description="Generator learning rate (Adam) in the algorithm stage.")
    baseline_lr: float = Field(1e-2, gt=0, description="Value-baseline learning rate (Adam).")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount factor of returns.")
    epochs: int = Field(1, ge=1, description="PPO: K passes over each sampled batch (paper code: 1).")
    minibatch_size: int | None = Field(
        64, ge=1, description="PPO: minibatch size of the K passes; None = the whole batch (then ρ = 1)."
    )
    eps: float = Field(0.2, gt=0, lt=1, description="PPO: clip range ε of Eq. 3, in (0, 1) (ρ clipped to [1−ε, 1+ε]).")
    alpha1: float = Field(math.inf, gt=0, description="PPO-dynamic: cap of the upper bound α (Eq. 4).")
    alpha2: float = Field(1.0, gt=0, description="PPO-dynamic: scale of the upper bound α (Eq. 4).")
    beta1: float = Field(math.inf, gt=0, description="PPO-dynamic: cap of the lower bound β (Eq. 4).")
    beta2: float = Field(1.0, gt=0, description="PPO-dynamic: scale of the lower bound β (Eq. 4).")
    normalize_advantages: bool = Field(False, description="Whiten advantages per batch (not in the paper).")
    max_grad_norm: float | None = Field(5.0, gt=0, description="Gradient-norm clip; None disables it.")
    mixer_delta_start: int = Field(1, ge=0, description="MIXER: initial number δ of REINFORCE steps.")
    mixer_delta_step: int = Field(1, ge=1, description="MIXER: δ grows by this much ...")
    mixer_delta_every: int = Field(50, ge=1, description="MIXER: ... every this many iterations.")
    mc_rollouts: int = Field(16, ge=1, description="SeqGAN: N Monte-Carlo continuations per prefix (Eq. 4).")
    rollout_update_rate: float = Field(
        0.8, ge=0.0, lt=1.0,
        description="SeqGAN: r in β ← r·β + (1−r)·θ for the rollout policy G_β (code: 0.8; 0 = G_β is G_θ).",
    )
    g_steps: int = Field(1, ge=1, description="SeqGAN: generator updates per adversarial iteration (paper: 1).")
    use_baseline: bool = Field(
        True, description="Subtract the learned baseline b(s_t) (REINFORCE, MIXER, PPO: yes; the SeqGAN family's "
        "default is no, as its code uses Q directly).",
    )
    # -- ERPO family and the survey's algorithms (issue 8) --
    ss_k: float = Field(
        500.0, gt=0, description="Scheduled sampling: k of the inverse-sigmoid decay ε_i = k/(k + exp(i/k)), the "
        "probability of feeding the reference token at iteration i (ERPO Supp. C.2: 500).",
    )
    raml_tau: float = Field(
        0.4, gt=0, description="RAML: temperature τ of e(y|y*) ∝ exp(R(y|y*)/τ) (ERPO Supp. C.2: 0.4).")
    raml_samples: int = Field(
        10, ge=1, description="RAML: samples drawn from e(y|y*) per example (ERPO Supp. C.2: 10).")
    raml_pool: int = Field(
        100, ge=2, description="RAML: n-gram-replacement candidates per example (the reference is one of them) "
        "among which the samples are drawn by exp(R/τ) (Ma et al. 2017's sampler: 100).",
    )
    raml_max_ngram: int = Field(4, ge=1, description="RAML: longest replaced n-gram (Ma et al. 2017: 4).")
    noise_gamma: float = Field(
        0.1, ge=0.0, le=1.0, description="Data noising: probability γ that a reference token is replaced by a "
        "unigram sample (Xie et al. 2017; ERPO Sec. 3.5).",
    )
    erpo_c: float = Field(
        1.0, gt=0, description="SPG / interpolation: scale c of the sampling distributions exp{c·(…)} "
        "(ERPO Eq. 4, Supp. Alg. 1; ΔR is sentence BLEU in [0, 1], as the authors' code).",
    )
    interp_lambdas: list[float] = Field(
        [0.04, 0.0, 0.96], min_length=3, max_length=3,
        description="Interpolation: initial (λ1 model, λ2 reward, λ3 reference) (ERPO Supp. C.2).",
    )
    interp_delta: float = Field(0.06, gt=0, le=1, description="Interpolation: λ step of each annealing (0.06).")
    interp_reward_steps: int = Field(
        4, ge=0, description="Interpolation: λ2 increases this many times after each λ1 increase (4).",
    )
    interp_val_every: int = Field(
        25, ge=1, description="Interpolation: validation reward (task.val_size validation inputs) every this many "
        "iterations; a drop anneals λ and restores the weights of the last validation (ERPO Supp. C.2).",
    )
    gae_lambda: float = Field(
        0.95, ge=0.0, le=1.0,
        description="Actor-critic / SeqGAN-critic: λ of TD(λ) targets and GAE (survey Sec. III-B).",
    )
    critic_lr: float = Field(1e-3, gt=0, description="Actor-critic / SeqGAN-critic: critic learning rate (Adam).")
    critic_hidden: int = Field(128, ge=0, description="Critic MLP hidden size on the decoder state (0 = linear).")
    kl_coef: float = Field(
        0.0, ge=0.0, description="Rollout algorithms: β of the per-token KL to the pretrained policy subtracted from "
        "the reward, r_t − β·(log π_old − log π_ref) (Ziegler et al. 2019; InstructGPT); 0 = off.",
    )
    kl_target: float | None = Field(
        None, gt=0, description="Rollout algorithms: adapt β towards this KL per reply (nats; Ziegler et al.'s "
        "controller, starting from kl_coef); None = β fixed.",
    )
    entropy_coef: float = Field(
        0.0, ge=0.0, description="Rollout algorithms: weight of the entropy bonus −c·H(π(·|s_t)) in the policy loss.",
    )
    critic_warmup: int = Field(
        0, ge=0, description="Actor-critic / SeqGAN-critic: iterations before the algorithm's budget that train the "
        "critic only (generator fixed, no d-steps), as Bahdanau et al. (2017) pretrain their critic.",
    )

    @field_validator("name")
    @classmethod
    def _known_algorithm(cls, v: str) -> str:
        registry.algorithm_class(v)  # ValueError naming what is wrong
        return v

    @field_validator("interp_lambdas")
    @classmethod
    def _lambdas_are_a_distribution(cls, v: list[float]) -> list[float]:
        # ERPO Alg. 1: each token comes from one of three sources with probabilities (λ1, λ2, λ3)
        if any(not 0.0 <= x <= 1.0 for x in v) or not math.isclose(sum(v), 1.0, abs_tol=1e-6):
            raise ValueError(f"algo.interp_lambdas: (λ1, λ2, λ3) are probabilities: each in [0, 1], summing to 1 "
                             f"(got {v}, sum {sum(v):g})")
        return v


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
    pipeline: bool = Field(
        False, description="Pipelined rollouts: the workers sample batch k+1 with the weights before update k while "
        "the learner updates on batch k (staleness 1, logged as rollout/staleness). For algorithms whose loss weighs "
        "tokens by π_θ / π_behaviour with the log-probs recorded at sampling (PPO, PPO-dynamic, GRPO, ...).",
    )

    @field_validator("resources_per_worker")
    @classmethod
    def _resources(cls, v: dict[str, float]) -> dict[str, float]:
        return _custom_resources(v, "rollout.resources_per_worker")


class ScorerConfig(_Section):
    """ScorerActors: discriminator / reward scoring of rollouts and Monte-Carlo continuations."""

    num_scorers: int = Field(
        1, ge=0, description="ScorerActor actors, used by tasks and algorithms whose scoring is expensive (SeqGAN's "
        "discriminator, BLEU); cheap rewards (counting) are computed on the rollout workers.",
    )
    num_cpus_per_scorer: float = Field(0.5, gt=0, description="CPUs reserved per scorer.")
    num_gpus_per_scorer: float = Field(0.0, ge=0, description="GPUs reserved per scorer (fractions ok).")
    resources_per_scorer: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources reserved per scorer (as rollout.resources_per_worker).",
    )
    torch_threads: int = Field(1, ge=1, description="torch threads inside each scorer.")
    batch_size: int = Field(4096, ge=1, description="Sequences per discriminator forward pass.")

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
        "data-parallel (MLE pretraining, the PPO and GRPO families, SeqGAN-PPO's g- and d-steps).",
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
        "pretraining: compare algorithms from one pretrained generator and discriminator.",
    )


class RunConfig(_Section):
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
    task: TaskConfig = Field(default_factory=TaskConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    scorer: ScorerConfig = Field(default_factory=ScorerConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    disc: DiscConfig = Field(default_factory=DiscConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)

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
            data = {**data, "algo": _validate_own(own, AlgoConfig, algo, "algo.")}
        if isinstance(data, dict) and isinstance(data.get("task", {}), dict):
            task = resolve_task_section(data.get("task", {}))
            model = data.get("model")
            if isinstance(model, dict) and model.get("arch") == "hf" and model.get("path") \
                    and task.get("hf_tokenizer") is None:  # the model's tokenizer replaces the vocabulary
                task = {**task, "hf_tokenizer": model["path"]}
            own = task_config_model(task.get("name", TaskConfig.model_fields["name"].default))
            data = {**data, "task": _validate_own(own, TaskConfig, task, "task.")}
        return data

    @model_validator(mode="after")
    def _check_task_algo(self) -> RunConfig:
        algo, task = self.algorithm, self.task_class
        algo.check_config(self)  # the algorithm's own checks across sections (ValueError naming the keys)
        getattr(task, "check_config", lambda cfg: None)(self)  # the task's (e.g. a prompt-only dataset: no MLE)
        if self.algo.kl_target is not None and self.algo.kl_coef == 0:
            raise ValueError("algo.kl_target needs algo.kl_coef > 0: the controller starts from kl_coef")
        if algo.needs_task_reward and not task.has_reward:
            raise ValueError(f"algo.name={self.algo.name!r}: the {self.task.name} task has no task reward; use one "
                             f"of {', '.join(registry.names_with('algo', needs_task_reward=False))}")
        if algo.needs_references and not task.has_references:
            raise ValueError(f"algo.name={self.algo.name!r} samples tokens by their BLEU increment against reference "
                             f"replies; it needs a task with references: "
                             f"{', '.join(registry.names_with('task', has_references=True))}")
        if self.rollout.pipeline:
            check_pipeline(algo, self.algo.name)
        if self.is_gan and self.rollout.num_workers > 0 and self.scorer.num_scorers == 0:
            raise ValueError("scorer.num_scorers=0: SeqGAN scores Monte-Carlo continuations on scorer actors; "
                             "set scorer.num_scorers >= 1 (or rollout.num_workers=0 to run in-process)")
        if self.learner.num_learners > 1:
            check_data_parallel(self)
        if self.learner.device == "cuda" and self.rollout.num_workers > 0 and self.learner.num_gpus == 0:
            raise ValueError("learner.device=cuda with learner.num_gpus=0: under Ray an actor sees only the GPUs it "
                             "reserves; set learner.num_gpus=1 (or learner.device=auto)")
        if self.model.arch == "hf":
            if "hf_tokenizer" not in task.params:
                raise ValueError(f"model.arch=hf replaces the task's vocabulary with the model's tokenizer; the "
                                 f"{self.task.name} task has its own (use a text task: pairs, chitchat, or a task "
                                 "class with hf_tokenizer in its params)")
            if self.task.hf_tokenizer != self.model.path:
                raise ValueError(f"task.hf_tokenizer={self.task.hf_tokenizer}: with model.arch=hf the tokenizer is "
                                 f"the model's (model.path={self.model.path}); leave task.hf_tokenizer out")
            if self.is_gan:
                raise ValueError(f"algo.name={self.algo.name}: the SeqGAN family is not supported with "
                                 "model.arch=hf (its discriminator and Monte-Carlo search need rayseq's vocabulary "
                                 "and the RNN's states); use a rollout algorithm, e.g. ppo_dynamic or grpo")
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
        return self.scorer.num_scorers if self.is_gan or self.rollouts_scored_remotely else 0

    @property
    def rollouts_scored_remotely(self) -> bool:
        """Sampled rollouts are scored on the scorer actors (when there are any): the task's reward is expensive
        (chitchat's BLEU against all references), or the reward is configured (user code, maybe a GPU model)."""
        return self.task_class.scored_remotely or self.uses_reward_config

    @property
    def uses_reward_config(self) -> bool:
        """The reward is ``reward.*`` rather than the task's own (not read by tasks without a reward and by the
        adversarial algorithms, whose reward is the discriminator's)."""
        return not self.reward.is_task and self.task_class.has_reward and not self.is_gan

    @property
    def algorithm(self):
        """The class of the chosen algorithm (its traits: ``adversarial``, ``monte_carlo``, ``uses_critic``, ...)."""
        return registry.algorithm_class(self.algo.name)

    @property
    def task_class(self):
        """The class of the chosen task (its traits: ``has_reward``, ``has_references``, ``scored_remotely``)."""
        return registry.task_class(self.task.name)

    @property
    def is_gan(self) -> bool:
        """SeqGAN family: a discriminator is trained and scores the rollouts."""
        return self.algorithm.adversarial

    @property
    def train_stage_iters(self) -> int:
        """Iterations of stage ``train``: ``train.iters`` plus the critic-only warm-up of critic algorithms."""
        return self.train.iters + (self.algo.critic_warmup if self.algorithm.uses_critic else 0)

    @property
    def uses_mc(self) -> bool:
        """SeqGAN's Q from Monte-Carlo search with a rollout policy G_β (not ``seqgan_critic``)."""
        return self.algorithm.monte_carlo


def _known_keys(loc: tuple) -> list[str]:
    """The keys of the config section at ``loc`` (``("algo",)``): its fields, and for ``algo`` every algorithm's
    own keys; [] where ``loc`` is no section."""
    model: type[BaseModel] = RunConfig
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    keys = [*model.model_fields]
    return [*keys, *sorted(_builtin_declared_keys() - set(keys))] if model is AlgoConfig else keys


def did_you_mean(key, known, section: str = "") -> str:
    """`` (did you mean algo.eps?)`` for a mistyped key close to a known one, else ""."""
    import difflib

    close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    return f" (did you mean {section + '.' if section else ''}{close[0]}?)" if close else ""


def _format_validation_error(err: ValidationError, prefix: str = "") -> str:
    lines = []
    for e in err.errors():
        key = prefix + ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            section = (*filter(None, prefix.split(".")), *e["loc"][:-1])
            msg = "unknown key" + did_you_mean(e["loc"][-1], _known_keys(section), ".".join(map(str, section)))
        elif "input" in e and not isinstance(e["input"], dict):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"{key}: {msg}" if key and not msg.startswith(key) else msg)  # a message may name its key
    return "invalid config: " + "; ".join(lines)


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["algo.eps=0.2", "seed=3"]`` -> nested dict; values parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} has an empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}: cannot parse value {raw!r}: {exc}") from None
        if isinstance(value, str) and value.lower() in ("inf", "+inf", "-inf"):
            value = float(value)
        elif isinstance(value, str) and value.lower() == "none":  # Python's spelling of YAML's null
            value = None
        set_path(out, key, value)
    return out


def set_path(d: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        nxt = d.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
        d = nxt
    d[parts[-1]] = value


def deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


def _validate_own(model: type, base: type, section: dict, prefix: str):
    """A section whose algorithm or task declares keys of its own (``model`` extends ``base``): validated with the
    rest, as that model (what RunConfig keeps); else left to RunConfig."""
    if model is base:
        return section
    try:
        return model.model_validate(section)
    except ValidationError as err:
        raise ValueError(_format_validation_error(err, prefix=prefix).removeprefix("invalid config: ")) from None


def _with_fields(base: type, section: str, name: str, lookup) -> type:
    """``base`` (AlgoConfig, TaskConfig) extended by the keys class ``name`` declares itself (its ``fields``: key ->
    (type, pydantic Field)), so adding an algorithm or a task never edits this file."""
    try:
        fields = lookup(name).fields
    except ValueError:  # an unknown name: the section's own validation says so
        return base
    if not fields:
        return base
    clash = sorted(set(fields) & set(base.model_fields))
    if clash:
        raise ValueError(f"{section}.name={name}: its fields {clash} are {base.__name__} keys already; use them, or "
                         "other names")
    return create_model(f"{base.__name__}_{name.replace('.', '_').replace(':', '_')}", __base__=base, **fields)


@functools.cache
def algorithm_config_model(name: str) -> type[AlgoConfig]:
    """AlgoConfig with algorithm ``name``'s own keys (e.g. GRPO's ``group_size``)."""
    return _with_fields(AlgoConfig, "algo", name, registry.algorithm_class)


@functools.cache
def task_config_model(name: str) -> type[TaskConfig]:
    """TaskConfig with task ``name``'s own ``task.*`` keys."""
    return _with_fields(TaskConfig, "task", name, registry.task_class)


@functools.cache
def _builtin_declared_keys() -> frozenset[str]:
    """Keys the built-in algorithms declare themselves (so ``algo.group_size`` with ``ppo`` is "not read by ppo",
    not "unknown")."""
    return frozenset(k for n in registry.ALGORITHMS for k in registry.algorithm_class(n).fields)


def declared_algo_keys(name: str) -> tuple[str, ...]:
    """The ``algo.*`` keys algorithm ``name`` reads: the common ones, its ``params`` and its own ``fields``."""
    cls = registry.algorithm_class(name)
    return (*registry.COMMON_ALGO_KEYS, *cls.params, *cls.fields, *(REGULARIZER_KEYS if cls.regularized else ()))


def _section_key(key: str) -> bool:
    """An ``algo.<algorithm>:`` sub-section (a built-in name or an import path; no AlgoConfig field is either)."""
    return key in registry.ALGORITHMS or registry.is_import_path(key)


def resolve_algo_section(algo: dict) -> dict:
    """``algo:`` as given -> the chosen algorithm's keys: ``algo.<name>:`` sub-sections merged for the chosen
    name (the others dropped), over the algorithm's ``defaults``. Unknown names are left to validation."""
    name = algo.get("name", AlgoConfig.model_fields["name"].default)
    given = {k: v for k, v in algo.items() if not _section_key(k)}
    own = algo.get(name)
    if isinstance(own, dict):
        given.update(own)
    if not registry.resolves("algo", name):
        return given
    return {**registry.algorithm_class(name).defaults, **given}


def resolve_task_section(task: dict) -> dict:
    """``task:`` as given -> old key names renamed (task.data_dir), over the task's ``defaults`` (chitchat's corpus).
    Unknown names are left to validation."""
    try:
        given = rename_aliases(task, TASK_ALIASES, "task")
    except ValueError:
        return task  # both names: TaskConfig says so
    name = given.get("name", TaskConfig.model_fields["name"].default)
    if not registry.resolves("task", name):
        return given
    return {**registry.task_class(name).defaults, **given}


def check_pipeline(algo, name: str) -> None:
    """``rollout.pipeline=true`` trains on rollouts one update old: only algorithms that correct for it with the
    behaviour log-probs (``off_policy_ratio``), rewarded by the task and without state between batches."""
    why = None
    if not algo.off_policy_ratio:
        why = ("its update has no importance ratio π_θ / π_behaviour to correct rollouts sampled with the previous "
               "weights")
    elif algo.adversarial or algo.scoring != "task":
        why = "its rewards come from the discriminator, which trains between the batches"
    elif algo.stateful_request or algo.validate_every:
        why = "its rollout requests depend on the learner's state at sampling time"
    if why:
        raise ValueError(f"rollout.pipeline=true: algo.name={name} cannot train on pipelined rollouts ({why}); use "
                         f"one of {', '.join(registry.names_with('algo', off_policy_ratio=True, adversarial=False))} "
                         "or rollout.pipeline=false")


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
        mb = min(cfg.algo.minibatch_size or batch, batch)
        sizes["algo.minibatch_size"] = mb
        if batch % mb:
            sizes["train.batch_size mod algo.minibatch_size"] = batch % mb
    if algo.adversarial:
        rows = 2 * cfg.disc.num_negatives
        sizes["disc.batch_size"] = min(cfg.disc.batch_size, rows)
        if rows % cfg.disc.batch_size:
            sizes["2 * disc.num_negatives mod disc.batch_size"] = rows % cfg.disc.batch_size
    for key, size in sizes.items():
        if size < n:
            raise ValueError(f"learner.num_learners={n}: {key}={size} rows cannot give each learner one; use at "
                             f"least {n}")


def check_applicable(data: dict) -> None:
    """An explicitly given key that the chosen algorithm or task does not read is an error naming the key and
    the algorithm (task); defaults are fine. ``data``: the config as given (before defaults are filled in)."""
    algo = data.get("algo") if isinstance(data.get("algo"), dict) else {}
    name = algo.get("name", AlgoConfig.model_fields["name"].default)
    if registry.resolves("algo", name):
        for sub_name, section in [(name, algo), *((k, v) for k, v in algo.items() if _section_key(k))]:
            if not isinstance(section, dict):
                raise ConfigError(f"algo.{sub_name}: expected a mapping of the keys {sub_name} reads, got {section!r}")
            reads = declared_algo_keys(sub_name)
            known = {*AlgoConfig.model_fields, *_builtin_declared_keys(), *reads}
            where = "algo" if section is algo else f"algo.{sub_name}"
            for key in section:
                if section is not algo and key not in known:  # the top level: pydantic's check
                    raise ConfigError(f"{where}.{key}: unknown key{did_you_mean(key, reads, where)}")
                if key in known and key not in reads and not _section_key(key):
                    hint = (" (a key for several algorithms of one experiment file goes under algo.<algorithm>:)"
                            if section is algo else "")
                    raise ConfigError(f"{where}.{key}: algo.name={sub_name} does not read this key; {sub_name} reads "
                                      f"{', '.join(reads)}{hint}")
        disc = data.get("disc")
        if disc and not registry.algorithm_class(name).adversarial:
            raise ConfigError(f"disc.{next(iter(disc))}: algo.name={name} trains no discriminator (the disc.* keys "
                              f"are read by the adversarial algorithms: "
                              f"{', '.join(registry.names_with('algo', adversarial=True))})")
    task = data.get("task") if isinstance(data.get("task"), dict) else {}
    tname = task.get("name", TaskConfig.model_fields["name"].default)
    if registry.resolves("task", tname):
        reads = ("name", *registry.task_class(tname).params, *registry.task_class(tname).fields)
        for given in task:
            key = TASK_ALIASES.get(given, given)
            if key in TaskConfig.model_fields and key not in reads:
                raise ConfigError(f"task.{given}: task.name={tname} does not read this key; {tname} reads "
                                  f"{', '.join(reads)}")
        reward = data.get("reward") if isinstance(data.get("reward"), dict) else {}
        if reward and not registry.task_class(tname).has_reward:
            raise ConfigError(f"reward.{next(iter(reward))}: task.name={tname} has no reward (its sequences are scored "
                              "by a discriminator); reward.* applies to tasks with one: "
                              f"{', '.join(registry.names_with('task', has_reward=True))}")
        if reward and registry.resolves("algo", name) and registry.algorithm_class(name).adversarial:
            raise ConfigError(f"reward.{next(iter(reward))}: algo.name={name} learns from its discriminator, not from "
                              "reward.*")


def build_config(data: dict | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Defaults <- ``data`` (e.g. an experiment file's content) <- ``key=value`` overrides.

    Everything given is checked (:func:`check_applicable`); the result is resolved (:class:`RunConfig`)."""
    merged = deep_merge(data or {}, parse_overrides(overrides or []))
    check_applicable(merged)
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None


def config_to_dict(cfg: RunConfig) -> dict:
    """The resolved config as a JSON/YAML-safe dict (inf stays a float, which YAML writes as .inf), with the
    keys the run uses: of ``algo:`` and ``task:`` those the chosen algorithm and task read, ``disc:`` only for
    an adversarial algorithm. So a run's config.yaml shows what the learner uses, and it is itself a valid
    ``--config`` (:func:`build_config` refuses keys that do not apply)."""
    d = cfg.model_dump(mode="python", serialize_as_any=True)  # an algorithm's own keys (a subclass) too
    algo = registry.algorithm_class(cfg.algo.name)
    reads = set(declared_algo_keys(cfg.algo.name))
    d["algo"] = {k: v for k, v in d["algo"].items() if k in reads}
    task_cls = registry.task_class(cfg.task.name)
    task_reads = {"name", *task_cls.params, *task_cls.fields}
    d["task"] = {k: v for k, v in d["task"].items() if k in task_reads}
    if not algo.adversarial:
        del d["disc"]
    if algo.adversarial or not task_cls.has_reward:
        del d["reward"]
    elif cfg.reward.terms:
        d["reward"] = {"terms": d["reward"]["terms"], "batch_size": cfg.reward.batch_size}
    else:
        del d["reward"]["terms"]
    return d


# -- resuming a run ------------------------------------------------------------------------------------------
# What a resumed run (`python -m rayseq.train run_dir=DIR --resume KEY=VALUE ...`) may change: what its checkpoint
# does not fix. Everything else — task.*, model.*, algo.name and the algorithm's hyperparameters, seed, batch sizes,
# rollout.temperature, disc.* but its lr — is what the checkpoint was trained with, and a change is refused.
RESUMABLE = {
    "reporting": ("name", "run_dir", "progress", "progress_every", "train.eval_every", "train.pretrain_eval_every",
                  "train.checkpoint_every", "train.keep_checkpoints"),
    "length": ("train.iters", "train.pretrain_iters"),  # train.pretrain_iters only while the run is still in MLE
    # re-applied to the optimizers after loading (Learner.apply_config_lrs), as Tune's PBT does
    "learning rates": ("train.pretrain_lr", "algo.lr", "algo.baseline_lr", "algo.critic_lr", "disc.lr"),
    # the in-process and the Ray paths run the same code
    "resources": ("rollout.num_workers", "rollout.num_cpus_per_worker", "rollout.num_gpus_per_worker",
                  "rollout.torch_threads", "rollout.max_restarts", "scorer.num_scorers", "scorer.num_cpus_per_scorer",
                  "scorer.num_gpus_per_scorer", "scorer.torch_threads", "scorer.batch_size", "learner.num_cpus",
                  "learner.num_gpus", "learner.device", "learner.torch_threads", "learner.num_learners",
                  "learner.max_restarts", "rollout.placement_strategy",
                  "deterministic",
                  # {name: amount} keys: each name below them (learner.resources.node_a)
                  "rollout.resources_per_worker", "scorer.resources_per_scorer", "learner.resources"),
}


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resume_config(saved: dict, data: dict | None = None, overrides: list[str] | None = None, *,
                  stage: str | None = None) -> tuple[RunConfig, list[tuple[str, Any, Any]]]:
    """The config of a resumed run: the run's saved config (its checkpoint's ``config``) <- ``data`` (a
    ``--config`` file, if one is given again) <- ``key=value`` overrides. Returns the config and what changed,
    ``[(key, saved value, new value)]``. A key that keeps its saved value is fine (so the original command plus
    ``--resume`` works); changing a key outside :data:`RESUMABLE` is a :class:`ConfigError` naming it.
    ``stage``: the checkpoint's stage (``train.pretrain_iters`` may change only during ``mle``)."""
    try:
        before = build_config(saved)
    except ConfigError as exc:
        raise ConfigError(f"the run's saved config does not load in this version of rayseq: {exc}") from None
    given = deep_merge(data or {}, parse_overrides(overrides or []))
    names = [(f"{sec}.name", saved[sec]["name"], given[sec]["name"]) for sec in ("task", "algo")
             if isinstance(given.get(sec), dict) and given[sec].get("name", saved[sec]["name"]) != saved[sec]["name"]]
    if names:  # before building: the other algorithm's (task's) keys would not apply to the saved ones
        _refuse_on_resume(names)
    after = build_config(deep_merge(saved, data or {}), overrides)
    old, new = _flat(config_to_dict(before)), _flat(config_to_dict(after))
    keys = [*old, *(k for k in new if k not in old)]
    changed = [(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]
    allowed = {k for group in RESUMABLE.values() for k in group}
    if stage not in (None, "mle"):
        allowed.discard("train.pretrain_iters")
    if refused := [c for c in changed if c[0] not in allowed and c[0].rsplit(".", 1)[0] not in allowed]:
        _refuse_on_resume(refused)
    return after, changed


def _refuse_on_resume(changes: list[tuple[str, Any, Any]]) -> None:
    shown = [f"{k} ({a!r} -> {b!r})" for k, a, b in changes]
    if len(shown) > 4:
        shown[3:] = [f"{len(shown) - 3} more"]
    late = " (MLE pretraining is over)" if any(k == "train.pretrain_iters" for k, _, _ in changes) else ""
    raise ConfigError(
        f"--resume cannot change {', '.join(shown)}{late}: the checkpoint was trained with the run's values. "
        "A resume may change the length (train.iters; train.pretrain_iters during MLE), evaluation and "
        "checkpoint schedule (train.*_every, train.keep_checkpoints), learning rates, resources (rollout, "
        "scorer, learner counts, CPUs, GPUs, threads, device) and progress output; anything else is a new run "
        "(another run_dir, or train.init_from=DIR to start from this one's model)")
