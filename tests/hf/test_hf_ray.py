"""model.arch=hf on the real Ray path: the learner, a rollout worker and a scorer actor each build the model from
model.path, the learner's trained weights reach the worker (once per version), and a run on actors equals the
in-process run (same seed: same rollouts, rewards and updates)."""

from __future__ import annotations

import pytest

from rayseq.distributed.groups import ActorGroups
from tests.hf.test_hf_training import hf_config
from tests.parity import assert_same_metrics, runs_in_process_and_on_a_worker

pytestmark = pytest.mark.ray

ACTORS = ["rollout.num_cpus_per_worker=0.5", "scorer.num_scorers=1", "scorer.num_cpus_per_scorer=0.5",
          "learner.num_cpus=0.5"]


def test_weights_reach_the_worker(ray_session, corpus, hf_dir):
    """The learner's trained weights reach the worker's model (LoRA's adapters-only publication:
    tests/hf/test_hf_training.py::test_lora_trains_adapters_only)."""
    cfg = hf_config(corpus, hf_dir, "rollout.num_workers=1", *ACTORS)
    groups = ActorGroups(cfg)
    try:
        groups.rollout.sync_weights()  # version 0
        weights = groups.learner.get_weights()["generator"]
        assert weights and all(k.startswith("model.") for k in weights)
        learner_sum = sum(float(v.double().sum()) for v in weights.values())
        (stats,) = groups.rollout.stats()
        assert stats["version"] == 0 and stats["loads"] == 1
        assert stats["checksum"] == pytest.approx(learner_sum, rel=1e-9)
    finally:
        groups.shutdown()


# full fine-tuning's weights on the worker in the default run: test_weights_reach_the_worker
@pytest.mark.parametrize(("algo", "lora_r"), [pytest.param("ppo_dynamic", 0, marks=pytest.mark.slow), ("grpo", 4)])
def test_ray_run_matches_in_process_run(ray_session, corpus, hf_dir, tmp_path, algo, lora_r):
    """PPO-dynamic (full fine-tuning) / GRPO (LoRA adapters: only they are published to the worker) with the KL
    penalty and a user reward scored on the scorer actor."""
    a, b = runs_in_process_and_on_a_worker(
        lambda n, run_dir: hf_config(corpus, hf_dir, f"rollout.num_workers={n}", f"algo.name={algo}",
                                     "algo.kl_coef=0.05", f"model.lora_r={lora_r}", "algo.lr=0.01",
                                     "reward.fn=tests.hf_fixtures:logged_text",
                                     f"reward.kwargs={{log: '{tmp_path / 'log'}'}}", *ACTORS, run_dir=run_dir),
        tmp_path)
    assert_same_metrics(a, b, ("loss/nll", "rollout/reward_mean", "loss/policy", "kl/per_reply", "val/reward"),
                        rtol=1e-4, atol=1e-5)
    train = b[b.stage == "train"]
    assert (train["rollout/staleness"] == 0).all() and train["rollout/reward_mean"].notna().all()
