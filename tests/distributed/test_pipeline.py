"""Rollouts sampled ahead of the learner (``rollout.max_staleness`` = k; ``rollout.pipeline=true`` is k = 1)
in-process: batch i+k is sampled with the weights before update i (staleness ≤ k), the ratio algorithms correct with
the behaviour log-probs recorded at sampling, a resumed run draws the batches in flight again, and algorithms without
such a ratio are refused."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayseq.config import ConfigError, check_pipeline
from rayseq.distributed.driver import Interrupted, Trainer
from tests.conftest import tiny_config

# one epoch, one minibatch: synchronous PPO's ratio π_θ / π_old is exactly 1 (π_θ is the sampling policy)
ONE_STEP = ("algo.name=ppo", "algo.epochs=1", "algo.lr=0.01", "train.iters=5", "train.eval_every=0")


def train_rows(run_dir):
    t = pq.read_table(run_dir / "metrics.parquet").to_pandas()
    return t[t.stage == "train"].reset_index(drop=True)


def test_pipelined_batches_are_one_update_old_and_the_ratio_corrects_for_it(tmp_path):
    rows = {}
    for pipeline in (False, True):
        run_dir = tmp_path / f"p{pipeline}"
        Trainer(tiny_config("rollout.num_workers=0", f"rollout.pipeline={str(pipeline).lower()}", *ONE_STEP,
                            run_dir=run_dir)).run()
        rows[pipeline] = train_rows(run_dir)
    sync, pipe = rows[False], rows[True]
    assert list(sync["rollout/staleness"]) == [0.0] * 5
    assert list(pipe["rollout/staleness"]) == [0.0, 1.0, 1.0, 1.0, 1.0]
    # the first batch is the same batch (same prompts, seed and weights) with the same update
    for col in ("rollout/reward_mean", "loss/policy", "policy/ratio_mean", "learner/version"):
        assert pipe[col][0] == sync[col][0], col
    np.testing.assert_allclose(sync["policy/ratio_mean"], 1.0, atol=1e-6)
    # later batches were sampled by the policy one update before: ρ = π_θ / π_behaviour differs from 1, measured
    # against the log-probs recorded when they were sampled (not recomputed with the learner's weights)
    assert (np.abs(pipe["policy/ratio_mean"][1:] - 1.0) > 1e-4).all(), pipe["policy/ratio_mean"]
    assert (pipe["policy/approx_kl"][1:] > 0).all()
    assert pipe["learner/version"].tolist() == sync["learner/version"].tolist()


@pytest.mark.parametrize("k", [2, 4])
def test_batches_sampled_k_ahead_are_at_most_k_updates_old(tmp_path, k):
    """k batches go out ahead with the weights of their time: staleness 0, 1, …, k, then k; the prompts and seeds are
    the synchronous run's (the first batch's update is the same), and the ratio sees the older policy."""
    rows = {}
    for staleness in (0, 1, k):
        run_dir = tmp_path / f"k{staleness}"
        Trainer(tiny_config("rollout.num_workers=0", f"rollout.max_staleness={staleness}", *ONE_STEP,
                            "train.iters=7", run_dir=run_dir)).run()
        rows[staleness] = train_rows(run_dir)
    assert list(rows[k]["rollout/staleness"]) == [min(i, k) for i in range(7)]
    for col in ("rollout/reward_mean", "loss/policy", "policy/ratio_mean"):
        assert rows[k][col][0] == rows[0][col][0] == rows[1][col][0], col
    # batch 1 is sampled with the first weights by k = 1 and k: the same rollouts, the same learner: the same update
    assert rows[k]["loss/policy"][1] == rows[1]["loss/policy"][1]
    assert rows[k]["loss/policy"][2] != rows[1]["loss/policy"][2]  # batch 2: k's from the first weights, 1's not
    assert list(rows[k]["rollout/in_flight"]) == [min(k, 6 - i) for i in range(7)]
    assert (np.abs(rows[k]["policy/ratio_mean"][1:] - 1.0) > 1e-4).all()


def test_a_resumed_run_draws_the_batches_in_flight_again(tmp_path):
    """A checkpoint taken with k batches in flight keeps the data RNGs from before the oldest: resumed, the run samples
    those prompts again (with its current weights: staleness restarts at 0), so its prompts are the uninterrupted
    run's."""
    common = ("rollout.num_workers=0", "rollout.max_staleness=2", *ONE_STEP, "train.iters=6",
              "train.checkpoint_every=3")
    Trainer(tiny_config(*common, run_dir=tmp_path / "whole")).run()

    def stop_after_3(row, trainer):  # stopped (as by SIGTERM) after the checkpoint of iteration 3, 2 batches out
        if row["stage"] == "train" and trainer.stage_iter == 3:
            assert len(trainer.carry.ahead) == 2
            trainer._stop = True

    with pytest.raises(Interrupted):
        Trainer(tiny_config(*common, run_dir=tmp_path / "cut"), report=stop_after_3).run()
    Trainer(tiny_config(*common, run_dir=tmp_path / "cut"), resume=True).run()
    whole, cut = train_rows(tmp_path / "whole"), train_rows(tmp_path / "cut")
    assert list(cut["rollout/staleness"]) == [0, 1, 2, 0, 1, 2]
    assert list(cut["learner/version"]) == list(whole["learner/version"])
    # the first three iterations are the same run; after the resume the batches are drawn from the same data RNG
    for col in ("rollout/reward_mean", "loss/policy"):
        assert cut[col][:3].tolist() == whole[col][:3].tolist(), col


def test_the_last_iteration_samples_no_batch_that_nobody_uses(tmp_path):
    calls = []

    def report(row, trainer):
        calls.append(not trainer.carry.ahead)

    cfg = tiny_config("rollout.num_workers=0", "rollout.pipeline=true", *ONE_STEP, run_dir=tmp_path / "r")
    Trainer(cfg, report=report).run()
    assert calls[-1] and not any(calls[-5:-1])  # in flight after every train iteration but the last


@pytest.mark.parametrize("name", ["ppo", "ppo_dynamic", "grpo", "grpo_dynamic", "mixer_ppo", "mixer_ppo_dynamic"])
def test_ratio_algorithms_accept_the_pipeline(name):
    assert tiny_config("rollout.pipeline=true", f"algo.name={name}").rollout.max_staleness == 1
    assert tiny_config("rollout.max_staleness=3", f"algo.name={name}").rollout.max_staleness == 3


def test_pipeline_is_max_staleness_one_unless_a_bound_is_given():
    assert tiny_config().rollout.max_staleness == 0
    assert tiny_config("rollout.pipeline=true", "rollout.max_staleness=2").rollout.max_staleness == 2
    with pytest.raises((ConfigError, ValueError), match="rollout.max_staleness"):
        tiny_config("rollout.max_staleness=-1")


@pytest.mark.parametrize(("name", "why"), [
    ("reinforce", "its update has no importance ratio"),
    ("scst", "its update has no importance ratio"),
    ("seqgan", "its update has no importance ratio"),
    ("seqgan_ppo", "its rewards come from a model it trains between the batches"),
    ("actor_critic", "its update has no importance ratio"),
])
def test_algorithms_without_a_ratio_refuse_the_pipeline(name, why):
    with pytest.raises((ConfigError, ValueError)) as err:
        tiny_config("rollout.pipeline=true", f"algo.name={name}")
    msg = str(err.value)
    assert (f"rollout.max_staleness=1: algo.name={name} cannot train on rollouts sampled with older weights "
            f"({why}") in msg
    assert msg.endswith("use one of mixer_ppo, mixer_ppo_dynamic, ppo, ppo_dynamic, grpo, grpo_dynamic or "
                        "rollout.max_staleness=0 (and rollout.pipeline=false)")


def test_a_ratio_algorithm_whose_requests_carry_learner_state_refuses_the_pipeline():
    from rayseq.algos import PPO

    class Annealed(PPO):  # e.g. a ratio algorithm whose request reads a λ the learner anneals
        stateful_request = True

    with pytest.raises(ValueError, match=r"algo.name=annealed cannot train on rollouts sampled with older weights "
                                         r"\(its rollout requests depend on the learner's state at sampling time\)"):
        check_pipeline(Annealed, "annealed")


def test_the_decoupled_objective_by_hand():
    """algo.ratio_to=proximal, as ppo_update composes it: −mean_t w_t·min(ρ_t A_t, clip(ρ_t) A_t) with ρ = π_θ/π_prox
    and w = min(π_prox/π_behaviour, C). Token 1: ρ = 0.5/0.4 = 1.25, clipped to 1.2, w = 0.4/0.2 = 2 → 2.4; token 2:
    ρ = 0.2/0.25 = 0.8, A = −1: min(−0.8, −0.8) = −0.8, w = 0.25/0.5 = 0.5 → −0.4; loss = −(2.4 − 0.4)/2 = −1.0.
    With C = 1.5 token 1's weight is 1.5: −(1.8 − 0.4)/2 = −0.7."""
    import torch

    from rayseq.losses import ppo_clip_loss
    from rayseq.losses.mismatch import truncated_is_weights

    logp, prox, behaviour = (torch.tensor([[0.5, 0.2]]).log(), torch.tensor([[0.4, 0.25]]).log(),
                             torch.tensor([[0.2, 0.5]]).log())
    adv, mask = torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)
    for cap, expected in ((5.0, -1.0), (1.5, -0.7)):
        w = truncated_is_weights(prox, behaviour, mask, cap)
        loss, _ = ppo_clip_loss(logp, prox, adv * w, mask, eps=0.2)
        assert float(loss) == pytest.approx(expected, abs=1e-6)


def test_the_ratio_against_the_proximal_policy_clips_less_of_a_stale_batch(tmp_path):
    """algo.ratio_to=proximal: on fresh batches π_prox is the behaviour policy (weights 1, the run as with the ratio
    to the behaviour policy up to float rounding); on batches sampled 4 updates ahead the first minibatch's ratio is
    1 again and fewer tokens are clipped than against the stale behaviour weights, the tokens weighted by
    π_prox / π_behaviour instead."""
    common = ("rollout.num_workers=0", "algo.name=grpo", "algo.group_size=4", "algo.lr=0.01", "train.iters=6",
              "train.eval_every=0", "algo.minibatch_size=8")
    rows = {}
    for k, ratio_to in ((0, "behaviour"), (0, "proximal"), (4, "behaviour"), (4, "proximal")):
        run_dir = tmp_path / f"k{k}-{ratio_to}"
        Trainer(tiny_config(*common, f"rollout.max_staleness={k}", f"algo.ratio_to={ratio_to}",
                            run_dir=run_dir)).run()
        rows[k, ratio_to] = train_rows(run_dir)
    fresh = rows[0, "proximal"]
    np.testing.assert_allclose(fresh["policy/behaviour_weight_mean"], 1.0, atol=1e-4)
    np.testing.assert_allclose(fresh["loss/policy"], rows[0, "behaviour"]["loss/policy"], atol=1e-4)
    stale = rows[4, "proximal"]
    assert (np.abs(stale["policy/behaviour_weight_mean"][1:] - 1.0) > 1e-4).all()
    assert stale["policy/clipfrac"][1:].mean() < rows[4, "behaviour"]["policy/clipfrac"][1:].mean()
    assert "policy/behaviour_weight_mean" not in rows[4, "behaviour"]
