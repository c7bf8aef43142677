"""Pipelined rollouts (``rollout.pipeline=true``) in-process: batch k+1 is sampled with the weights
before update k (staleness 1), the ratio algorithms correct with the behaviour log-probs recorded at sampling, and
algorithms without such a ratio are refused."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayseq.config import ConfigError, check_pipeline
from rayseq.distributed.driver import Trainer
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


def test_the_last_iteration_samples_no_batch_that_nobody_uses(tmp_path):
    calls = []

    def report(row, trainer):
        calls.append(trainer.carry.next is None)

    cfg = tiny_config("rollout.num_workers=0", "rollout.pipeline=true", *ONE_STEP, run_dir=tmp_path / "r")
    Trainer(cfg, report=report).run()
    assert calls[-1] and not any(calls[-5:-1])  # in flight after every train iteration but the last


@pytest.mark.parametrize("name", ["ppo", "ppo_dynamic", "grpo", "grpo_dynamic", "mixer_ppo", "mixer_ppo_dynamic"])
def test_ratio_algorithms_accept_the_pipeline(name):
    assert tiny_config("rollout.pipeline=true", f"algo.name={name}").rollout.pipeline


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
    assert f"rollout.pipeline=true: algo.name={name} cannot train on pipelined rollouts ({why}" in msg
    assert msg.endswith("use one of mixer_ppo, mixer_ppo_dynamic, ppo, ppo_dynamic, grpo, grpo_dynamic or "
                        "rollout.pipeline=false")


def test_a_ratio_algorithm_whose_requests_carry_learner_state_refuses_the_pipeline():
    from rayseq.algos import PPO

    class Annealed(PPO):  # e.g. a ratio algorithm whose request reads a λ the learner anneals
        stateful_request = True

    with pytest.raises(ValueError, match=r"algo.name=annealed cannot train on pipelined rollouts \(its rollout "
                                         r"requests depend on the learner's state at sampling time\)"):
        check_pipeline(Annealed, "annealed")
