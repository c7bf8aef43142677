"""A reward model trained by sharded learners (``learner.strategy=fsdp``: its head in the checkpoint's shards, not in
the learner's whole files) is read back whole wherever a run's reward model is used: as a reward term's scorer, by
the export and by a checkpoint's evaluation (a search's best trial's test figures)."""

from __future__ import annotations

import pytest
import torch

from rayseq.config import build_config
from rayseq.distributed.driver import Trainer
from tests.algos.test_reward_model import RM
from tests.reward_fixtures_prefs import preference_rows, write_jsonl


@pytest.mark.ray
def test_a_sharded_reward_model_scores_as_one_learners(ray_session, tmp_path):
    from rayseq.rewards.trained import load_scorer

    prefs = write_jsonl(tmp_path / "prefs.jsonl", preference_rows(120))
    runs, summaries = {}, {}
    for name, extra in {"one": [], "sharded": ["learner.num_learners=2", "learner.strategy=fsdp",
                                               "rollout.num_workers=1"]}.items():
        runs[name] = tmp_path / name
        summaries[name] = Trainer(build_config(None, [*RM, f"task.data={prefs}", "train.iters=3", "train.eval_every=3",
                                    "train.checkpoint_every=3", f"run_dir={runs[name]}", *extra])).run()
    scorers = {k: load_scorer(v) for k, v in runs.items()}
    torch.testing.assert_close(scorers["sharded"].head.weight, scorers["one"].head.weight, rtol=1e-5, atol=1e-6)
    rows = preference_rows(6, seed=3)
    queries = [r["prompt"] + " " + r["chosen"] for r in rows]
    prompts = [r["prompt"] + " " for r in rows]
    one, sharded = (scorers[k].score(queries, prompts) for k in ("one", "sharded"))
    assert sharded == pytest.approx(one, rel=1e-4, abs=1e-5)

    from rayseq.distributed.actors.learner import evaluate_checkpoint

    for name, run in runs.items():  # the closing test figures of the run, from its last checkpoint
        figures = evaluate_checkpoint(str(run), "test")[0]
        assert set(figures) == {"test/accuracy", "test/margin", "test/loss", "test/accuracy_longer"}
        for key, value in figures.items():
            assert value == pytest.approx(summaries[name]["metrics"][key], rel=1e-4, abs=1e-6), (name, key)
