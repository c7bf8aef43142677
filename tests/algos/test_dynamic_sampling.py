"""DAPO (Yu et al. 2025) in the group algorithms: the decoupled clip ``algo.eps_high`` (Sec. 3.1) on a hand-computed
example, and dynamic sampling (Sec. 3.2, ``algo.dynamic_sampling``): groups with equal rewards dropped, fresh prompts
sampled until the batch is full, the cap, the config's errors, both paths (in-process, 2 Ray workers) and resume.

The reward ``tests.reward_fixtures:odd_first_digit_informative`` makes a group informative exactly when its counting
prompt starts with an odd digit, so what each iteration keeps is predicted from the data RNG alone."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayseq.algos import make_algo
from rayseq.algos.dynamic_sampling import informative_groups, select_groups, shards_holding
from rayseq.algos.iteration import Step, counted
from rayseq.config import ConfigError, build_config
from rayseq.distributed.driver import Trainer
from rayseq.distributed.groups import ActorGroups
from rayseq.losses import ppo_clip_loss
from tests.conftest import tiny_config

F64 = torch.float64
REWARD = "reward.fn=tests.reward_fixtures:odd_first_digit_informative"


def test_decoupled_clip_by_hand():
    """DAPO's clip term (Sec. 3.1; Eq. 8 of arXiv:2503.14476): min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A), ε_low = 0.2,
    ε_high = 0.28 -> range [0.8, 1.28]."""
    ratios = torch.tensor([[1.1, 1.25, 1.5, 0.7], [1.1, 1.25, 1.5, 0.7]], dtype=F64)
    old_logp = torch.log(torch.full_like(ratios, 0.3))
    logp = (old_logp + torch.log(ratios)).detach().requires_grad_(True)
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4], dtype=F64)
    mask = torch.ones(2, 4, dtype=F64)
    loss, stats = ppo_clip_loss(logp, old_logp, adv, mask, eps=0.2, eps_high=0.28)
    # A=+1: 1.1 -> 1.1; 1.25 -> 1.25 (inside: the symmetric range would clip it to 1.2); 1.5 -> min(1.5, 1.28) = 1.28;
    #       0.7 -> min(0.7, 0.8) = 0.7                                          row sum 4.33
    # A=−1: 1.1 -> −1.1; 1.25 -> −1.25; 1.5 -> min(−1.5, −1.28) = −1.5; 0.7 -> min(−0.7, −0.8) = −0.8    row sum −4.65
    # mean over 8 = −0.32 / 8 = −0.04; loss = −mean = 0.04
    assert loss.item() == pytest.approx(0.04)
    loss.backward()
    # ∂(ρA)/∂logp = ρA where the unclipped term is the minimum, 0 where the clipped one is; loss = −mean
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.1, -1.25, 0.0, -0.7], [1.1, 1.25, 1.5, 0.0]],
                                                       dtype=F64) / 8)
    assert stats.clipfrac.item() == pytest.approx(4 / 8)  # 1.5 and 0.7 lie outside [0.8, 1.28] in both rows
    # symmetric (Eq. 3): 1.25 is clipped to 1.2 for A = +1: row 0 sums 1.1 + 1.2 + 1.2 + 0.7 = 4.2, row 1 −1.1 − 1.25
    # − 1.5 − 0.8 = −4.65 -> loss = 0.45 / 8; eps_high=None is eps_high=eps, bit for bit
    sym, _ = ppo_clip_loss(logp.detach(), old_logp, adv, mask, eps=0.2)
    assert sym.item() == pytest.approx(0.45 / 8)
    assert torch.equal(sym, ppo_clip_loss(logp.detach(), old_logp, adv, mask, eps=0.2, eps_high=0.2)[0])


def test_select_groups_by_hand_and_against_a_loop():
    # G = 2; round 0: (1, 1) equal, (0, 1) informative, (0, 0) equal; round 1: (1, 0) yes, (1, 1) no, (0, 1) yes
    rounds = [np.array([1, 1, 0, 1, 0, 0.0]), np.array([1, 0, 1, 1, 0, 1.0])]
    np.testing.assert_array_equal(informative_groups(np.concatenate(rounds), 2), [0, 1, 0, 1, 0, 1])
    np.testing.assert_array_equal(select_groups(rounds, 2, 2), [2, 3, 6, 7])  # the first two kept, in order
    np.testing.assert_array_equal(select_groups(rounds, 2, 5), [2, 3, 6, 7, 10, 11])  # short: all three
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 2, 12).astype(float) for _ in range(3)]
    flat = np.concatenate(parts)
    loop = []
    for g in range(len(flat) // 3):
        if len(loop) < 4 * 3 and len(set(flat[3 * g: 3 * g + 3])) > 1:
            loop += [3 * g, 3 * g + 1, 3 * g + 2]
    np.testing.assert_array_equal(select_groups(parts, 3, 4), loop)


def test_kept_rows_are_found_in_the_shards_that_hold_them():
    # 3 shards of 4 rows (two rounds on 2 workers, or 3 rounds in-process): rows 4, 5 in shard 1 and 10, 11 in shard 2;
    # shard 0 holds none and is not sent -> positions 0, 1 and 4 + 2, 4 + 3 in shards 1 + 2 concatenated
    used, rows = shards_holding([4, 4, 4], np.array([4, 5, 10, 11]))
    assert used == [1, 2] and rows.tolist() == [0, 1, 6, 7]
    used, rows = shards_holding([3, 5], np.array([0, 1, 2, 6, 7]))  # uneven shards, a group across their border
    assert used == [0, 1] and rows.tolist() == [0, 1, 2, 6, 7]


def test_dynamic_sampling_config_keys_and_errors():
    cfg = build_config(None, ["algo.name=grpo", "algo.group_size=4", "train.batch_size=16",
                              "algo.dynamic_sampling=true", "algo.eps_high=0.28"])
    assert cfg.algo.dynamic_sampling and cfg.algo.max_resample_rounds == 4 and cfg.algo.eps_high == 0.28
    assert build_config(None, ["algo.name=rloo", "algo.dynamic_sampling=true"]).algo.dynamic_sampling
    assert build_config(None, ["algo.name=grpo_dynamic", "algo.dynamic_sampling=true"]).algo.dynamic_sampling
    assert build_config(None, ["algo.name=ppo", "algo.eps_high=0.3"]).algo.eps_high == 0.3
    with pytest.raises(ConfigError, match="algo.dynamic_sampling: algo.name=ppo does not read this key"):
        build_config(None, ["algo.name=ppo", "algo.dynamic_sampling=true"])
    with pytest.raises(ConfigError, match="algo.max_resample_rounds"):
        build_config(None, ["algo.name=grpo", "algo.max_resample_rounds=-1"])
    with pytest.raises(ConfigError, match="algo.eps_high: algo.name=grpo_dynamic does not read this key"):
        build_config(None, ["algo.name=grpo_dynamic", "algo.eps_high=0.28"])
    with pytest.raises(ConfigError, match="algo.eps_high"):
        build_config(None, ["algo.name=grpo", "algo.eps_high=0"])
    with pytest.raises(ConfigError, match="algo.dynamic_sampling=true: .*rollout.pipeline=false"):
        build_config(None, ["algo.name=grpo", "algo.dynamic_sampling=true", "rollout.pipeline=true"])


def _predict(rng_state: dict, task, n_prompts: int, rounds_cap: int, iters: int) -> list[dict]:
    """What each iteration should do, from the data RNG alone: rounds of ``n_prompts`` prompts until ``n_prompts``
    odd-first-digit (informative) groups are drawn or the cap is reached."""
    rng = np.random.default_rng()
    rng.bit_generator.state = rng_state
    out = []
    for _ in range(iters):
        informative = equal = 0
        rounds = 0
        while True:
            first = task.sample_prompts(rng, n_prompts).src[:, 0] - task.digit0
            informative += int((first % 2 == 1).sum())
            equal += int((first % 2 == 0).sum())
            if informative >= n_prompts or rounds == rounds_cap:
                break
            rounds += 1
        out.append({"group/resample_rounds": rounds, "group/prompts_consumed": n_prompts * (rounds + 1),
                    "group/kept_groups": min(informative, n_prompts),
                    "group/all_equal_frac": equal / (n_prompts * (rounds + 1))})
    return out


def _run_iterations(cfg, iters: int) -> tuple[list[dict], list[dict], list[int]]:
    """``iters`` training iterations of the configured algorithm on its actor groups, from the untrained model:
    (metrics, predictions, learner versions after each)."""
    trainer = Trainer(cfg)
    predicted = _predict(trainer.rng.bit_generator.state, trainer.task, cfg.train.batch_size // cfg.algo.group_size,
                         cfg.algo.max_resample_rounds, iters)
    groups = ActorGroups(cfg)
    try:
        groups.learner.start_stage("train")
        algo = make_algo(cfg.algo, cfg.seed)
        metrics, versions = [], []
        for i in range(iters):
            step = Step(cfg=cfg, task=trainer.task, rng=trainer.rng, stage_iter=i, n_iters=iters, iteration=i,
                        batch_size=cfg.train.batch_size, carry=trainer.carry)
            with counted(groups) as counters:  # what the driver adds around every iteration
                m = algo.training_step(groups, step)
            metrics.append({**m, **counters})
            versions.append(groups.learner.version())
    finally:
        groups.shutdown()
    return metrics, predicted, versions


def _check_refill(metrics: list[dict], predicted: list[dict]) -> None:
    for m, p in zip(metrics, predicted):
        assert {k: m[k] for k in p} == pytest.approx(p)
        # the update trained on the kept groups only: each has rewards (0, 1, 0, 1) -> mean 0.5, where the sampled
        # replies' mean counts the equal groups' 1.0 too
        assert m["rollout/reward_mean"] == 0.5
        eq = p["group/all_equal_frac"]
        assert m["group/sampled_reward_mean"] == pytest.approx(eq * 1.0 + (1 - eq) * 0.5)
        # the reward's one term, logged over every sampled reply (not the trained batch's 0.5)
        assert m["reward/odd_first_digit_informative"] == pytest.approx(m["group/sampled_reward_mean"])


@pytest.mark.parametrize("name", ["grpo", "rloo", "grpo_dynamic"])
def test_equal_reward_groups_are_dropped_and_the_batch_refilled(tmp_path, name):
    """Four groups per batch; about half the prompts start with an odd digit: rounds are drawn until four
    informative groups are kept (counted from the prompts), and the update sees those only."""
    cfg = tiny_config(f"algo.name={name}", "algo.group_size=4", "train.batch_size=16", "algo.dynamic_sampling=true",
                      "algo.max_resample_rounds=8", REWARD, "rollout.num_workers=0", run_dir=tmp_path / "run")
    metrics, predicted, versions = _run_iterations(cfg, 4)
    assert any(p["group/resample_rounds"] > 0 for p in predicted)  # the data made it refill
    assert all(p["group/kept_groups"] == 4 for p in predicted)
    _check_refill(metrics, predicted)
    assert versions == [1, 2, 3, 4]


def test_cap_reached_trains_on_the_groups_kept_or_skips_the_update(tmp_path, caplog):
    """max_resample_rounds=0: one round of 8 prompts, of which fewer than 8 are informative -> a short batch, trained
    on; a reward equal for every reply -> no group kept, no update (version and weights unchanged)."""
    cfg = tiny_config("algo.name=grpo", "algo.group_size=2", "train.batch_size=16", "algo.dynamic_sampling=true",
                      "algo.max_resample_rounds=0", REWARD, "rollout.num_workers=0", run_dir=tmp_path / "a")
    metrics, predicted, versions = _run_iterations(cfg, 2)
    assert all(0 < p["group/kept_groups"] < 8 and p["group/resample_rounds"] == 0 for p in predicted)
    _check_refill(metrics, predicted)
    assert versions == [1, 2]

    cfg = tiny_config("algo.name=grpo", "algo.group_size=2", "train.batch_size=8", "algo.dynamic_sampling=true",
                      "algo.max_resample_rounds=1", "reward.fn=tests.reward_fixtures:fine", "rollout.num_workers=0",
                      run_dir=tmp_path / "b")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rayseq.algos.dynamic_sampling"):
        metrics, _, versions = _run_iterations(cfg, 1)
    (m,) = metrics
    assert m["group/kept_groups"] == 0 and m["group/all_equal_frac"] == 1.0 and m["group/resample_rounds"] == 1
    assert m["group/prompts_consumed"] == 8 and "loss/policy" not in m
    assert versions == [0]
    # said, not only logged in the metrics: the progress line's reward is then of the few groups kept
    (warning,) = [r.getMessage() for r in caplog.records if "algo.dynamic_sampling" in r.getMessage()]
    assert "iteration 0 made no update" in warning and "100.0% of the 8 groups sampled" in warning


def test_the_short_batch_warning_is_said_at_1_10_100_such_iterations(caplog):
    from types import SimpleNamespace

    from rayseq.algos.dynamic_sampling import _warn_short_batch

    algo = SimpleNamespace(cfg=SimpleNamespace(max_resample_rounds=4))
    with caplog.at_level(logging.WARNING, logger="rayseq.algos.dynamic_sampling"):
        for i in range(120):
            _warn_short_batch(algo, i, 1, 8, 4, np.array([True] * 39 + [False]))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 3 and "10 such iterations so far" in said[1] and "100 such" in said[2]
    assert "trained on 1 of the batch's 8 groups after 4 resample round(s): 97.5% of the 40 groups" in said[0]


@pytest.mark.ray
def test_dynamic_sampling_on_two_ray_workers(ray_session, tmp_path):
    """The same iteration on 2 rollout workers and a scorer actor (the configured reward is scored there): each
    round's rewards reach the driver in the calls' info, the kept rows are selected on the learner."""
    cfg = tiny_config("algo.name=grpo", "algo.group_size=4", "train.batch_size=16", "algo.dynamic_sampling=true",
                      "algo.max_resample_rounds=8", REWARD, "rollout.num_workers=2", "scorer.num_scorers=1",
                      "learner.num_cpus=0.5", "rollout.num_cpus_per_worker=0.5", "scorer.num_cpus_per_scorer=0.5",
                      run_dir=tmp_path / "run")
    metrics, predicted, versions = _run_iterations(cfg, 2)
    assert any(p["group/resample_rounds"] > 0 for p in predicted)
    _check_refill(metrics, predicted)
    assert versions == [1, 2] and all(m["driver/recv_bytes"] > 0 for m in metrics)


def test_dynamic_sampling_resumes_where_it_stopped(tmp_path):
    """4 iterations in one go = 2, a checkpoint, and 2 more after --resume: the same metrics and weights (the data
    RNG that the resampling rounds draw from is the checkpoint's)."""
    from rayseq.checkpoint import load_checkpoint
    from rayseq.config import resume_config

    args = ["algo.name=grpo", "algo.group_size=4", "train.batch_size=16", "algo.dynamic_sampling=true",
            "algo.max_resample_rounds=2", "rollout.num_workers=0", "train.pretrain_iters=2", "train.eval_every=0",
            "task.val_size=100", "task.test_size=100"]
    whole = Trainer(tiny_config(*args, "train.iters=4", run_dir=tmp_path / "whole")).run()
    Trainer(tiny_config(*args, "train.iters=2", run_dir=tmp_path / "part")).run()
    saved = load_checkpoint(str(tmp_path / "part"))
    cfg, _ = resume_config(saved["config"], None, ["train.iters=4"], stage=saved["driver"]["stage"])
    resumed = Trainer(cfg, resume=True).run()

    def rows(d):
        # (the first run of the part evaluated at its end, where the whole one did not: val/* left out)
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "val/"))}
                for r in pq.read_table(d / "metrics.parquet").to_pylist()]

    assert rows(tmp_path / "whole") == rows(tmp_path / "part")
    a, b = load_checkpoint(whole["checkpoint"]), load_checkpoint(resumed["checkpoint"])
    for k, v in a["learner"]["generator"].items():
        assert torch.equal(v, b["learner"]["generator"][k]), k
    assert a["driver"]["numpy_rng"] == b["driver"]["numpy_rng"]
