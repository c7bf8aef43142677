"""The ``algo:`` and ``task:`` sections: keys that algorithm and task classes declare beside their code.

A section is a small common base (:class:`AlgoConfig`: ``name``, ``lr``, ``max_grad_norm``, which every algorithm
reads; :class:`TaskConfig`: ``name``) extended by the chosen class's own keys: an algorithm's ``config_fields()``
(its ``fields``, plus the KL and entropy keys of rayseq/algos/regularizers.py when it is ``regularized``), a task's
``fields``; each ``key -> (type, pydantic Field)``. So adding an algorithm or a task (built-in or an import-path
plug-in) never edits rayseq.config, and its keys are validated, documented (``--print-config``) and refused where
they do not apply (:func:`check_applicable`) like every other key.
"""

from __future__ import annotations

import functools

from pydantic import Field, create_model, field_validator

from rayseq import registry
from rayseq.config.base import ConfigError, Section, did_you_mean, rename_aliases

# old names of keys, still read: task.data_dir is task.data
TASK_ALIASES = {"data_dir": "data"}


class AlgoConfig(Section):
    """The algorithm stage: the keys every algorithm reads; the chosen algorithm adds its own (its class's
    ``fields``). Keys an algorithm does not read are refused when given (:func:`check_applicable`); an experiment
    file shared by several algorithms puts such keys under the algorithm's name, e.g.
    ``algo: {name: ppo, scheduled_sampling: {ss_k: 30}}`` (used only when algo.name=scheduled_sampling)."""

    name: str = Field(
        "ppo_dynamic", description="Algorithm of the RL stage (after MLE pretraining): a built-in name "
        "(rayseq.registry) or your own class as an import path package.module:Class.",
    )
    lr: float = Field(3e-4, gt=0, description="Generator learning rate (Adam) in the algorithm stage.")
    max_grad_norm: float | None = Field(5.0, gt=0, description="Gradient-norm clip; None disables it.")

    @field_validator("name")
    @classmethod
    def _known_algorithm(cls, v: str) -> str:
        registry.algorithm_class(v)  # ValueError naming what is wrong
        return v


class TaskConfig(Section):
    """The task: ``name``; the chosen task adds its own keys (its class's ``fields``)."""

    name: str = Field(
        "counting", description="Task: data + reward + evaluation; a built-in name (counting, oracle, pairs, chitchat) "
        "or your own class as an import path package.module:Class.",
    )

    @field_validator("name")
    @classmethod
    def _known_task(cls, v: str) -> str:
        registry.task_class(v)  # ValueError naming what is wrong
        return v


def _declared(section: str, cls) -> dict:
    """The keys class ``cls`` declares for ``section`` (``algo``, ``task``), after checks of the declaration."""
    label = f"{section}.name={getattr(cls, '__module__', '?')}:{cls.__name__}"
    if getattr(cls, "params", None):  # classes written before keys were declared per algorithm: names config.py knew
        raise ValueError(f"{label}: `params` {tuple(cls.params)} is no longer read; a class declares its keys in "
                         "`fields` (key -> (type, pydantic Field)); spread a parent's or a group's, e.g. "
                         "fields = {**Reinforce.fields, ...} (see rayseq/algos/common.py, rayseq/tasks/base.py)")
    fields = cls.config_fields() if section == "algo" else cls.fields
    if not registry.is_import_path(_registry_name(section, cls)):
        return fields
    # a plug-in that subclasses a built-in class runs its code, which reads the built-in's keys
    table = registry.ALGORITHMS if section == "algo" else registry.TASKS
    for parent in cls.__mro__[1:]:
        if f"{parent.__module__}:{parent.__name__}" in table.values():
            dropped = [k for k in parent.fields if k not in cls.fields]
            if dropped:
                raise ValueError(f"{label}: its fields leave out {', '.join(dropped)}, which the code it inherits "
                                 f"from {parent.__name__} reads; declare fields = {{**{parent.__name__}.fields, ...}}")
            break
    return fields


def _registry_name(section: str, cls) -> str:
    """The built-in name of ``cls`` if it is one, else its import path."""
    path = f"{cls.__module__}:{cls.__name__}"
    table = registry.ALGORITHMS if section == "algo" else registry.TASKS
    return next((name for name, p in table.items() if p == path), path)


def _with_fields(base: type, section: str, name: str, lookup) -> type:
    """``base`` (AlgoConfig, TaskConfig) extended by the keys class ``name`` declares (its ``fields``), so adding an
    algorithm or a task never edits rayseq.config."""
    try:
        cls = lookup(name)
    except ValueError:  # an unknown name: the section's own validation says so
        return base
    fields = _declared(section, cls)
    if not fields:
        return base
    clash = sorted(set(fields) & set(base.model_fields))
    if clash:
        raise ValueError(f"{section}.name={name}: its fields {clash} are {base.__name__} keys already; use them, or "
                         "other names")
    return create_model(f"{base.__name__}_{name.replace('.', '_').replace(':', '_')}", __base__=base, **fields)


@functools.cache
def algorithm_config_model(name: str) -> type[AlgoConfig]:
    """AlgoConfig with algorithm ``name``'s own keys (e.g. PPO's ``eps``, GRPO's ``group_size``)."""
    return _with_fields(AlgoConfig, "algo", name, registry.algorithm_class)


@functools.cache
def task_config_model(name: str) -> type[TaskConfig]:
    """TaskConfig with task ``name``'s own ``task.*`` keys (counting's ``min_len``, pairs' ``data``)."""
    return _with_fields(TaskConfig, "task", name, registry.task_class)


def algorithm_sections(name: str) -> dict:
    """The config sections algorithm ``name`` declares of its own (``Algorithm.sections``: section name -> Section
    class, e.g. SeqGAN's ``disc``); {} for a name that does not resolve (its validation says why)."""
    return dict(registry.algorithm_class(name).sections) if registry.resolves("algo", name) else {}


@functools.cache
def builtin_sections() -> dict[str, tuple[str, ...]]:
    """Section name -> the built-in algorithms that declare it (``disc`` -> the SeqGAN family)."""
    out: dict[str, list[str]] = {}
    for n in registry.ALGORITHMS:
        for sec in registry.algorithm_class(n).sections:
            out.setdefault(sec, []).append(n)
    return {k: tuple(v) for k, v in out.items()}


def declared_algo_keys(name: str) -> tuple[str, ...]:
    """The ``algo.*`` keys algorithm ``name`` reads: the common ones and what its class declares."""
    return tuple(algorithm_config_model(name).model_fields)  # the base's first, in the order declared


def declared_task_keys(name: str) -> tuple[str, ...]:
    """The ``task.*`` keys task ``name`` reads: ``name`` and what its class declares."""
    return tuple(task_config_model(name).model_fields)


@functools.cache
def builtin_algo_keys() -> frozenset[str]:
    """Keys some built-in algorithm reads (so ``algo.group_size`` with ``ppo`` is "not read by ppo", not
    "unknown")."""
    return frozenset(k for n in registry.ALGORITHMS for k in declared_algo_keys(n))


@functools.cache
def builtin_task_keys() -> frozenset[str]:
    """Keys some built-in task reads (``task.min_len`` with ``oracle`` is "not read by oracle"). Imports every
    built-in task (pairs: pyarrow), so it is asked only about a key the chosen task does not read."""
    return frozenset(k for n in registry.TASKS for k in declared_task_keys(n))


def _section_key(key: str) -> bool:
    """An ``algo.<algorithm>:`` sub-section (a built-in name or an import path; no algo key is either)."""
    return key in registry.ALGORITHMS or registry.is_import_path(key)


def given_later(data: dict, algo_keys) -> dict:
    """``data`` (an experiment file's) whose ``algo.<name>:`` sub-sections no longer set the top-level ``algo``
    keys ``algo_keys`` given later (a command-line override, a Tune trial's value): the later word wins over the
    file's per-algorithm value, which within the file is the more specific one. Sub-section keys themselves
    (``algo.grpo.kl_coef=...``) are not top-level keys and change nothing here."""
    algo = data.get("algo")
    keys = {k for k in algo_keys if not _section_key(k)}
    if not isinstance(algo, dict) or not keys:
        return data
    return {**data, "algo": {k: ({kk: vv for kk, vv in v.items() if kk not in keys}
                                 if _section_key(k) and isinstance(v, dict) else v) for k, v in algo.items()}}


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
    given = rename_aliases(task, TASK_ALIASES, "task")  # both names given: a ValueError naming them
    name = given.get("name", TaskConfig.model_fields["name"].default)
    if not registry.resolves("task", name):
        return given
    return {**registry.task_class(name).defaults, **given}


def check_pipeline(algo, name: str, max_staleness: int = 1) -> None:
    """``rollout.max_staleness`` ≥ 1 trains on rollouts up to that many updates old: only algorithms that correct for
    it with the behaviour log-probs (``off_policy_ratio``), rewarded by the task and without state between batches."""
    why = None
    if not algo.off_policy_ratio:
        why = ("its update has no importance ratio π_θ / π_behaviour to correct rollouts sampled with older "
               "weights")
    elif algo.own_reward:
        why = "its rewards come from a model it trains between the batches"
    elif algo.stateful_request or algo.validate_every:
        why = "its rollout requests depend on the learner's state at sampling time"
    if why:
        raise ValueError(f"rollout.max_staleness={max_staleness}: algo.name={name} cannot train on rollouts sampled "
                         f"with older weights ({why}); use one of "
                         f"{', '.join(registry.names_with('algo', off_policy_ratio=True, own_reward=False))} "
                         "or rollout.max_staleness=0 (and rollout.pipeline=false)")


def _declaration_error(section: str, name: str) -> None:
    """A ConfigError if the class ``name`` declares its keys wrongly (``params``, a plug-in dropping inherited keys)."""
    try:
        (algorithm_config_model if section == "algo" else task_config_model)(name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_applicable(data: dict) -> None:
    """An explicitly given key that the chosen algorithm or task does not read is an error naming the key and
    the algorithm (task); defaults are fine. ``data``: the config as given (before defaults are filled in)."""
    algo = data.get("algo") if isinstance(data.get("algo"), dict) else {}
    name = algo.get("name", AlgoConfig.model_fields["name"].default)
    if registry.resolves("algo", name):
        for sub_name, section in [(name, algo), *((k, v) for k, v in algo.items() if _section_key(k))]:
            if not isinstance(section, dict):
                raise ConfigError(f"algo.{sub_name}: expected a mapping of the keys {sub_name} reads, got {section!r}")
            _declaration_error("algo", sub_name)
            reads = declared_algo_keys(sub_name)
            where = "algo" if section is algo else f"algo.{sub_name}"
            for key in section:
                if key in reads or _section_key(key):
                    continue
                if key not in builtin_algo_keys():
                    if section is algo:
                        continue  # the section's validation names it, with the closest key
                    raise ConfigError(f"{where}.{key}: unknown key{did_you_mean(key, reads, where)}")
                hint = (" (a key for several algorithms of one experiment file goes under algo.<algorithm>:)"
                        if section is algo else "")
                raise ConfigError(f"{where}.{key}: algo.name={sub_name} does not read this key; {sub_name} reads "
                                  f"{', '.join(reads)}{hint}")
        own = registry.algorithm_class(name).sections
        for sec, readers in builtin_sections().items():
            given = data.get(sec)
            if given and sec not in own:
                first = next(iter(given)) if isinstance(given, dict) else ""
                raise ConfigError(f"{sec}.{first}: algo.name={name} does not read the {sec}: section (its keys are "
                                  f"read by {', '.join(readers)})")
    task = data.get("task") if isinstance(data.get("task"), dict) else {}
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    # env.name makes the task the episodes' (task.name=env, derived later): its keys (task.vocabulary) apply
    tname = task.get("name", "env" if env.get("name") else TaskConfig.model_fields["name"].default)
    if registry.resolves("task", tname):
        _declaration_error("task", tname)
        reads = declared_task_keys(tname)
        for given in task:
            key = TASK_ALIASES.get(given, given)
            if key in reads or key not in builtin_task_keys():
                continue  # an unknown key: the section's validation names it, with the closest key
            raise ConfigError(f"task.{given}: task.name={tname} does not read this key; {tname} reads "
                              f"{', '.join(reads)}")
        reward = data.get("reward") if isinstance(data.get("reward"), dict) else {}
        if reward and not registry.task_class(tname).has_reward:
            raise ConfigError(f"reward.{next(iter(reward))}: task.name={tname} has no reward (its sequences are scored "
                              "by a discriminator); reward.* applies to tasks with one: "
                              f"{', '.join(registry.names_with('task', has_reward=True))}")
        if reward and registry.resolves("algo", name) and registry.algorithm_class(name).own_reward:
            raise ConfigError(f"reward.{next(iter(reward))}: algo.name={name} learns from a reward model of its own "
                              "(SeqGAN's discriminator), not from reward.*")
