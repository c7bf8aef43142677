"""benchmarks/counting.py's settings lines show what each algorithm's learner ran with (its resolved config), not the
base config: SeqGAN-PPO-dynamic's bounds are Supplement C's (α1 = 10, β1 = 0.5, α2 = β2 = 0.2), PPO-dynamic's
the paper's REINFORCE-style ones (∞, ∞, 1, 1)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.counting import BASE_OVERRIDES, algo_lrs, resolved_settings, run_overrides  # noqa: E402
from rayseq.config import build_config, config_to_dict  # noqa: E402

OVERRIDES = [*BASE_OVERRIDES, "train.iters=7"]
GAN = [*OVERRIDES, "disc.d_steps=2"]


def _run(tmp_path: Path, algo: str, seed: int, overrides: list[str]) -> dict:
    """A run's directory with the config.yaml the benchmark's run would write."""
    run_dir = tmp_path / f"{algo}-s{seed}"
    run_dir.mkdir()
    cfg = build_config(None, run_overrides(overrides, algo, seed, run_dir))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    return {"algo": algo, "seed": seed, "run_dir": str(run_dir)}


def test_each_algorithm_shows_its_own_resolved_bounds(tmp_path):
    runs = [_run(tmp_path, "ppo_dynamic", 0, OVERRIDES), _run(tmp_path, "seqgan_ppo_dynamic", 0, GAN)]
    dyn, seqgan_dyn = resolved_settings(runs, ["ppo_dynamic", "seqgan_ppo_dynamic"], OVERRIDES)
    assert dyn.startswith("  - PPO-dynamic: ") and "alpha1 inf" in dyn and "alpha2 1," in dyn
    assert "beta1 inf" in dyn and "beta2 1," in dyn and "D:" not in dyn  # PPO-dynamic trains no discriminator
    assert seqgan_dyn.startswith("  - SeqGAN-PPO-dynamic: ")
    for key in ("alpha1 10,", "beta1 0.5,", "alpha2 0.2,", "beta2 0.2,", "use_baseline False"):
        assert key in seqgan_dyn, seqgan_dyn
    assert "; D: " in seqgan_dyn and "d_steps 2," in seqgan_dyn  # the override, as the run resolved it


def test_the_budget_line_shows_each_algorithms_own_lr():
    algos = ["seqgan", "seqgan_ppo"]
    assert algo_lrs(algos, [*GAN, "algo.lr=1e-4"]) == "lr 0.0001"
    assert algo_lrs(algos, [*GAN, "algo.lr=1e-4", "algo.seqgan_ppo.lr=1e-5"]) == "lr SeqGAN 0.0001, SeqGAN-PPO 1e-05"


def test_without_config_yaml_the_overrides_resolve_the_same(tmp_path):
    runs = [_run(tmp_path, "seqgan_ppo_dynamic", 0, GAN)]
    from_yaml = resolved_settings(runs, ["seqgan_ppo_dynamic"], GAN)
    (Path(runs[0]["run_dir"]) / "config.yaml").unlink()
    assert resolved_settings(runs, ["seqgan_ppo_dynamic"], GAN) == from_yaml


def test_seeds_that_ran_differently_are_flagged(tmp_path):
    runs = [_run(tmp_path, "seqgan", 0, GAN), _run(tmp_path, "seqgan", 1, [*GAN, "algo.lr=1e-3"])]
    (line,) = resolved_settings(runs, ["seqgan"], GAN)
    assert "NOT the same for every seed" in line


def _finished(tmp_path: Path, algo: str, overrides: list[str], curve: list[tuple[str, int, float]], iterations: int,
              pre_val: float) -> Path:
    """A finished run's files as the Trainer writes them: config.yaml, summary.json, metrics.parquet."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    run_dir = Path(_run(tmp_path, algo, 0, overrides)["run_dir"])
    test = {"test/precision": 0.9, "test/precision_sampled": 0.7, "test/y1_tv": 0.1}
    summary = {"metrics": {**test, "val/precision": curve[-1][2]}, "wall_s": 1.0, "iterations": iterations,
               "pretrain_metrics": {**test, "val/precision": pre_val},
               "details": {"y1_dist": {}, "y1_truth": {}}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    stage, it, val = zip(*curve)
    pq.write_table(pa.table({"stage": list(stage), "iteration": list(it), "val/precision": list(val)}),
                   run_dir / "metrics.parquet")
    return run_dir


def test_a_run_started_from_a_pretrained_run_curves_from_its_start(tmp_path):
    """--pretrain-once: the algorithm's run has no MLE stage, so its learning curve begins at the pretrained model's
    validation precision, at the iteration where the stage began (here after 1,000 MLE + 3 D-pretraining steps)."""
    from benchmarks.counting import collect

    curve = [("train", 1005, 0.80), ("train", 1010, 0.85)]
    run = _finished(tmp_path, "seqgan", GAN, curve, iterations=1010, pre_val=0.77)  # train.iters=7: from 1003
    c = collect(run, "seqgan", 0)["curve"]
    assert (c["stage"], c["iteration"], c["precision"]) == (["start", "train", "train"], [1003, 1005, 1010],
                                                            [0.77, 0.80, 0.85])
    # a run that did its own MLE stage already has its start on the curve: nothing is added
    (tmp_path / "own").mkdir()
    own = _finished(tmp_path / "own", "seqgan", GAN, [("mle", 1000, 0.77), ("train", 1010, 0.80)], iterations=1010,
                    pre_val=0.77)
    assert collect(own, "seqgan", 0)["curve"]["stage"] == ["mle", "train"]


def test_kept_runs_are_the_finished_ones_of_the_same_config_unless_fresh_or_pretrained_anew(tmp_path):
    from benchmarks.counting import kept_runs

    def finished(algo: str, seed: int, overrides: list[str]) -> tuple:
        d = Path(_run(tmp_path, algo, seed, overrides)["run_dir"])
        (d / "summary.json").write_text("{}")
        return algo, seed, d

    same, other, unfinished = finished("ppo", 0, OVERRIDES), finished("ppo", 1, [*OVERRIDES, "algo.lr=0.5"]), \
        finished("reinforce", 0, OVERRIDES)
    (unfinished[2] / "summary.json").unlink()
    jobs, per_seed = [same, other, unfinished], {0: OVERRIDES, 1: OVERRIDES}
    assert kept_runs(jobs, per_seed, [], None, fresh=False) == [same]
    assert kept_runs(jobs, per_seed, [], None, fresh=True) == []
    assert kept_runs(jobs, per_seed, [0], None, fresh=False) == []  # seed 0 pretrained anew


@pytest.mark.e2e
def test_a_second_run_of_the_benchmark_keeps_the_finished_runs(tmp_path, capsys):
    from benchmarks.counting import main

    argv = ["--pretrain-once", "--algos", "reinforce", "--seeds", "0", "--jobs", "1", "--out", str(tmp_path),
            "train.pretrain_iters=20", "train.iters=2", "train.eval_every=2", "task.test_size=100", "task.val_size=100"]
    summary = tmp_path / "runs" / "counting" / "reinforce-s0" / "summary.json"
    assert main(argv) == 0
    summary.write_text(summary.read_text().replace('"wall_s"', '"wall_s_marker": 1, "wall_s"', 1))
    assert main(argv) == 0
    assert "wall_s_marker" in summary.read_text()  # a rerun would have rewritten it
    assert f"kept {summary.parent} (finished, same config)" in capsys.readouterr().out
