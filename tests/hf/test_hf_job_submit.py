"""model.arch=hf through `ray job submit` on a token-authenticated local head (tests/deploy/test_job_submit.py's):
GRPO with a user reward on text, then `--resume` of that run for more iterations, and PPO-dynamic with the
hf_classifier reward on the scorer actor; the result loads for serving."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from rayseq.checkpoint import list_checkpoints
from rayseq.serving.model import ChatModel, GenRequest
from tests.deploy.local_cluster import submit_job as submit

pytestmark = pytest.mark.ray

# learner + 1 worker + 1 scorer = 1.5 of the 2 CPUs the test head offers
ACTORS = ["rollout.num_workers=1", "rollout.num_cpus_per_worker=0.5", "scorer.num_scorers=1",
          "scorer.num_cpus_per_scorer=0.5", "learner.num_cpus=0.5"]


def _args(corpus, hf_dir, run_dir, *extra) -> list[str]:
    return ["python", "-m", "rayseq.train", "task.name=pairs", f"task.data={corpus}", "task.test_size=100",
            "task.val_size=10", "model.arch=hf", f"model.path={hf_dir}", "train.pretrain_iters=2",
            "train.pretrain_batch_size=8", "train.batch_size=8", "train.eval_every=2", "algo.kl_coef=0.05",
            "progress=false", f"run_dir={run_dir}", *ACTORS, *extra]


def test_grpo_with_a_user_reward_then_resume(ray_head, corpus, hf_dir, tmp_path):
    address, env = ray_head
    run_dir, log = tmp_path / "grpo", tmp_path / "calls.jsonl"
    reward = ["reward.fn=tests.hf_fixtures:logged_text", f"reward.kwargs={{log: '{log}'}}"]
    r = submit(address, env, *_args(corpus, hf_dir, run_dir, "algo.name=grpo", "train.iters=2", *reward))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algo"] == "grpo" and summary["iterations"] == 4 and summary["rollout_workers"] == 1
    assert log.read_text().count("\n") >= 2 * 8  # the user reward saw every rollout (on the scorer actor)
    assert list((run_dir / "checkpoints").glob("ckpt_*.safetensors"))
    r = submit(address, env, *_args(corpus, hf_dir, run_dir, "algo.name=grpo", "train.iters=4", *reward),
               "--resume")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert [row["iteration"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert list_checkpoints(run_dir)[-1].endswith("ckpt_00000006.pt")
    model = ChatModel(run_dir)  # what `python -m rayseq.serve --checkpoint RUN` serves
    assert model.info["iteration"] == 6
    assert isinstance(model.generate([GenRequest("hi there", max_tokens=5)])[0].replies[0], str)


@pytest.mark.slow  # the classifier reward: tests/hf/test_hf_classifier.py; HF as a job: the test above
def test_ppo_dynamic_with_the_classifier_reward(ray_head, corpus, hf_dir, classifier_dir, tmp_path):
    address, env = ray_head
    run_dir = tmp_path / "ppo"
    r = submit(address, env, *_args(corpus, hf_dir, run_dir, "algo.name=ppo_dynamic", "train.iters=2",
                                    "reward.fn=hf_classifier",
                                    f"reward.kwargs={{path: '{classifier_dir}', label: lively}}"))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["algo"] == "ppo_dynamic" and summary["iterations"] == 4
    rows = [row for row in pq.read_table(run_dir / "metrics.parquet").to_pylist() if row["stage"] == "train"]
    assert len(rows) == 2 and all(0 < row["rollout/reward_mean"] < 1 for row in rows)
