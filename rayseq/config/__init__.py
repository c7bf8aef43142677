"""Typed, validated run configuration (``from rayseq.config import build_config, RunConfig, ...``), split by concern:

- :mod:`rayseq.config.schema`: the run-level sections (model, rollout, scorer, learner, train, reward, and the
  run's own keys: seed, run_dir, ...; an algorithm may declare sections of its own, as SeqGAN's ``disc:``),
  :class:`RunConfig`, :func:`build_config`, :func:`config_to_dict`;
- :mod:`rayseq.config.declared`: the ``algo:`` and ``task:`` sections, a small common base extended by the keys the
  chosen algorithm or task class declares beside its code (its ``fields``), and the refusal of keys that do not
  apply (:func:`check_applicable`);
- :mod:`rayseq.config.overrides`: the command line's side: ``key=value`` overrides, experiment files,
  ``--print-config``'s listing with every key's description;
- :mod:`rayseq.config.resume`: what ``--resume`` may change (:data:`RESUMABLE`) and :func:`resume_config`;
- :mod:`rayseq.config.base`: :class:`ConfigError` and the helpers they share.
"""

from rayseq.config.base import ConfigError, blame, did_you_mean, rename_aliases
from rayseq.config.declared import (
    TASK_ALIASES,
    AlgoConfig,
    TaskConfig,
    algorithm_config_model,
    algorithm_sections,
    check_applicable,
    check_pipeline,
    declared_algo_keys,
    declared_task_keys,
    given_later,
    resolve_algo_section,
    resolve_task_section,
    task_config_model,
)
from rayseq.config.overrides import deep_merge, described_yaml, load_yaml, parse_overrides, set_path
from rayseq.config.resume import RESUMABLE, _refuse_on_resume, resume_config
from rayseq.config.schema import (
    ALGOS,
    TASKS,
    LearnerConfig,
    ModelConfig,
    RewardConfig,
    RewardTerm,
    RolloutConfig,
    RunConfig,
    ScorerConfig,
    TrainConfig,
    _custom_resources,
    _format_validation_error,
    _installed,
    _known_keys,
    build_config,
    config_to_dict,
)

__all__ = [
    "ALGOS", "RESUMABLE", "TASKS", "TASK_ALIASES", "AlgoConfig", "ConfigError", "LearnerConfig", "ModelConfig",
    "RewardConfig", "RewardTerm", "RolloutConfig", "RunConfig", "ScorerConfig", "TaskConfig", "TrainConfig",
    "_custom_resources", "_format_validation_error", "_installed", "_known_keys", "_refuse_on_resume",
    "algorithm_config_model", "algorithm_sections", "blame", "build_config", "check_applicable", "check_pipeline",
    "config_to_dict", "declared_algo_keys", "declared_task_keys", "deep_merge", "described_yaml", "did_you_mean",
    "given_later", "load_yaml", "parse_overrides", "rename_aliases", "resolve_algo_section", "resolve_task_section",
    "resume_config", "set_path", "task_config_model",
]
