"""Typed, validated configuration: defaults, ``key=value`` overrides parsed as YAML
scalars, and errors that name the offending key or file."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from rayseq.config import (
    ALGOS,
    TASKS,
    ConfigError,
    RunConfig,
    algorithm_config_model,
    build_config,
    config_to_dict,
    load_yaml,
    task_config_model,
)
from rayseq.registry import algorithm_class


def test_defaults():
    cfg = build_config()
    assert isinstance(cfg, RunConfig)
    assert cfg == build_config({}, [])
    # the paper's settings (Tuan et al. Sec. 5.1, Supp. C) and the documented default run
    assert cfg.task.name == "counting"
    assert (cfg.task.min_len, cfg.task.max_len) == (1, 10)
    assert cfg.task.test_size == 2000 and cfg.task.test_seed == 2018
    assert cfg.algo.name == "ppo_dynamic" and cfg.algo.name in ALGOS
    assert build_config(None, ["algo.name=ppo"]).algo.eps == 0.2
    assert "eps" not in type(cfg.algo).model_fields  # PPO-dynamic's clip bounds are its own (Eq. 4)
    assert math.isinf(cfg.algo.alpha1) and math.isinf(cfg.algo.beta1)
    assert cfg.algo.alpha2 == 1.0 and cfg.algo.beta2 == 1.0
    assert cfg.algo.gamma == 1.0
    assert cfg.model.hidden_dim == 128
    assert cfg.seed == 0 and cfg.name is None and cfg.run_dir is None
    # every leaf field is documented; the sections document themselves by their fields
    sections = [cfg, cfg.task, cfg.model, cfg.algo, cfg.rollout, cfg.scorer, cfg.learner, cfg.train]
    # and every key an algorithm or a task declares beside its code, and the algorithms' own sections (disc:)
    sections += [algorithm_config_model(n)() for n in ALGOS] + [task_config_model(n)() for n in TASKS]
    sections += [model() for n in ALGOS for model in algorithm_class(n).sections.values()]
    for section in sections:
        for name, field in type(section).model_fields.items():
            if isinstance(getattr(section, name), BaseModel):
                continue
            assert field.description, f"{type(section).__name__}.{name} has no description"


def test_overrides_parse_scalars():
    cfg = build_config(
        overrides=[
            "seed=3",
            "algo.name=ppo_dynamic",
            "algo.lr=1e-3",  # PyYAML reads '1e-3' as a string; the float field still accepts it
            "algo.alpha1=inf",
            "algo.beta1=.inf",
            "algo.alpha2=+inf",
            "algo.normalize_advantages=true",
            "progress=false",
            "algo.max_grad_norm=null",
            "algo.minibatch_size=~",
            "name=run-a",
            "rollout.num_gpus_per_worker=0.25",
        ]
    )
    assert cfg.seed == 3 and isinstance(cfg.seed, int)
    assert cfg.algo.lr == pytest.approx(1e-3)
    assert cfg.algo.alpha1 == math.inf and cfg.algo.beta1 == math.inf and cfg.algo.alpha2 == math.inf
    assert cfg.algo.normalize_advantages is True and cfg.progress is False
    assert cfg.algo.max_grad_norm is None and cfg.algo.minibatch_size is None
    assert cfg.name == "run-a"
    assert cfg.rollout.num_gpus_per_worker == 0.25


def test_empty_override_value_is_none():
    assert build_config(overrides=["algo.max_grad_norm="]).algo.max_grad_norm is None


def test_override_python_none_spelling():
    # `None` (Python) is read like YAML null; the help text of max_grad_norm says "None disables it"
    cfg = build_config(overrides=["algo.max_grad_norm=None", "name=None"])
    assert cfg.algo.max_grad_norm is None and cfg.name is None


def test_overrides_beat_data_and_data_beats_defaults():
    data = {"algo": {"eps": 0.3, "name": "ppo"}, "seed": 5}
    cfg = build_config(data, ["algo.eps=0.1"])
    assert cfg.algo.eps == 0.1 and cfg.algo.name == "ppo" and cfg.seed == 5
    assert build_config(data).algo.eps == 0.3
    assert data == {"algo": {"eps": 0.3, "name": "ppo"}, "seed": 5}  # input not mutated


def test_unknown_key_names_the_key():
    with pytest.raises(ConfigError, match=r"algo\.epsx: unknown key"):
        build_config(overrides=["algo.epsx=0.1"])
    with pytest.raises(ConfigError, match=r"algos: unknown key"):
        build_config({"algos": {"eps": 0.1}})


@pytest.mark.parametrize(("overrides", "message"), [
    (["algo.epsx=0.1"], "invalid config: algo.epsx: unknown key (did you mean algo.eps?)"),
    (["model.hiden_dim=8"], "invalid config: model.hiden_dim: unknown key (did you mean model.hidden_dim?)"),
    (["trian.iters=3"], "invalid config: trian: unknown key (did you mean train?)"),
    (["algo.grop_size=4", "algo.name=grpo"],
     "invalid config: algo.grop_size: unknown key (did you mean algo.group_size?)"),
    (["algo.name=ppo", "algo.raml.raml_taux=1"], "algo.raml.raml_taux: unknown key (did you mean algo.raml.raml_tau?)"),
    (["algo.zzzz=1"], "invalid config: algo.zzzz: unknown key"),  # nothing close: no guess
])
def test_an_unknown_key_suggests_the_closest_known_one(overrides, message):
    with pytest.raises(ConfigError) as info:
        build_config(overrides=overrides)
    assert str(info.value) == message


@pytest.mark.parametrize(("overrides", "key"), [
    (["algo.name=ppo", "algo.eps=2"], "algo.eps"),  # a clip range lies in (0, 1): Tuan Eq. 3
    (["algo.name=ppo", "algo.eps=1"], "algo.eps"),
    (["algo.name=grpo", "algo.eps=1.5"], "algo.eps"),
    (["task.name=pairs", "algo.name=erpo_interpolation", "algo.interp_lambdas=[0.5, 0.5, 0.5]"],
     "algo.interp_lambdas"),  # ERPO Alg. 1: probabilities of the three sources
    (["task.name=pairs", "algo.name=erpo_interpolation", "algo.interp_lambdas=[1.2, -0.2, 0.0]"],
     "algo.interp_lambdas"),
])
def test_ranges_the_papers_imply_are_checked(overrides, key):
    with pytest.raises(ConfigError) as info:
        build_config(overrides=overrides)
    assert f"{key}:" in str(info.value) and len(str(info.value).splitlines()) == 1
    build_config(overrides=["algo.name=ppo", "algo.eps=0.99"])


@pytest.mark.parametrize(
    "override, key",
    [
        ("algo.eps=x", "algo.eps"),
        ("algo.eps=-0.1", "algo.eps"),
        ("algo.epochs=3.5", "algo.epochs"),
        ("algo.name=ppo2", "algo.name"),
        ("task.test_size=5", "task.test_size"),
        ("algo.beta1=-inf", "algo.beta1"),
        ("rollout.num_workers=-1", "rollout.num_workers"),
        ("seed=abc", "seed"),
    ],
)
def test_bad_value_names_the_key(override, key):
    with pytest.raises(ConfigError) as info:
        build_config(overrides=[override])
    assert f"{key}:" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("override", ["seed", "algo.eps", "=3", "algo..eps=1", ".eps=1"])
def test_malformed_override_rejected(override):
    with pytest.raises(ConfigError, match="override"):
        build_config(overrides=[override])


def test_min_len_above_max_len_rejected():
    with pytest.raises(ConfigError, match=r"task\.min_len=7 > task\.max_len=3"):
        build_config(overrides=["task.min_len=7", "task.max_len=3"])
    cfg = build_config(overrides=["task.min_len=4", "task.max_len=4"])
    assert cfg.task.min_len == cfg.task.max_len == 4


def test_validation_on_assignment():
    cfg = build_config()
    with pytest.raises(ValueError):
        cfg.algo.eps = -1.0


def test_load_yaml_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="not found") as info:
        load_yaml(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("text, what", [("- 1\n- 2\n", "list"), ("just a string\n", "str")])
def test_load_yaml_non_mapping(tmp_path, text, what):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="must be a mapping") as info:
        load_yaml(path)
    assert str(path) in str(info.value) and what in str(info.value)


def test_load_yaml_invalid_and_empty(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("algo: {eps: [\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_yaml(bad)
    assert str(bad) in str(info.value)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# only a header\n")
    assert load_yaml(empty) == {}


def test_load_yaml_base_overlay_merges_section_by_section(tmp_path):
    """``base:`` makes a file an overlay of another (tune_configs/chitchat_bot.yaml on chitchat_quick.yaml): the
    base's sections stay but for the keys the overlay sets; a list replaces the base's; chains resolve in order."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "root.yaml").write_text(
        "algo: {name: ppo, lr: 0.001, grpo: {kl_coef: 0.05}}\ntrain: {iters: 10, pretrain_iters: 20}\n"
        "reward: {terms: [{fn: task}, {fn: length}]}\n")
    (tmp_path / "mid.yaml").write_text("base: sub/root.yaml\nalgo: {grpo: {kl_coef: 0.02}}\ntrain: {iters: 30}\n")
    (tmp_path / "top.yaml").write_text("base: mid.yaml\nalgo: {name: grpo}\nreward: {terms: [{fn: task}]}\n")
    data = load_yaml(tmp_path / "top.yaml")
    assert data == {"algo": {"name": "grpo", "lr": 0.001, "grpo": {"kl_coef": 0.02}},
                    "train": {"iters": 30, "pretrain_iters": 20}, "reward": {"terms": [{"fn": "task"}]}}
    cfg = build_config(data)
    assert (cfg.algo.name, cfg.algo.kl_coef, cfg.train.iters, cfg.train.pretrain_iters) == ("grpo", 0.02, 30, 20)


def test_load_yaml_base_errors_name_the_file(tmp_path):
    missing = tmp_path / "a.yaml"
    missing.write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="not found") as info:
        load_yaml(missing)
    assert "nowhere.yaml" in str(info.value) and f"the base: of {missing}" in str(info.value)
    (tmp_path / "b.yaml").write_text("base: c.yaml\n")
    (tmp_path / "c.yaml").write_text("base: b.yaml\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_yaml(tmp_path / "b.yaml")
    bad = tmp_path / "d.yaml"
    bad.write_text("base: [x.yaml]\n")
    with pytest.raises(ConfigError, match="base: is the path") as info:
        load_yaml(bad)
    assert str(bad) in str(info.value)


def test_shipped_chatbot_config_is_the_quick_schedule_with_the_chosen_rl_settings():
    """tune_configs/chitchat_bot.yaml (the chatbot's settings, chosen on validation) changes the model (a GRU of
    256), the algorithm, the reward, the RL length and evaluation and keeps its best evaluation; the data, the MLE
    schedule and the resources are chitchat_quick.yaml's."""
    root = Path(__file__).resolve().parents[1] / "tune_configs"
    quick = build_config(load_yaml(root / "chitchat_quick.yaml"))
    bot = build_config(load_yaml(root / "chitchat_bot.yaml"))
    assert (bot.algo.name, bot.algo.kl_coef, bot.train.iters) == ("grpo", 0.02, 300)
    assert [(t.fn, t.weight, t.kwargs) for t in bot.reward.terms] == [("task", 1.0, {}), ("novelty", 0.1, {}),
                                                                      ("length", 0.1, {"target": 12})]
    assert bot.train.best_metric == "val/bleu2"
    assert bot.train.best_keep_start == ["val/distinct2", "val/distinct_replies"]
    assert quick.reward.terms == [] and quick.algo.name == "ppo_dynamic"  # the papers' reward and algorithm
    assert (bot.model.hidden_dim, bot.model.emb_dim, quick.model.hidden_dim) == (256, 128, 128)
    assert bot.model.model_copy(update={"hidden_dim": 128, "emb_dim": 64}) == quick.model
    for section in ("task", "learner", "rollout", "scorer"):
        assert getattr(bot, section) == getattr(quick, section), section
    rl = {"iters": quick.train.iters, "eval_every": quick.train.eval_every, "best_metric": None, "best_keep_start": []}
    assert bot.train.model_copy(update=rl) == quick.train


def test_yaml_round_trip(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("# header\nalgo:\n  name: ppo_dynamic\n  alpha1: .inf\nseed: 2\n")
    cfg = build_config(load_yaml(path), ["train.iters=7"])
    assert cfg.algo.name == "ppo_dynamic" and cfg.seed == 2 and cfg.train.iters == 7
    assert build_config(config_to_dict(cfg)) == cfg


# -- keys that do not apply -----------------------------------------------------------


@pytest.mark.parametrize(("overrides", "named"), [
    (["algo.name=ppo", "algo.raml_tau=0.5"], "algo.raml_tau: algo.name=ppo does not read this key"),
    (["algo.name=reinforce", "algo.eps=0.1"], "algo.eps: algo.name=reinforce does not read this key"),
    (["algo.name=ppo", "algo.alpha2=0.5"], "algo.alpha2: algo.name=ppo does not read this key"),
    (["algo.name=mle", "algo.gamma=0.9"], "algo.gamma: algo.name=mle does not read this key"),
    (["algo.name=scst", "algo.use_baseline=true"], "algo.use_baseline: algo.name=scst does not read"),
    (["algo.name=ppo", "disc.lr=0.1"], "disc.lr: algo.name=ppo does not read the disc: section"),
    (["task.name=counting", "task.oracle_path=x.npz"], "task.oracle_path: task.name=counting does not read"),
    (["task.name=oracle", "algo.name=mle", "task.min_len=2"], "task.min_len: task.name=oracle does not read"),
    (["algo.name=ppo", "algo.raml.raml_taux=1"], "algo.raml.raml_taux: unknown key"),
    (["algo.name=ppo", "algo.raml.eps=0.3"], "algo.raml.eps: algo.name=raml does not read this key"),
])
def test_a_given_key_the_algorithm_or_task_does_not_read_is_an_error(overrides, named):
    with pytest.raises(ConfigError) as err:
        build_config(None, overrides)
    assert named in str(err.value)


def test_keys_that_apply_are_accepted_and_defaults_never_complain():
    cfg = build_config(None, ["algo.name=ppo", "algo.eps=0.1", "algo.epochs=2", "algo.gamma=0.9"])
    assert (cfg.algo.eps, cfg.algo.epochs, cfg.algo.gamma) == (0.1, 2, 0.9)
    assert build_config(None, ["algo.name=raml", "algo.raml_tau=0.5"]).algo.raml_tau == 0.5
    assert build_config(None, ["algo.name=seqgan", "disc.lr=0.1"]).disc.lr == 0.1
    assert build_config(None, ["task.name=oracle", "algo.name=mle", "task.seq_len=5"]).task.seq_len == 5
    for name in ALGOS:  # every algorithm with every default: nothing given, nothing refused
        own = algorithm_class(name).own_task  # (the reward model: its task, which has no MLE stage)
        task = own or ("chitchat" if name in ("spg", "erpo_interpolation") else "counting")
        build_config(None, [f"algo.name={name}", f"task.name={task}", *(["train.pretrain_iters=0"] if own else [])])


def test_per_algorithm_sections_apply_only_to_the_chosen_algorithm():
    """One experiment file for several algorithms: keys under algo.<name>: are used when that is algo.name."""
    data = {"algo": {"name": "ppo", "lr": 1e-3, "ppo": {"eps": 0.1}, "scheduled_sampling": {"ss_k": 30}}}
    ppo = build_config(data)
    assert ppo.algo.eps == 0.1 and not hasattr(ppo.algo, "ss_k") and ppo.algo.lr == 1e-3
    ss = build_config(data, ["algo.name=scheduled_sampling"])
    assert ss.algo.ss_k == 30 and ss.algo.lr == 1e-3
    reinforce = build_config(data, ["algo.name=reinforce"])  # neither section: reinforce reads neither key
    assert reinforce.algo.lr == 1e-3 and not hasattr(reinforce.algo, "eps") and not hasattr(reinforce.algo, "ss_k")
    # the written config holds the chosen algorithm's keys only and is itself a valid --config
    d = config_to_dict(ss)
    assert "scheduled_sampling" not in d["algo"] and "eps" not in d["algo"] and d["algo"]["ss_k"] == 30
    assert "disc" not in d and build_config(d) == ss
    seqgan = build_config(None, ["algo.name=seqgan_ppo_dynamic"])
    assert "disc" in config_to_dict(seqgan) and build_config(config_to_dict(seqgan)) == seqgan


def test_a_later_top_level_algo_key_beats_the_files_per_algorithm_value():
    """Within a file algo.<name>.K is the more specific value; a command-line algo.K comes later and wins (it was
    silently the file's: algo.kl_coef=0.3 with chitchat_quick.yaml's algo.grpo.kl_coef built 0.02)."""
    data = {"algo": {"name": "grpo", "kl_coef": 0.1, "grpo": {"kl_coef": 0.02, "group_size": 4},
                     "ppo": {"kl_coef": 0.5}}}
    assert build_config(data).algo.kl_coef == 0.02
    cfg = build_config(data, ["algo.kl_coef=0.3"])
    assert cfg.algo.kl_coef == 0.3 and cfg.algo.group_size == 4  # the section's other keys stay
    assert build_config(data, ["algo.kl_coef=0.3", "algo.name=ppo"]).algo.kl_coef == 0.3
    assert build_config(data, ["algo.grpo.kl_coef=0.4"]).algo.kl_coef == 0.4
    assert build_config(data, ["algo.kl_coef=0.3", "algo.grpo.kl_coef=0.4"]).algo.kl_coef == 0.4
    assert data["algo"]["grpo"] == {"kl_coef": 0.02, "group_size": 4}  # the caller's data is not changed
    quick = load_yaml(Path(__file__).resolve().parents[1] / "tune_configs/chitchat_quick.yaml")
    assert build_config(quick, ["algo.name=grpo", "algo.kl_coef=0.3"]).algo.kl_coef == 0.3


def test_cuda_learner_without_a_reserved_gpu_is_a_config_error():
    """Under Ray an actor sees only the GPUs it reserves; no silent CPU fallback."""
    with pytest.raises(ConfigError, match="learner.device=cuda with learner.num_gpus=0"):
        build_config(None, ["learner.device=cuda", "rollout.num_workers=2"])
    assert build_config(None, ["learner.device=cuda", "learner.num_gpus=1"]).learner.num_gpus == 1
    cfg = build_config(None, ["learner.device=cuda", "rollout.num_workers=0", "model.hidden_dim=8",
                              "model.emb_dim=8", "task.test_size=100", "task.val_size=100"])
    import torch

    from rayseq.distributed.actors.learner import Learner

    if torch.cuda.is_available():
        assert Learner(cfg).device.type == "cuda"
    else:  # in-process without a GPU: a clear error, not a CPU run that says it is on the GPU
        with pytest.raises(RuntimeError, match="no CUDA device is visible"):
            Learner(cfg)


def test_custom_resources_and_placement_strategy_are_checked():
    """learner.resources / rollout.resources_per_worker / scorer.resources_per_scorer take custom Ray resources
    only (CPUs and GPUs have their own keys); amounts are finite and >= 0; the strategy is PACK or SPREAD."""
    cfg = build_config(overrides=["learner.resources={node_a: 1}", "rollout.resources_per_worker={pool: 0.5}",
                                  "scorer.resources_per_scorer={pool: 0}", "rollout.placement_strategy=SPREAD"])
    assert cfg.learner.resources == {"node_a": 1.0} and cfg.rollout.resources_per_worker == {"pool": 0.5}
    assert cfg.rollout.placement_strategy == "SPREAD" and build_config().rollout.placement_strategy == "PACK"
    for override, message in [
        ("learner.resources={CPU: 1}", r"learner\.resources: 'CPU' is not a custom resource \(use the num_cpus"),
        ("rollout.resources_per_worker={memory: 1}", r"rollout\.resources_per_worker: 'memory' is not a custom"),
        ("scorer.resources_per_scorer={node:10.0.0.1: 1}", r"scorer\.resources_per_scorer: 'node:10.0.0.1' is not"),
        ("learner.resources={a: -1}", r"learner\.resources: a=-1.0 must be a finite number >= 0"),
        ("learner.resources={a: .inf}", r"learner\.resources: a=inf must be a finite number"),
        ("rollout.placement_strategy=STRICT_PACK", r"rollout\.placement_strategy: Input should be 'PACK' or 'SPREAD'"),
    ]:
        with pytest.raises(ConfigError, match=message):
            build_config(overrides=[override])


@pytest.mark.parametrize("overrides", [[], ["algo.name=grpo"], ["algo.name=seqgan", "task.name=oracle"],
                                       ["algo.name=erpo_interpolation", "task.name=pairs", "task.data=d"]])
def test_print_config_describes_every_key(overrides):
    """--print-config: every key the run reads, its value, and above it the description its declaration gives
    (a run-level section's, an algorithm's or a task's fields); the listing is itself a valid --config."""
    import yaml

    from rayseq.config import described_yaml

    cfg = build_config(None, overrides)
    d = config_to_dict(cfg)
    text = described_yaml(d, cfg)
    assert yaml.safe_load(text) == d
    lines = text.splitlines()
    for section, value in d.items():
        described = {section: value} if not isinstance(value, dict) else value
        model = cfg if not isinstance(value, dict) else getattr(cfg, section)
        for key in described:
            indent = "" if model is cfg else "  "
            i = next(i for i, ln in enumerate(lines) if ln.startswith(f"{indent}{key}: ")
                     and (model is cfg or any(lines[j] == f"{section}:" for j in range(i))))
            first_words = " ".join(type(model).model_fields[key].description.split()[:3])
            above = [ln.strip().removeprefix("# ") for ln in lines[max(0, i - 8):i]]
            assert first_words in " ".join(above), (section, key)
    algo_fields = type(cfg.algo).model_fields
    assert all(f"  {k}: " in text for k in algo_fields)  # the algorithm's own keys too


def test_print_config_shows_each_keys_bounds():
    """A key's limits are printed beside its description (what a refused value would be told only at the run):
    task.test_size's minimum, lora_dropout's two bounds."""
    from rayseq.config import described_yaml

    cfg = build_config(None, [])
    lines = described_yaml(config_to_dict(cfg), cfg).splitlines()
    above = {ln.strip().split(":")[0]: lines[i - 1] for i, ln in enumerate(lines) if not ln.lstrip().startswith("#")}
    assert above["test_size"].endswith("(≥ 100)") and above["lora_dropout"].endswith("(≥ 0, < 1)")
    assert above["val_size"].endswith("(≥ 1)") and "(" not in above["seed"]  # unbounded: nothing added
    with pytest.raises(ConfigError, match="test_size"):
        build_config(None, ["task.test_size=99"])


def test_a_config_written_before_algorithms_declared_their_keys_resumes():
    """The algo: and task: sections of a run's config.yaml as rayseq d06dd24 wrote them (one AlgoConfig for every
    algorithm, keys filtered to the algorithm's): the same keys, in their old places, load into today's sections;
    a resume changes nothing and the run's config writes back the same keys (keys declared since: their defaults)."""
    import yaml

    from rayseq.config import resume_config

    saved = build_config(None, ["algo.name=grpo"]).model_dump(mode="python")  # the run-level sections: unchanged
    saved.update(yaml.safe_load("""
        task: {name: counting, test_size: 100, test_seed: 2018, val_size: 50, val_seed: 2019, min_len: 1, max_len: 10}
        algo: {name: grpo, lr: 0.0003, epochs: 1, minibatch_size: 64, eps: 0.2, max_grad_norm: 5.0, kl_coef: 0.01,
               kl_target: null, entropy_coef: 0.0, group_size: 4}
    """))
    cfg, changed = resume_config(saved, None, ["train.iters=6"], stage="train")
    assert changed == [("train.iters", 200, 6)]
    written = config_to_dict(cfg)
    assert written["task"] == saved["task"]
    assert {k: written["algo"][k] for k in saved["algo"]} == saved["algo"]
    fields = type(cfg.algo).model_fields  # keys grpo declared later (eps_high, dynamic sampling): their defaults
    assert {k: v for k, v in written["algo"].items() if k not in saved["algo"]} == {
        k: fields[k].default for k in fields if k not in saved["algo"]}
    assert list(written["algo"]) == list(fields)  # the keys grpo declares, no others


def test_a_config_with_every_algorithms_keys_loads_where_runs_are_read_back():
    """A checkpoint's config from before runs kept only the keys they read holds every algorithm's keys
    in algo: and every task's in task:; actors, serving and evaluation (RunConfig.model_validate) still load it,
    dropping what the run does not read, while a user who gives such a key is told it does not apply."""
    old = config_to_dict(build_config(None, ["algo.name=ppo_dynamic"]))
    old["algo"].update(eps=0.2, ss_k=500.0, group_size=8, critic_lr=1e-3)  # read by ppo, scheduled sampling, ...
    old["task"].update(oracle_seed=0, data=None)  # the oracle's and pairs' keys
    cfg = RunConfig.model_validate(old)
    assert config_to_dict(cfg) == config_to_dict(build_config(None, ["algo.name=ppo_dynamic"]))
    with pytest.raises(ConfigError, match=r"algo\.eps: algo\.name=ppo_dynamic does not read this key"):
        build_config(old)
    with pytest.raises(ValueError, match=r"algo\.epsx: unknown key"):  # a key no algorithm reads: still refused
        RunConfig.model_validate({**old, "algo": {**old["algo"], "epsx": 1}})


@pytest.mark.parametrize("overrides, message", [
    (("rollout.num_workers=0",), "learner.num_learners=2 runs learner actors under Ray: set rollout.num_workers >= 1"),
    (("algo.name=mixer",), "algo.name=mixer's update is not data-parallel; use one of mle, reinforce, ppo,"),
    (("algo.name=ppo", "algo.minibatch_size=1"), "algo.minibatch_size=1 rows cannot give each learner one"),
    (("algo.name=ppo", "train.batch_size=9", "algo.minibatch_size=4"),
     "train.batch_size mod algo.minibatch_size=1 rows cannot give each learner one"),
    (("algo.name=seqgan_ppo", "disc.num_negatives=5", "disc.batch_size=3"),
     "2 * disc.num_negatives mod disc.batch_size=1 rows"),
    (("algo.name=grpo", "learner.backend=nccl", "learner.num_gpus=0.5"),
     "learner.backend=nccl with learner.num_gpus=0.5: NCCL takes one rank per GPU"),
    (("algo.name=grpo", "learner.strategy=fsdp", "learner.num_gpus=0.5"),
     "learner.strategy=fsdp with learner.num_gpus=0.5: FSDP splits a model over devices"),
])
def test_num_learners_is_checked_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        build_config(None, ["learner.num_learners=2", "rollout.num_workers=1", *overrides])
    assert len(str(err.value).splitlines()) == 1
    cfg = build_config(None, ["learner.num_learners=2", "rollout.num_workers=1", "algo.name=grpo",
                              "algo.group_size=4", "rollout.num_cpus_per_worker=0.5"])
    from rayseq.distributed.groups.placement import bundles

    # the run's placement group (and a Tune trial's bundles): rank 0, the worker, then rank 1
    assert bundles(cfg) == [{"CPU": 1.0}, {"CPU": 0.5}, {"CPU": 1.0}]
