"""Checkpoints written before algorithms owned their modules still resume, to the same result.

Each fixture (tests/fixtures/checkpoints_v1, written by that code: its ``make.py`` says how) is a run stopped
part-way, with the learner's discriminator, its optimizer and version, G_β or critic at the top level of its learner
state and the algorithm's own pretraining stage called ``disc``, and what that code made of resuming it: every
metrics row, the final metrics and a SHA-256 of every checkpoint entry. Resumed here, the run must end with the same
rows and the same bytes.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from benchmarks.bitwise_check import tensor_hashes
from rayseq.algos.iteration import stage_name
from rayseq.checkpoint import load_checkpoint
from rayseq.config import build_config
from rayseq.distributed.driver import Trainer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints_v1"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").is_file())


def _row(row: dict) -> dict:
    """A metrics row as compared: no timings, NaN as a string, the stage by its current name."""
    out = {k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()
           if v is not None and not k.startswith("time/")}
    return {**out, "stage": stage_name(out["stage"])}


def test_the_fixtures_are_old_checkpoints():
    """What makes them old: the algorithm's entries at the top level and (one of them) the old stage name."""
    assert set(CASES) == {"actor_critic_train", "seqgan_critic_pretrain", "seqgan_ppo_dynamic_train"}
    tops = {}
    for name in CASES:
        (ck_file,) = (FIXTURES / name / "run" / "checkpoints").glob("*.pt")
        ck = load_checkpoint(str(ck_file))
        tops[name] = ck
        assert "algo" not in ck["learner"] or "disc" not in ck["learner"]["algo"]
    assert {"disc", "disc_opt", "disc_version", "rollout_policy"} <= set(tops["seqgan_ppo_dynamic_train"]["learner"])
    assert {"critic", "critic_opt"} <= set(tops["actor_critic_train"]["learner"])
    assert tops["seqgan_critic_pretrain"]["driver"]["stage"] == "disc"
    assert tops["seqgan_critic_pretrain"]["learner"]["stage"] == "disc"


@pytest.mark.parametrize("name", CASES)
def test_an_old_checkpoint_resumes_to_the_same_run(tmp_path, name):
    expected = json.loads((FIXTURES / name / "expected.json").read_text())
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURES / name / "run", run_dir)
    cfg = build_config(None, [*expected["overrides"], f"train.iters={expected['resume_iters']}", f"run_dir={run_dir}",
                              "train.keep_checkpoints=20"])
    summary = Trainer(cfg, resume=True).run()

    rows = [_row(r) for r in pq.read_table(run_dir / "metrics.parquet").to_pylist()]
    old = [_row(r) for r in expected["rows"]]
    # the driver now counts every iteration (rollout/worker_restarts in pretraining rows too); and the evaluation's
    # sampled replies are now drawn per chunk of the evaluation batch, each chunk seeded on its own (so that rollout
    # workers can share them: rayseq.tasks.evaluation), which changes the figures of sampled replies on a split of
    # more than one chunk (val: 2,000 counting inputs, two chunks); nothing else differs
    resampled = {"val/reward", "val/precision_sampled"}
    assert [{k: v for k, v in r.items() if (k in o or k != "rollout/worker_restarts") and k not in resampled}
            for r, o in zip(rows, old)] == [{k: v for k, v in o.items() if k not in resampled} for o in old]
    final = {k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in summary["metrics"].items()}
    assert {k: v for k, v in final.items() if k not in resampled} == \
        {k: v for k, v in expected["final"].items() if k not in resampled}
    hashes = tensor_hashes(load_checkpoint(summary["checkpoint"]))
    # every entry, but the value baseline where the algorithm's update never reads it (its critic takes that place):
    # the old code kept one for every algorithm, this one keeps none there
    unread = {"learner.baseline", "learner.base_opt"} if name.startswith(("actor_critic", "seqgan_critic")) else set()
    assert hashes == {k: v for k, v in expected["tensors"].items() if k not in unread}
    # and the checkpoint it writes now keeps the algorithm's entries under ``algo``
    learner = load_checkpoint(summary["checkpoint"])["learner"]
    assert "algo" in learner and not {"disc", "critic", "rollout_policy"} & set(learner)
