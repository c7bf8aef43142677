"""Typed, validated run configuration (``from rayseq.config import build_config, RunConfig, ...``).

Split by concern:

- :mod:`rayseq.config.schema`: the run-level sections (task, model, rollout, scorer, learner, disc, train, reward)
  and :class:`RunConfig`, :func:`build_config`, :func:`config_to_dict`.
"""

from rayseq.config.schema import (
    ALGOS,
    REGULARIZER_KEYS,
    RESUMABLE,
    TASK_ALIASES,
    TASKS,
    AlgoConfig,
    ConfigError,
    DiscConfig,
    LearnerConfig,
    ModelConfig,
    RewardConfig,
    RewardTerm,
    RolloutConfig,
    RunConfig,
    ScorerConfig,
    TaskConfig,
    TrainConfig,
    _custom_resources,
    _format_validation_error,
    _installed,
    _known_keys,
    _refuse_on_resume,
    algorithm_config_model,
    build_config,
    check_applicable,
    check_pipeline,
    config_to_dict,
    declared_algo_keys,
    deep_merge,
    did_you_mean,
    load_yaml,
    parse_overrides,
    rename_aliases,
    resolve_algo_section,
    resolve_task_section,
    resume_config,
    set_path,
    task_config_model,
)

__all__ = [
    "ALGOS", "REGULARIZER_KEYS", "RESUMABLE", "TASKS", "TASK_ALIASES", "AlgoConfig", "ConfigError", "DiscConfig",
    "LearnerConfig", "ModelConfig", "RewardConfig", "RewardTerm", "RolloutConfig", "RunConfig", "ScorerConfig",
    "TaskConfig", "TrainConfig", "_custom_resources", "_format_validation_error", "_installed", "_known_keys",
    "_refuse_on_resume", "algorithm_config_model", "build_config", "check_applicable", "check_pipeline",
    "config_to_dict", "declared_algo_keys", "deep_merge", "did_you_mean", "load_yaml", "parse_overrides",
    "rename_aliases", "resolve_algo_section", "resolve_task_section", "resume_config", "set_path",
    "task_config_model",
]
