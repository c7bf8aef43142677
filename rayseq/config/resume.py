"""Resuming a run: its saved config, what a resume may change (:data:`RESUMABLE`) and what it may not."""

from __future__ import annotations

from typing import Any

from rayseq.config.base import ConfigError
from rayseq.config.overrides import deep_merge, parse_overrides
from rayseq.config.paths import absolute_paths
from rayseq.config.schema import RunConfig, build_config, config_to_dict

# What a resumed run (`python -m rayseq.train run_dir=DIR --resume KEY=VALUE ...`) may change: what its checkpoint
# does not fix, and the keys of the algorithm's own sections that their Section class lists as ``resumable`` (SeqGAN's
# disc.lr). Everything else — task.*, model.*, algo.name and the algorithm's hyperparameters, seed, batch sizes,
# rollout.temperature, the algorithm's own sections — is what the checkpoint was trained with, and a change is
# refused.
RESUMABLE = {
    "reporting": ("name", "run_dir", "progress", "progress_every", "train.eval_every", "train.pretrain_eval_every",
                  "train.checkpoint_every", "train.keep_checkpoints"),
    "length": ("train.iters", "train.pretrain_iters"),  # train.pretrain_iters only while the run is still in MLE
    # re-applied to the optimizers after loading (Learner.apply_config_lrs), as Tune's PBT does
    "learning rates": ("train.pretrain_lr", "algo.lr", "algo.baseline_lr", "algo.critic_lr"),
    # the in-process and the Ray paths run the same code
    "resources": ("rollout.num_workers", "rollout.num_cpus_per_worker", "rollout.num_gpus_per_worker",
                  "rollout.torch_threads", "rollout.max_restarts", "scorer.num_scorers", "scorer.num_cpus_per_scorer",
                  "scorer.num_gpus_per_scorer", "scorer.torch_threads", "scorer.batch_size", "learner.num_cpus",
                  "learner.num_gpus", "learner.device", "learner.torch_threads", "learner.num_learners",
                  "learner.max_restarts", "learner.micro_batch_size", "learner.cpu_offload",
                  "learner.activation_checkpointing", "rollout.placement_strategy",
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
    # paths compared as the run keeps them (absolute): models/my-gpt2 given again is the saved /home/.../models/my-gpt2
    before, after = absolute_paths(before), absolute_paths(after)
    old, new = _flat(config_to_dict(before)), _flat(config_to_dict(after))
    keys = [*old, *(k for k in new if k not in old)]
    changed = [(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]
    allowed = {k for group in RESUMABLE.values() for k in group}
    allowed |= {f"{sec}.{k}" for sec, model in after.algorithm.sections.items() for k in model.resumable}
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
