"""Group-sampling algorithms added through the algorithm protocol: each declares its own
``group_size`` key, asks the driver for G samples per prompt (consecutive rows) and computes its advantages from
the group; nothing in the driver, learner, runtime or config names them."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayseq.algos.iteration import Step
from rayseq.config import ConfigError, build_config
from rayseq.distributed.driver import Trainer
from tests.conftest import tiny_config


def test_grpo_advantage_is_the_group_normalised_reward_by_hand():
    from rayseq.algos.grpo import group_normalized_advantages

    # two groups of 3: rewards (1, 0, 0): mean 1/3, population std √2/3 -> (2/3)/(√2/3) = √2, (−1/3)/(√2/3) = −1/√2
    # (0.5, 0.5, 0.5): std 0 -> every advantage 0
    adv = group_normalized_advantages(np.array([1.0, 0.0, 0.0, 0.5, 0.5, 0.5]), 3)
    np.testing.assert_allclose(adv, [2 ** 0.5, -(2 ** -0.5), -(2 ** -0.5), 0, 0, 0], atol=1e-6)
    # a plain loop over groups
    rng = np.random.default_rng(0)
    r = rng.random(24)
    loop = []
    for g in range(6):
        grp = r[4 * g : 4 * g + 4]
        loop += [(x - grp.mean()) / (grp.std() + 1e-8) for x in grp]
    np.testing.assert_allclose(group_normalized_advantages(r, 4), loop)


def test_grpo_declares_its_key_and_checks_whole_groups():
    cfg = build_config(None, ["algo.name=grpo", "algo.group_size=4", "train.batch_size=32"])
    assert cfg.algo.group_size == 4 and cfg.algo.eps == 0.2
    with pytest.raises(ConfigError, match="train.batch_size=30 is not a multiple of algo.group_size=4"):
        build_config(None, ["algo.name=grpo", "algo.group_size=4", "train.batch_size=30"])
    with pytest.raises(ConfigError, match="algo.group_size: algo.name=ppo does not read this key"):
        build_config(None, ["algo.name=ppo", "algo.group_size=4"])
    with pytest.raises(ConfigError, match="algo.group_size"):
        build_config(None, ["algo.name=grpo", "algo.group_size=1"])


def test_rloo_advantage_is_the_leave_one_out_baseline_by_hand():
    from rayseq.algos.rloo import leave_one_out_advantages

    # group (1, 0, 0, 1): reply 0's baseline is (0 + 0 + 1)/3 -> 2/3; reply 1's (1 + 0 + 1)/3 -> −2/3
    adv = leave_one_out_advantages(np.array([1.0, 0.0, 0.0, 1.0, 0.2, 0.2, 0.2, 0.2]), 4)
    np.testing.assert_allclose(adv, [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0], atol=1e-12)
    r = np.random.default_rng(1).random(12)
    loop = [r[i] - np.mean([r[j] for j in range(3 * (i // 3), 3 * (i // 3) + 3) if j != i]) for i in range(12)]
    np.testing.assert_allclose(leave_one_out_advantages(r, 3), loop)
    np.testing.assert_allclose(leave_one_out_advantages(r, 3),  # = G/(G−1)·(r − group mean)
                               1.5 * (r - np.repeat(r.reshape(-1, 3).mean(1), 3)))


def test_grpo_dynamic_uses_the_group_advantage_and_dynamic_bounds():
    """At ρ = 1 (one epoch, one minibatch) the clip does not bind: grpo_dynamic takes GRPO's step exactly."""
    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.actors.worker import RolloutWorker
    from rayseq.types import RolloutRequest

    params = {}
    for name in ("grpo", "grpo_dynamic"):
        cfg = tiny_config(f"algo.name={name}", "algo.group_size=4", "train.batch_size=16", "algo.minibatch_size=null")
        learner, worker = Learner(cfg), RolloutWorker(cfg)
        learner.start_stage("train")
        worker.set_weights(learner.get_weights(), 0)
        prompts = learner.task.sample_prompts(np.random.default_rng(0), 4).repeat(4)
        r = worker.sample(prompts, RolloutRequest(max_len=3, seed=3))
        r.score = np.random.default_rng(1).random(16).astype(np.float32)
        m = learner.update(r, 0)
        params[name] = learner.state.generator.state_dict()
        assert m["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["ppo_dynamic/alpha2"] == 1.0 and m["ppo_dynamic/alpha1"] == float("inf")
    for k, v in params["grpo"].items():
        torch.testing.assert_close(params["grpo_dynamic"][k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "rloo", "grpo_dynamic"])
def test_group_algorithm_trains_on_groups_of_one_prompt(tmp_path, name):
    """Through the driver: every group of G consecutive rows shares its prompt, the update moves the policy."""
    from rayseq.algos import make_algo

    cfg = tiny_config(f"algo.name={name}", "algo.group_size=4", "rollout.num_workers=0", "train.iters=3",
                      run_dir=tmp_path / "run")
    trainer = Trainer(cfg)
    algo = make_algo(cfg.algo, cfg.seed)
    prompts = Step(cfg=cfg, task=trainer.task, rng=trainer.rng, stage_iter=0, n_iters=3, iteration=0,
                   batch_size=cfg.train.batch_size).prompts(algo)
    src = prompts.src.reshape(-1, 4, prompts.src.shape[1])
    assert (src == src[:, :1]).all() and len(np.unique(src[:, 0], axis=0)) > 1
    summary = trainer.run()
    rows = [r for r in pq.read_table(tmp_path / "run" / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 3 and all(r["group/reward_std"] >= 0 for r in rows)
    assert "loss/value" not in rows[0] or rows[0]["loss/value"] is None  # no value network
    assert summary["metrics"]["test/precision"] >= 0


def test_grpo_raises_the_reward_of_the_better_half_of_a_group():
    """One update on a hand-made group: the reply with the higher reward gains probability, the other loses it."""
    from rayseq.algos import make_algo
    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.actors.worker import RolloutWorker
    from rayseq.rewards import terminal_rewards
    from rayseq.types import RolloutRequest

    cfg = tiny_config("algo.name=grpo", "algo.group_size=8", "algo.lr=0.05", "train.batch_size=8",
                      "algo.minibatch_size=8")
    learner, worker = Learner(cfg), RolloutWorker(cfg)
    learner.start_stage("train")
    worker.set_weights(learner.get_weights(), 0)
    algo = make_algo(cfg.algo, cfg.seed)
    prompts = learner.task.sample_prompts(np.random.default_rng(0), 1).repeat(8)
    r = worker.sample(prompts, RolloutRequest(max_len=3, seed=3))
    r.score = (np.arange(8) < 4).astype(np.float32)  # the first half is "right"
    r.rewards = terminal_rewards(r.score, r.token_mask)
    g = learner.state.generator

    def seq_logp():
        with torch.no_grad():
            return g.logprobs(torch.from_numpy(r.src), torch.from_numpy(r.src_len),
                              torch.from_numpy(r.tokens)).logp.sum(1).numpy()

    before = seq_logp()
    learner.algo = algo
    learner.update(r, 0)
    after = seq_logp()
    other_half = {i: [j for j in range(8) if (j < 4) != (i < 4)] for i in range(8)}
    distinct = [i for i in range(8) if not any((r.tokens[i] == r.tokens[j]).all() for j in other_half[i])]
    assert distinct, "the sampled replies of the two halves coincide"
    gain = after - before
    assert np.mean(gain[[i for i in distinct if i < 4]]) > np.mean(gain[[i for i in distinct if i >= 4]])


def test_advantages_of_a_read_only_rollout_warn_nothing():
    """A rollout read from the object store has read-only arrays: its advantages are made without torch's
    UserWarning about a non-writable NumPy array, and the rollout is left as it was."""
    import warnings
    from types import SimpleNamespace

    from rayseq.algos.grpo import token_advantages

    mask = np.array([[1, 1, 0], [1, 0, 0]], dtype=np.float32)
    mask.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adv = token_advantages(np.array([0.5, -0.5]), SimpleNamespace(action_mask=mask))
    assert adv.tolist() == [[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0]] and not mask.flags.writeable
