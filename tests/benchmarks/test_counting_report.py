"""benchmarks/counting.py's settings lines show what each algorithm's learner ran with (its resolved config), not the
base config: SeqGAN-PPO-dynamic's bounds are Supplement C's (α1 = 10, β1 = 0.5, α2 = β2 = 0.2), PPO-dynamic's
the paper's REINFORCE-style ones (∞, ∞, 1, 1)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.counting import BASE_OVERRIDES, resolved_settings  # noqa: E402
from rayseq.config import build_config, config_to_dict  # noqa: E402

OVERRIDES = [*BASE_OVERRIDES, "train.iters=7"]
GAN = [*OVERRIDES, "disc.d_steps=2"]


def _run(tmp_path: Path, algo: str, seed: int, overrides: list[str]) -> dict:
    run_dir = tmp_path / f"{algo}-s{seed}"
    run_dir.mkdir()
    cfg = build_config(None, [*overrides, f"algo.name={algo}", f"seed={seed}"])
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


def test_without_config_yaml_the_overrides_resolve_the_same(tmp_path):
    runs = [_run(tmp_path, "seqgan_ppo_dynamic", 0, GAN)]
    from_yaml = resolved_settings(runs, ["seqgan_ppo_dynamic"], GAN)
    (Path(runs[0]["run_dir"]) / "config.yaml").unlink()
    assert resolved_settings(runs, ["seqgan_ppo_dynamic"], GAN) == from_yaml


def test_seeds_that_ran_differently_are_flagged(tmp_path):
    runs = [_run(tmp_path, "seqgan", 0, GAN), _run(tmp_path, "seqgan", 1, [*GAN, "algo.lr=1e-3"])]
    (line,) = resolved_settings(runs, ["seqgan"], GAN)
    assert "NOT the same for every seed" in line
