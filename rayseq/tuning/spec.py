"""The experiment file of ``python -m rayseq.tune``: a base run config (``train:``) and a search (``search:``).

::

    train:                          # a run config: what `python -m rayseq.train --config` reads
      task: {name: counting}
      algo: {name: ppo_dynamic}
      rollout: {num_workers: 0}     # trials in-process (one CPU each); > 0: Ray rollout workers per trial
    search:
      param_space:                  # dotted run-config keys -> sampling primitives
        algo.lr: {loguniform: [1.0e-4, 3.0e-3]}
        algo.alpha2: {choice: [0.5, 1.0, 2.0]}
        algo.beta2: {same_as: algo.alpha2}         # tied: β2 = α2 in every trial (and after PBT mutations)
      metric: val/precision         # a val/* metric of the task (validation set; test/* is never selected on)
      mode: max
      num_samples: 8                # trials = num_samples × the product of the grid sizes
      max_concurrent_trials: 2
      scheduler: {name: asha, max_t: 150, grace_period: 25, reduction_factor: 2}
      storage_path: runs/tune       # or file:///abs/path, s3://bucket/prefix, gs://... (pyarrow.fs)
      name: counting_search         # default: the file's stem; results in <storage_path>/<name>/
      stop: {algo_iteration: 100}   # Tune stop criteria on reported keys
      seed: 0                       # seeds the search's sampling (trials' training seed is `seed`)

Primitives (Ray Tune's, same arguments; PyYAML reads ``1e-4`` as a string, so numbers are coerced):

=============  ========================  ==============================================
``uniform``    ``[lower, upper]``        ``tune.uniform``
``quniform``   ``[lower, upper, q]``     ``tune.quniform``
``loguniform`` ``[lower, upper]``        ``tune.loguniform`` (0 < lower)
``qloguniform````[lower, upper, q]``     ``tune.qloguniform``
``randint``    ``[lower, upper]``        ``tune.randint``: integers, upper *exclusive*
``qrandint``   ``[lower, upper, q]``     ``tune.qrandint``: upper inclusive
``lograndint`` ``[lower, upper]``        ``tune.lograndint``: upper exclusive
``randn``      ``[mean, sd]``            ``tune.randn``
``choice``     ``[v1, v2, ...]``         ``tune.choice`` (PBT mutations: shift left/right in the list)
``grid``       ``[v1, v2, ...]``         ``tune.grid_search``: every value, × num_samples
``same_as``    ``other.key``             not sampled: the value of another param_space key
=============  ========================  ==============================================

Schedulers: ``fifo`` (default); ``asha`` (``max_t``, ``grace_period``, ``reduction_factor``); ``pbt``
(``perturbation_interval``, ``hyperparam_mutations`` in the same primitive language, ``burn_in_period``,
``quantile_fraction``, ``resample_probability``, ``synch``). Their clock, ``time_attr``, is
``algo_iteration`` (iterations of the algorithm stage; 0 during MLE pretraining, so no trial is judged
on pretraining, which every trial shares) or ``iteration`` (all stages). Tune checkpoints are reported
every ``checkpoint_every`` ticks of that clock (PBT clones the checkpoint reported at a perturbation,
so it must divide ``perturbation_interval``) and at the end.

Every check happens here, before Ray starts: unknown keys, unknown primitives, param_space keys that
are not run-config keys or values the run config rejects (each primitive's bounds and every
choice/grid value are built into a :class:`~rayseq.config.RunConfig`), a metric the task does not
report, bad mode, scheduler settings. The message names the key.
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rayseq.config import (
    ConfigError,
    RunConfig,
    _format_validation_error,
    _known_keys,
    algorithm_sections,
    build_config,
    deep_merge,
    given_later,
    load_yaml,
    parse_overrides,
    set_path,
)
from rayseq.config.declared import builtin_sections


class SpecError(ValueError):
    """A bad experiment file or override; the message names the key."""


# primitive -> number of arguments (None: a non-empty list of values; "key": a param_space key)
PRIMITIVES: dict[str, int | str | None] = {
    "uniform": 2, "quniform": 3, "loguniform": 2, "qloguniform": 3, "randint": 2, "qrandint": 3,
    "lograndint": 2, "randn": 2, "choice": None, "grid": None, "same_as": "key",
}
# keys every trial sets itself: its run directory inside the experiment, its name, no progress bar
TRIAL_KEYS = ("run_dir", "name", "progress")
TUNE_KEYS = ("training_iteration", "time_total_s", "iteration", "algo_iteration")  # always reported
_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^[-+]?(inf|\.inf)$", re.IGNORECASE)


def val_metrics(cfg: RunConfig) -> list[str]:
    """The ``val/*`` metrics a run of this config reports while it trains (its task's ``metric_names``): the
    only metrics a search may select on."""
    from rayseq.tasks import metric_names

    return metric_names(cfg.task, "val")


# ------------------------------------------------------------------------------------ search dimensions


def _number(where: str, x: Any, integer: bool = False) -> float | int:
    if isinstance(x, str) and _FLOAT.match(x.strip()):
        x = float(x.strip().replace(".inf", "inf"))
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise SpecError(f"{where}: expected a number, got {x!r}")
    if integer:
        if float(x) != int(x):
            raise SpecError(f"{where}: expected an integer, got {x!r}")
        return int(x)
    return float(x)


def _value(x: Any) -> Any:
    """A choice/grid value, with YAML-1.1 strings such as ``1e-4`` read as numbers."""
    if isinstance(x, str) and _FLOAT.match(x.strip()) and any(c in x for c in "eE."):
        return float(x.strip().replace(".inf", "inf"))
    return x


@dataclass(frozen=True)
class Dim:
    """One search dimension: ``key`` (dotted run-config key), ``kind`` (a primitive), its ``args``."""

    key: str
    kind: str
    args: Any

    def probes(self) -> list:
        """Values that are built into a RunConfig to check the key and the range."""
        a = self.args
        if self.kind in ("choice", "grid"):
            return list(a)
        if self.kind in ("uniform", "loguniform", "quniform", "qloguniform"):
            return [a[0], a[1]]
        if self.kind in ("randint", "lograndint"):
            return [a[0], a[1] - 1]
        if self.kind == "qrandint":
            return [a[0], a[1]]
        if self.kind == "randn":
            return [a[0]]
        raise AssertionError(self.kind)

    def to_tune(self):
        from ray import tune

        a = self.args
        if self.kind == "grid":
            return tune.grid_search(list(a))
        if self.kind == "choice":
            return tune.choice(list(a))
        return getattr(tune, self.kind)(*a)

    def to_mutation(self):
        """PBT's form: a list for categorical values (perturbed by a shift along the list), else a Domain
        (resampled, or multiplied by 0.8 / 1.2)."""
        return list(self.args) if self.kind == "choice" else self.to_tune()

    def to_yaml(self) -> dict:
        return {self.kind: list(self.args) if isinstance(self.args, tuple | list) else self.args}


def parse_dim(where: str, key: str, spec: Any) -> Dim:
    """``{primitive: args}`` -> Dim; ``where`` (e.g. ``search.param_space``) prefixes error messages."""
    name = f"{where}.{key}"
    if not isinstance(spec, dict) or len(spec) != 1:
        raise SpecError(f"{name}: expected {{primitive: args}} with one of {', '.join(PRIMITIVES)}; got {spec!r}")
    kind, args = next(iter(spec.items()))
    if kind not in PRIMITIVES:
        raise SpecError(f"{name}: unknown primitive {kind!r}; use one of {', '.join(PRIMITIVES)}")
    arity = PRIMITIVES[kind]
    if arity == "key":
        if not isinstance(args, str) or not args:
            raise SpecError(f"{name}: same_as takes another param_space key, got {args!r}")
        return Dim(key, kind, args)
    if not isinstance(args, list | tuple) or not args:
        raise SpecError(f"{name}: {kind} takes a non-empty list, got {args!r}")
    if arity is None:
        return Dim(key, kind, tuple(_value(v) for v in args))
    if len(args) != arity:
        raise SpecError(f"{name}: {kind} takes {arity} numbers, got {list(args)!r}")
    integer = kind in ("randint", "qrandint", "lograndint")
    nums = tuple(_number(f"{name}.{kind}", v, integer) for v in args)
    if kind == "randn":
        if nums[1] <= 0:
            raise SpecError(f"{name}: randn's sd must be > 0, got {nums[1]}")
    elif nums[0] >= nums[1]:
        raise SpecError(f"{name}: {kind} needs lower < upper, got {list(nums)}")
    if kind in ("loguniform", "qloguniform", "lograndint") and nums[0] <= 0:
        raise SpecError(f"{name}: {kind} needs lower > 0, got {nums[0]}")
    if arity == 3 and nums[2] <= 0:
        raise SpecError(f"{name}: {kind} needs q > 0, got {nums[2]}")
    return Dim(key, kind, nums)


def flatten_space(where: str, space: Any, prefix: str = "") -> dict[str, Any]:
    """``{algo: {lr: {loguniform: ...}}}`` or ``{algo.lr: {loguniform: ...}}`` -> ``{"algo.lr": {...}}``
    (``None`` values are kept: an override ``search.param_space.algo.lr=null`` removes a key)."""
    if space is None:
        return {}
    if not isinstance(space, dict):
        raise SpecError(f"{where}: expected a mapping of run-config keys to primitives, got {space!r}")
    out: dict[str, Any] = {}
    for k, v in space.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and not (len(v) == 1 and next(iter(v)) in PRIMITIVES) and all(
            isinstance(x, dict) or x is None for x in v.values()
        ):
            out.update(flatten_space(where, v, prefix=f"{key}."))
        else:
            out[key] = v
    return out


def is_config_key(dotted: str, base: RunConfig | None = None) -> bool:
    """Whether ``dotted`` names a field of :class:`RunConfig` (e.g. ``algo.lr``; not a section). An ``algo.*`` or
    ``task.*`` key counts if some built-in algorithm (task) declares it, or the chosen one of ``base`` does (a
    plug-in's own key); whether the trials' algorithm reads it, building their configs says."""
    parts = dotted.split(".")
    if len(parts) == 2 and parts[0] in ("algo", "task"):
        chosen = type(getattr(base, parts[0])).model_fields if base is not None else {}
        return parts[1] in chosen or parts[1] in _known_keys((parts[0],))
    if len(parts) == 2 and parts[0] not in RunConfig.model_fields:  # an algorithm's own section (SeqGAN's disc)
        models = {sec: algorithm_sections(readers[0])[sec] for sec, readers in builtin_sections().items()}
        models.update(algorithm_sections(base.algo.name) if base is not None else {})
        return parts[0] in models and parts[1] in models[parts[0]].model_fields
    model: Any = RunConfig
    for i, p in enumerate(parts):
        fields = getattr(model, "model_fields", None)
        if not fields or p not in fields:
            return False
        ann = fields[p].annotation
        if i == len(parts) - 1:
            return not (isinstance(ann, type) and issubclass(ann, BaseModel))
        model = ann
    return False


# ------------------------------------------------------------------------------------------- settings


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FifoSpec(_Spec):
    name: Literal["fifo"] = "fifo"
    time_attr: Literal["algo_iteration", "iteration"] = Field(
        "algo_iteration", description="Clock of checkpoint_every (and of stop criteria you write with it).")


class AshaSpec(_Spec):
    """ASHA (Li et al. 2020): at rungs grace_period × reduction_factor^k of time_attr, a trial whose metric is
    below the 1/reduction_factor top of the trials recorded at that rung stops."""

    name: Literal["asha"]
    time_attr: Literal["algo_iteration", "iteration"] = "algo_iteration"
    max_t: int | None = Field(None, ge=1, description="Last rung bound; default: the run's length in time_attr.")
    grace_period: int | None = Field(
        None, ge=1, description="First rung; default train.eval_every (rungs then compare fresh evaluations).")
    reduction_factor: float = Field(2.0, gt=1.0)


class PbtSpec(_Spec):
    """PBT (Jaderberg et al. 2017): every perturbation_interval, a bottom-quantile trial restores a
    top-quantile trial's checkpoint and continues with mutated hyperparameters."""

    name: Literal["pbt"]
    time_attr: Literal["algo_iteration", "iteration"] = "algo_iteration"
    perturbation_interval: int = Field(..., ge=1)
    hyperparam_mutations: dict[str, Any] = Field(..., description="dotted keys -> primitives (not grid/same_as)")
    burn_in_period: int = Field(0, ge=0)
    quantile_fraction: float = Field(0.25, gt=0.0, le=0.5)
    resample_probability: float = Field(0.25, ge=0.0, le=1.0)
    synch: bool = Field(False, description="Perturb all trials together (needs them all running).")


class SearchSpec(_Spec):
    param_space: dict[str, Any] = Field(default_factory=dict)
    metric: str
    mode: Literal["max", "min"]
    num_samples: int = Field(1, ge=1)
    max_concurrent_trials: int | None = Field(None, ge=1, description="None: as many as the resources allow.")
    scheduler: FifoSpec | AshaSpec | PbtSpec = Field(default_factory=FifoSpec, discriminator="name")
    storage_path: str = Field("runs/tune", description="Local path or pyarrow.fs URI (file://, s3://, gs://).")
    name: str | None = Field(None, description="Experiment name; default: the experiment file's stem.")
    stop: dict[str, float] = Field(default_factory=dict, description="Tune stop criteria, e.g. {algo_iteration: 100}.")
    seed: int | None = Field(None, description="Seeds the search's sampling (and PBT's mutations).")
    checkpoint_every: int | None = Field(
        None, ge=0, description="Report a Tune checkpoint every this many time_attr ticks (and at the end); "
        "None: PBT's perturbation_interval, else train.eval_every (50 if that is 0); 0: only at the end.")
    keep_checkpoints: int | None = Field(
        None, ge=1, description="Tune checkpoints kept per trial; None: 2, and 4 with PBT (a clone may need an "
        "older one).")
    max_failures: int = Field(0, ge=-1, description="Restarts of a failed trial from its last checkpoint (-1: always).")

    @field_validator("scheduler", mode="before")
    @classmethod
    def _scheduler_name(cls, v):
        return {"name": v} if isinstance(v, str) else v

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v):
        if v is not None and (not v or "/" in v or v in (".", "..")):
            raise ValueError(f"a plain directory name, got {v!r}")
        return v


# ------------------------------------------------------------------------------------------ experiment


@dataclass
class Experiment:
    """A validated experiment: the base run config, the search and what derives from them."""

    train: dict  # the base run config's data (what build_config reads)
    search: SearchSpec
    dims: dict[str, Dim]  # sampled keys
    ties: dict[str, str]  # tied key -> the sampled key it copies
    mutations: dict[str, Dim] = field(default_factory=dict)  # PBT
    source: str | None = None  # the experiment file

    @cached_property
    def base(self) -> RunConfig:
        return build_config(self.train)

    @property
    def name(self) -> str:
        return self.search.name or (Path(self.source).stem if self.source else "tune")

    @property
    def path(self) -> str:
        """``<storage_path>/<name>``: absolute local path or URI."""
        sp = self.search.storage_path
        if "://" not in sp:
            sp = str(Path(sp).expanduser().absolute())
        return f"{sp.rstrip('/')}/{self.name}"

    @property
    def keep_checkpoints(self) -> int:
        if self.search.keep_checkpoints is not None:
            return self.search.keep_checkpoints
        return 4 if isinstance(self.search.scheduler, PbtSpec) else 2

    @property
    def time_attr(self) -> str:
        return self.search.scheduler.time_attr

    @property
    def checkpoint_every(self) -> int:
        s = self.search
        if s.checkpoint_every is not None:
            return s.checkpoint_every
        if isinstance(s.scheduler, PbtSpec):
            return s.scheduler.perturbation_interval
        return self.base.train.eval_every or 50

    def num_trials(self) -> int:
        n = self.search.num_samples
        for d in self.dims.values():
            if d.kind == "grid":
                n *= len(d.args)
        return n

    def trial_data(self, params: dict[str, Any], trial_id: str = "probe") -> dict:
        """Run-config data of one trial: base <- sampled ``params`` <- tied keys <- per-trial keys."""
        data = copy.deepcopy(self.train)
        for key, v in params.items():
            if key in self.dims or key in self.mutations:
                data = _set_later(data, key, v)
        for key, src in self.ties.items():
            if src in params:
                data = _set_later(data, key, params[src])
        data["run_dir"] = f"{self.path}/runs/{trial_id}"
        data["name"] = f"{self.name}-{trial_id}"
        data["progress"] = False
        return data

    def trial_config(self, params: dict[str, Any], trial_id: str = "probe") -> RunConfig:
        return build_config(self.trial_data(params, trial_id))

    def param_columns(self) -> list[str]:
        """Keys a trial's table row shows: sampled, mutated, then tied."""
        keys = list(self.dims) + [k for k in self.mutations if k not in self.dims]
        return keys + list(self.ties)

    def to_dict(self) -> dict:
        """The resolved experiment file (param_space flat), as written beside the results."""
        search = self.search.model_dump(mode="python")
        search["param_space"] = {k: d.to_yaml() for k, d in self.dims.items()} | {
            k: {"same_as": src} for k, src in self.ties.items()}
        if isinstance(self.search.scheduler, PbtSpec):
            search["scheduler"]["hyperparam_mutations"] = {k: d.to_yaml() for k, d in self.mutations.items()}
        search["name"] = self.name
        return {"train": copy.deepcopy(self.train), "search": search}


def experiment_key(key: str) -> str:
    """Where a command-line override goes in the experiment. ``search.*`` is the search's; anything else is a run
    key as ``python -m rayseq.train`` takes it (``train.iters``, ``algo.lr``, ``seed``), which goes under ``train:``,
    the run config. The experiment file's own spelling, ``train.`` and a run key (``train.algo.lr``,
    ``train.train.iters``), means the same. A key that is neither is a SpecError, with the search key it may be."""
    if key.startswith("search."):
        return key
    rest = key.removeprefix("train.")
    if key.startswith("train.") and (is_config_key(rest) or not is_config_key(key)):
        return key  # the file's spelling; or no reading is a run key, and the run config names the bad one
    sections = set(RunConfig.model_fields) | set(builtin_sections())
    if is_config_key(key) or key.split(".")[0] in sections:
        return "train." + key
    search = set(SearchSpec.model_fields)
    hint = f"; did you mean search.{key}?" if key.split(".")[0] in search else ""
    raise SpecError(f"override {key}: neither a run-config key (python -m rayseq.train --print-config lists them) "
                    f"nor a search key (search.num_samples, search.metric, ...){hint}")


def _set_later(data: dict, key: str, value: Any) -> dict:
    """A trial's value of ``key``; a top-level ``algo.K`` also beats the base file's ``algo.<name>.K``."""
    if key.startswith("algo.") and key.count(".") == 1:
        data = given_later(data, [key.split(".", 1)[1]])
    set_path(data, key, value)
    return data


def _merge(data: dict, over: dict) -> dict:
    """deep_merge, except that param_space and hyperparam_mutations merge per dotted key."""
    over = copy.deepcopy(over)
    s_over = over.get("search") if isinstance(over.get("search"), dict) else {}
    s_data = data.get("search") if isinstance(data.get("search"), dict) else {}
    out = deep_merge(data, over)
    if "param_space" in s_over:
        flat = flatten_space("search.param_space", s_data.get("param_space"))
        flat.update(flatten_space("search.param_space", s_over["param_space"]))
        out["search"]["param_space"] = {k: v for k, v in flat.items() if v is not None}
    sched_o, sched_d = s_over.get("scheduler"), s_data.get("scheduler")
    if isinstance(sched_o, dict) and "hyperparam_mutations" in sched_o:
        old = sched_d.get("hyperparam_mutations") if isinstance(sched_d, dict) else None
        flat = flatten_space("search.scheduler.hyperparam_mutations", old)
        flat.update(flatten_space("search.scheduler.hyperparam_mutations", sched_o["hyperparam_mutations"]))
        out["search"]["scheduler"]["hyperparam_mutations"] = {k: v for k, v in flat.items() if v is not None}
    return out


def load_experiment(path: str | Path | None, overrides: list[str] | None = None, data: dict | None = None
                    ) -> Experiment:
    """Read (``path``, or ``data``), apply ``key=value`` overrides (:func:`experiment_key`) and validate
    everything."""
    overrides = [experiment_key(item.partition("=")[0]) + "=" + item.partition("=")[2] if "=" in item else item
                 for item in overrides or []]
    try:
        if data is None:
            data = load_yaml(path)
        over = parse_overrides(overrides)
    except ConfigError as exc:
        raise SpecError(str(exc)) from None
    data = _merge(data, over)
    return validate(data, source=str(path) if path else None)


def validate(data: dict, source: str | None = None) -> Experiment:
    """Check an experiment's content (a file's, after overrides) and derive the search from it."""
    if "search" not in data and any(k in RunConfig.model_fields and k != "train" for k in data):
        raise SpecError(f"{source or 'the experiment'} is a run config (python -m rayseq.train --config reads it); "
                        "a Tune experiment file has a train: section (a run config) and a search: section, e.g. "
                        "tune_configs/counting_ppo_dynamic_search.yaml")
    unknown = [k for k in data if k not in ("train", "search")]
    if unknown:
        raise SpecError(f"{unknown[0]}: unknown section (an experiment file has train: and search:)")
    train, search = data.get("train"), data.get("search")
    if not isinstance(train, dict):
        raise SpecError("train: missing or not a mapping (the base run config, as for python -m rayseq.train)")
    if not isinstance(search, dict):
        raise SpecError("search: missing or not a mapping (param_space, metric, mode, ...)")
    try:
        base = build_config(train)
    except ConfigError as exc:
        raise SpecError(f"train: {exc}") from None
    try:
        spec = SearchSpec.model_validate(search)
    except ValidationError as err:
        msg = _format_validation_error(err).removeprefix("invalid config: ")
        raise SpecError("; ".join(f"search.{m}" for m in msg.split("; "))) from None

    flat = flatten_space("search.param_space", spec.param_space)
    dims, ties = {}, {}
    for key, v in flat.items():
        _check_key("search.param_space", key, base)
        d = parse_dim("search.param_space", key, v)
        if d.kind == "same_as":
            ties[key] = d.args
        else:
            dims[key] = d
    for key, src in ties.items():
        if src not in dims:
            raise SpecError(f"search.param_space.{key}: same_as {src!r} must name a sampled param_space key "
                            f"(sampled: {', '.join(dims) or 'none'})")
    mutations = {}
    if isinstance(spec.scheduler, PbtSpec):
        where = "search.scheduler.hyperparam_mutations"
        mflat = flatten_space(where, spec.scheduler.hyperparam_mutations)
        if not mflat:
            raise SpecError(f"{where}: PBT needs at least one key to mutate")
        for key, v in mflat.items():
            _check_key(where, key, base)
            d = parse_dim(where, key, v)
            if d.kind in ("grid", "same_as"):
                raise SpecError(f"{where}.{key}: {d.kind} cannot be a mutation (use choice or a distribution)")
            if key in ties:
                raise SpecError(f"{where}.{key}: tied to {ties[key]} (same_as); mutate {ties[key]} instead")
            mutations[key] = d
    exp = Experiment(train=copy.deepcopy(train), search=spec, dims=dims, ties=ties, mutations=mutations, source=source)
    probes = _probe(exp)
    _check_metric_and_scheduler(exp, base, probes)
    return exp


def _check_key(where: str, key: str, base: RunConfig) -> None:
    if key in TRIAL_KEYS:
        raise SpecError(f"{where}.{key}: set per trial by rayseq.tune (runs/<trial_id> in the experiment)")
    if not is_config_key(key, base):
        raise SpecError(f"{where}.{key}: not a run-config key (see python -m rayseq.train --print-config)")


def _probe(exp: Experiment) -> list[RunConfig]:
    """Build RunConfigs with each dimension's bounds / values, then jointly; returns the joint ones."""
    every = {**exp.dims, **exp.mutations}
    for where, dims in (("search.param_space", exp.dims),
                        ("search.scheduler.hyperparam_mutations", exp.mutations)):
        for key, d in dims.items():
            for v in d.probes():
                try:
                    exp.trial_config({key: v})
                except ConfigError as exc:
                    raise SpecError(f"{where}.{key}: {v!r} is not a valid value: {exc}") from None
    grids = [(k, d.args) for k, d in exp.dims.items() if d.kind == "grid"]
    first = {k: d.probes()[0] for k, d in every.items()}
    combos = itertools.islice(itertools.product(*[vals for _, vals in grids]), 512)
    out = []
    for combo in combos:
        params = first | dict(zip([k for k, _ in grids], combo))
        try:
            out.append(exp.trial_config(params))
        except ConfigError as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
            raise SpecError(f"search.param_space: the trial {shown} is not a valid run config: {exc}") from None
    return out


def _check_metric_and_scheduler(exp: Experiment, base: RunConfig, probes: list[RunConfig]) -> None:
    s = exp.search
    tasks = {c.task.name: c for c in [base, *probes]}
    for name, c in tasks.items():
        allowed = val_metrics(c)
        if s.metric not in allowed:
            why = ("test/* is computed once at the end and reported, never selected on; select on the validation "
                   "set's" if s.metric.startswith(("test/", "eval/")) else "use one of")
            raise SpecError(f"search.metric: {s.metric!r} is not a validation metric of the {name} task; {why} "
                            f"{', '.join(allowed)}")
    stop_ok = set(TUNE_KEYS) | set(val_metrics(base))
    for k in s.stop:
        if k not in stop_ok:
            raise SpecError(f"search.stop.{k}: not a reported key; use one of {', '.join(sorted(stop_ok))}")
    sched = s.scheduler
    if sched.time_attr == "algo_iteration" and base.train.iters == 0 and sched.name != "fifo":
        raise SpecError("search.scheduler.time_attr: algo_iteration counts algorithm iterations, and "
                        "train.train.iters=0; use time_attr: iteration")
    length = base.train_stage_iters if sched.time_attr == "algo_iteration" else (
        base.train.pretrain_iters + base.algorithm.pretrain_steps(base) + base.train_stage_iters)
    if isinstance(sched, AshaSpec):
        if sched.max_t is None:
            sched.max_t = max(length, 1)
        if sched.grace_period is None:
            sched.grace_period = max(1, min(base.train.eval_every or sched.max_t // 4, sched.max_t))
        if sched.grace_period > sched.max_t:
            raise SpecError(f"search.scheduler.grace_period={sched.grace_period} > max_t={sched.max_t}")
    if isinstance(sched, PbtSpec):
        every = exp.checkpoint_every
        if every == 0 or sched.perturbation_interval % every:
            raise SpecError(f"search.checkpoint_every={every} must divide search.scheduler.perturbation_interval="
                            f"{sched.perturbation_interval}: PBT clones the checkpoint reported at a perturbation")
        if sched.perturbation_interval > length:
            raise SpecError(f"search.scheduler.perturbation_interval={sched.perturbation_interval} is longer than "
                            f"the run ({length} {sched.time_attr}): no trial would ever be perturbed")
    if s.max_concurrent_trials is not None and s.max_concurrent_trials > exp.num_trials():
        s.max_concurrent_trials = exp.num_trials()


def dump(exp: Experiment) -> str:
    """The resolved experiment file (written as ``experiment.yaml`` beside the results)."""
    return yaml.safe_dump(exp.to_dict(), sort_keys=False)
