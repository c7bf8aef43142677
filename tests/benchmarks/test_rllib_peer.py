"""benchmarks/rllib_peer.py's budget matching: rayseq's sampled replies as RLlib's episodes and env steps, the
RLlib settings it changes from the defaults (and only those), and how the table reads curves. The script's
--quick path needs an MLE pretraining, Ray and RLlib's PPO (minutes on 2 cores), so it is not run here."""

from __future__ import annotations

import pytest

from benchmarks import rllib_peer as rp
from rayseq.config import build_config, load_yaml


def counting_cfg(*overrides):
    return build_config(load_yaml(rp.CONFIG), [*rp.BASE_OVERRIDES, *overrides, "algo.name=ppo"])


def test_budget_is_rayseqs_replies_in_episodes_and_env_steps():
    cfg = counting_cfg()
    b = rp.budget(cfg)
    assert cfg.train.batch_size == 256 and cfg.train.iters == 30 and cfg.train.eval_every == 5
    assert b["reply_len"] == 3  # counting's replies: always three digits, no <eos>
    assert b["episodes"] == 30 * 256  # iterations × sampled replies
    assert b["steps_per_iter"] == 256 * 3  # one rayseq batch in env steps (tokens)
    assert b["eval_episodes"] == 5 * 256  # the same evaluation points as rayseq's runs
    assert b["minibatch_steps"] == 64 * 3
    b2 = rp.budget(counting_cfg("train.iters=7", "train.batch_size=32", "train.eval_every=0"))
    assert (b2["episodes"], b2["steps_per_iter"], b2["eval_episodes"]) == (7 * 32, 32 * 3, 7 * 32)


def test_rllib_keeps_its_defaults_but_batch_lr_and_clip():
    cfg = counting_cfg("algo.lr=1e-3")
    keys = rp.rllib_training_keys(cfg, "rllib_ppo")
    assert keys == {"train_batch_size_per_learner": 768, "lr": 1e-3, "clip_param": 0.2}
    ablation = rp.rllib_training_keys(cfg, "rllib_ppo_rayseq_update")
    assert ablation == {**keys, "num_epochs": 1, "minibatch_size": 192, "use_kl_loss": False, "gamma": 1.0}


def test_the_keys_are_ppo_config_fields():
    pytest.importorskip("ray.rllib")
    from ray.rllib.algorithms.ppo import PPOConfig

    cfg = counting_cfg()
    default = PPOConfig()
    for variant in rp.RLLIB_VARIANTS:
        keys = rp.rllib_training_keys(cfg, variant)
        assert all(hasattr(default, k) for k in keys)
        config = PPOConfig().training(**keys)
        assert config.train_batch_size_per_learner == 768 and config.clip_param == 0.2
    assert default.num_epochs == 30 and default.use_kl_loss  # what "RLlib's defaults" means in the report


def test_evaluation_marks_and_first_reaching():
    assert rp.eval_marks(30 * 256, 5 * 256) == [1280, 2560, 3840, 5120, 6400, 7680]
    assert rp.eval_marks(1000, 300) == [300, 600, 900, 1000]
    curve = [{"episodes": 0, "train_s": 0.0, "val_precision": 0.8},
             {"episodes": 1280, "train_s": 2.5, "val_precision": 0.96},
             {"episodes": 2560, "train_s": 5.0, "val_precision": 0.99}]
    assert rp.first_reaching(curve, "episodes") == 1280 and rp.first_reaching(curve, "train_s") == 2.5
    assert rp.first_reaching(curve, "episodes", target=0.999) is None
    assert rp._reached([1280, None, 2560]) == "1920 (2/3 seeds)"
    assert rp._reached([None, None]) == "not reached (0/2)"
    assert rp._reached([2.5, 5.0], ".1f") == "3.8"


def test_table_has_a_row_per_method_and_the_start():
    curve = [{"episodes": 0, "train_s": 0.0, "val_precision": 0.8},
             {"episodes": 512, "train_s": 1.0, "val_precision": 0.97}]
    common = {"episodes": 512, "env_steps": 1536, "train_s": 1.0, "curve": curve, "test/precision": 0.98,
              "test/precision_sampled": 0.9, "rows_trained_per_iter": 768.0, "updates_per_iter": 4.0,
              "iter_s": [0.6, 0.2, 0.4]}
    results = {"ppo": {0: common}, "rllib_ppo": {0: {**common, "startup_s": 9.0, "rows_trained_per_iter": 30720.0,
                                                     "updates_per_iter": 240.0}}}
    pretrain = {0: {"val/precision": 0.8, "test/precision": 0.78, "test/precision_sampled": 0.7}}
    text = rp.table(results, pretrain, [0])
    assert "| MLE (pretrained, the start) | 78.000 |" in text
    assert "| rayseq PPO | 98.000 | 90.000 | 512 | 1536 | 512 |" in text
    assert "| RLlib PPO (defaults) | 1.000 | 0.600, 0.400 | 1.0 | 30720 | 240.0 | 9.000 |" in text
