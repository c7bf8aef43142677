"""Names of the built-in algorithms, tasks, models (``model.arch``) and reward functions, and what is behind them;
or a user's own, by import path.

A name resolves to a class that is imported on first use, so this foundation module imports nothing above
it: configs validate names here (a built-in name, or ``package.module:Name`` for user code that need not be
part of rayseq) and read what the class declares (the ``algo.*`` / ``task.*`` keys it reads,
its default values) without loading torch-heavy modules until a name is actually looked up.

What a class declares (class attributes):

- algorithms: ``fields`` — the ``algo.*`` keys it reads besides :data:`COMMON_ALGO_KEYS`, declared with the
  class as ``key -> (type, pydantic Field)`` (``config_fields()`` adds the regularizer's keys);
  ``defaults`` — the algorithm's own values of shared keys (SeqGAN-PPO-dynamic's clip bounds of Tuan et al.
  Supplement C), resolved into the config once, so a run's ``config.yaml`` shows what the learner uses;
  ``sections`` — config sections of its own (SeqGAN's ``disc:``); ``own_reward`` — its rewards come from a model it
  trains itself; ``needs_references`` — needs a task with reference replies; ``needs_task_reward`` — needs a task
  reward.
- tasks: ``fields`` — the ``task.*`` keys the task reads besides ``name``, declared as an algorithm's;
  ``defaults`` (optional) — the task's own values of ``task.*`` keys (chitchat's corpus), resolved into the
  config like an algorithm's; ``has_reward`` — a task reward exists; ``has_references`` — inputs have
  reference replies (BLEU increments ΔR are defined); ``scored_remotely`` — the reward is expensive enough for
  the scorer actors.

Models (``model.arch``) are generator classes of the policy protocol (rayseq/models/protocol.py): a built-in name of
:data:`MODELS` or ``package.module:Class``; the class builds itself with ``from_config(cfg, task)``.

Environments (``env.name``) are classes or factories of the environment protocol (rayseq/episodes/protocol.py:
``reset(seed, **row)``, ``step(action)``): a built-in name of :data:`ENVIRONMENTS` or ``package.module:Class``.

Reward functions (``reward.fn``, ``reward.terms[].fn``) are functions ``fn(prompts, replies, references, **kwargs)
-> Sequence[float]`` on text (:mod:`rayseq.rewards.reward`): a built-in name of :data:`REWARDS` or
``package.module:function``.
"""

from __future__ import annotations

import importlib
import inspect

from rayseq import reward_protocol

ALGORITHMS: dict[str, str] = {
    "mle": "rayseq.algos.mle:MLE",
    "reinforce": "rayseq.algos.reinforce:Reinforce",
    "mixer": "rayseq.algos.mixer:Mixer",
    "mixer_ppo": "rayseq.algos.mixer:MixerPPO",
    "mixer_ppo_dynamic": "rayseq.algos.mixer:MixerPPODynamic",
    "ppo": "rayseq.algos.ppo:PPO",
    "ppo_dynamic": "rayseq.algos.ppo_dynamic:PPODynamic",
    "seqgan": "rayseq.algos.seqgan:SeqGAN",
    "seqgan_ppo": "rayseq.algos.seqgan:SeqGANPPO",
    "seqgan_ppo_dynamic": "rayseq.algos.seqgan:SeqGANPPODynamic",
    "scst": "rayseq.algos.scst:SCST",
    "scheduled_sampling": "rayseq.algos.scheduled_sampling:ScheduledSampling",
    "raml": "rayseq.algos.raml:RAML",
    "data_noising": "rayseq.algos.data_noising:DataNoising",
    "spg": "rayseq.algos.spg:SPG",
    "erpo_interpolation": "rayseq.algos.erpo_interpolation:ERPOInterpolation",
    "actor_critic": "rayseq.algos.actor_critic:ActorCritic",
    "seqgan_critic": "rayseq.algos.seqgan_critic:SeqGANCritic",
    "grpo": "rayseq.algos.grpo:GRPO",
    "rloo": "rayseq.algos.rloo:RLOO",
    "grpo_dynamic": "rayseq.algos.grpo_dynamic:GRPODynamic",
    "reward_model": "rayseq.algos.reward_model:RewardModel",
}
TASKS: dict[str, str] = {
    "counting": "rayseq.tasks.counting:CountingTask",
    "oracle": "rayseq.tasks.oracle:OracleTask",
    "pairs": "rayseq.tasks.pairs:PairsTask",
    "chitchat": "rayseq.tasks.chitchat:ChitchatTask",
    "env": "rayseq.episodes.task:EnvTask",  # episodes of the env: section's environment (set by env.name)
    "preferences": "rayseq.tasks.preferences:PreferencesTask",  # pairs (prompt, chosen, rejected): reward models
}
MODELS: dict[str, str] = {  # model.arch: the generator (policy) class, see rayseq/models/protocol.py
    "rnn": "rayseq.models.generator:Seq2SeqGRU",
    "transformer": "rayseq.models.transformer:TransformerGenerator",
    "hf": "rayseq.models.hf:HFCausalLM",  # a local Hugging Face causal LM (hf extra)
}
ENVIRONMENTS: dict[str, str] = {  # env.name: a class (or factory) taking env.kwargs, rayseq/episodes/protocol.py
    "guess_number": "rayseq.episodes.games:GuessNumber",
    "tictactoe": "rayseq.episodes.games:TicTacToe",
    "gridworld": "rayseq.episodes.games:GridWorld",
    # the packages users already have (rayseq/episodes/adapters.py; each imported when made)
    "trl": "rayseq.episodes.adapters:TRLEnvironment",
    "reasoning_gym": "rayseq.episodes.adapters:ReasoningGym",
    "textarena": "rayseq.episodes.adapters:TextArena",
    "gem": "rayseq.episodes.adapters:GEM",
    "openenv": "rayseq.episodes.adapters:OpenEnv",
}
REWARDS: dict[str, str] = {
    "task": "rayseq.rewards.library:task",
    "bleu": "rayseq.rewards.library:bleu",
    "chrf": "rayseq.rewards.library:chrf",
    "length": "rayseq.rewards.library:length",
    "novelty": "rayseq.rewards.library:novelty",
    "hf_classifier": "rayseq.rewards.hf_classifier:hf_classifier",  # a local Hugging Face classifier (hf extra)
    "reward_model": "rayseq.rewards.hf_classifier:reward_model",  # a reward model's folder (num_labels=1)
    "remote_reward": "rayseq.rewards.remote:remote_reward",  # a server speaking OpenRLHF's POST /get_reward
    "llm_judge": "rayseq.rewards.remote:llm_judge",  # an OpenAI-compatible chat endpoint and a prompt template
}
REWARD_ARGS = ("prompts", "replies", "references")  # what a reward function is called with, in this order
# algo.* keys every algorithm reads: its name, the learning rate of the algorithm stage, the gradient clip
COMMON_ALGO_KEYS = ("name", "lr", "max_grad_norm")


# what a class must provide to be used as an algorithm / a task (the optional hooks have defaults elsewhere)
REQUIRED = {
    "algo": ("update", "kind", "config_fields", "build_modules", "prompt_copies"),  # subclass rayseq.algos.Algorithm
    "task": ("sample_prompts", "rewards", "evaluate", "metric_names", "fields"),
    # the core of the policy protocol (rayseq/models/protocol.py; what else a model needs depends on the algorithm)
    "model": ("from_config", "logprobs", "sample"),
}
KINDS = {"algo": "algorithm", "task": "task", "model": "model"}
SEE = {"algo": "rayseq/algos/common.py", "task": "rayseq/tasks/__init__.py", "model": "rayseq/models/protocol.py"}


def is_import_path(name: str) -> bool:
    """``package.module:Name`` (user code) rather than a built-in name."""
    return ":" in name


def _import(what: str, table: dict[str, str], name: str):
    """(the object a built-in name or a ``package.module:Name`` import path names, its attribute name). ValueError
    saying what is wrong (the caller names the key)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"expected a built-in name or package.module:Name, got {name!r}")
    if is_import_path(name):
        path = name
    elif name in table:
        path = table[name]
    else:
        raise ValueError(f"unknown {what} {name!r}; built-in: {', '.join(table)}; or your own as an import path "
                         "package.module:Name")
    module, _, attr = path.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise ValueError(f"{name}: module {exc.name!r} not found (run from the folder that holds "
                             f"{module.split('.')[0]!r}, or install it)") from None
        raise ValueError(f"{name}: importing {module!r} failed: {exc}") from exc  # a module it imports is missing
    except Exception as exc:  # the user's module raised while importing: say so, not where
        raise ValueError(f"{name}: importing {module!r} failed: {type(exc).__name__}: {exc}") from exc
    try:
        return getattr(mod, attr), attr
    except AttributeError:
        raise ValueError(f"{name}: module {module!r} has no attribute {attr!r}") from None


def _load(kind: str, table: dict[str, str], name: str):
    """The class a built-in name or a ``package.module:Name`` import path names. ValueError saying what is wrong
    (the caller names the key: ``algo.name`` / ``task.name``)."""
    what = KINDS[kind]
    cls, attr = _import(what, table, name)
    missing = [a for a in REQUIRED[kind] if not hasattr(cls, a)]
    if not isinstance(cls, type) or missing:
        why = "not a class" if not isinstance(cls, type) else f"it lacks {', '.join(missing)}"
        raise ValueError(f"{name}: {attr} is not {'an' if kind == 'algo' else 'a'} {what} class ({why}; see "
                         f"{SEE[kind]})")
    return cls


def algorithm_class(name: str):
    """The class of algorithm ``name``: a key of :data:`ALGORITHMS` or an import path ``package.module:Class``."""
    return _load("algo", ALGORITHMS, name)


def task_class(name: str):
    """The class of task ``name``: a key of :data:`TASKS` or an import path ``package.module:Class``."""
    return _load("task", TASKS, name)


def model_class(name: str):
    """The generator class of ``model.arch`` ``name``: a key of :data:`MODELS` or an import path
    ``package.module:Class`` (the policy protocol of rayseq/models/protocol.py)."""
    return _load("model", MODELS, name)


def environment_factory(name: str):
    """The class (or factory function) of ``env.name`` ``name``: a key of :data:`ENVIRONMENTS` or an import path
    ``package.module:Name``, checked to be callable and, when a class, to have ``reset`` and ``step``. ValueError
    saying what is wrong (the caller names the key)."""
    obj, attr = _import("environment", ENVIRONMENTS, name)
    if not callable(obj):
        raise ValueError(f"{name}: {attr} is not a class or a function (an environment has reset(seed, **row) and "
                         "step(action); see rayseq/episodes/protocol.py)")
    missing = [m for m in ("reset", "step") if isinstance(obj, type) and not callable(getattr(obj, m, None))]
    if missing:
        raise ValueError(f"{name}: {attr} is not an environment class (it lacks {', '.join(missing)}; see "
                         "rayseq/episodes/protocol.py)")
    return obj


def reward_function(name: str, kwargs: dict | None = None, *, check_kwargs: bool = True):
    """The function a reward name (a key of :data:`REWARDS` or ``package.module:function``) names, checked to take
    ``(prompts, replies, references)`` and the keyword arguments ``kwargs`` (``check_kwargs=False``: only the three
    positional arguments; what ``kwargs`` must give is left to a later call), or, written to TRL's keyword protocol
    (:mod:`rayseq.reward_protocol`), ``prompts=``, ``completions=``, ``completion_ids=`` and ``kwargs`` (the dataset
    columns it needs are checked at the first batch): ValueError saying what is wrong."""
    fn, attr = _import("reward function", REWARDS, name)
    if isinstance(fn, type) or not callable(fn):
        raise ValueError(f"{name}: {attr} is not a function (a reward is fn(prompts, replies, references) -> "
                         "Sequence[float])")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: it will be called and checked
        return fn
    if reward_protocol.is_keyword(fn):  # TRL's f(prompts=, completions=, completion_ids=, **columns)
        try:
            reward_protocol.check_keyword(fn, kwargs if check_kwargs else None)
        except TypeError as exc:
            given = "".join(f", {k}=..." for k in kwargs or {}) if check_kwargs else ""
            raise ValueError(f"{name}: {attr} cannot be called as {attr}(prompts=..., completions=..., "
                             f"completion_ids=...{given}, **columns) (TRL's reward protocol): {exc}") from None
        return fn
    try:
        if check_kwargs:
            sig.bind(*REWARD_ARGS, **(kwargs or {}))
        else:
            sig.bind_partial(*REWARD_ARGS)
    except TypeError as exc:
        given = "".join(f", {k}=..." for k in kwargs or {})
        bare = sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                           return_annotation=sig.empty)
        raise ValueError(f"{name}: {attr}{bare} cannot be called as {attr}(prompts, replies, references{given}): "
                         f"{exc}") from None
    check = getattr(fn, "check_kwargs", None)  # a built-in's check of its keyword arguments' values
    if check is not None and check_kwargs:
        try:
            check(**(kwargs or {}))
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return fn


def resolves(kind: str, name) -> bool:
    """Whether ``name`` names a usable class (errors are left to the config's validation, which names them)."""
    try:
        (algorithm_class if kind == "algo" else task_class)(name)
    except ValueError:
        return False
    return True


def names_with(kind: str, **traits) -> list[str]:
    """Built-in names of ``kind`` (``algo`` or ``task``) whose class has these trait values (for messages)."""
    table, load = (ALGORITHMS, algorithm_class) if kind == "algo" else (TASKS, task_class)
    return [n for n in table if all(getattr(load(n), k) == v for k, v in traits.items())]
