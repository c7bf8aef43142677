"""benchmarks/gpu/run.sh on the CPU: ``--device cpu --quick`` runs the parts end to end — the kit check,
the GPU suite (``pytest -m gpu`` with RAYSEQ_TEST_DEVICE=cpu), the benchmarks, SeqGAN on a tiny oracle — so the
command the GPU machine gets cannot rot before a GPU comes; a second call skips what is done; a spent budget stops
before the next part with exit 3 and says to run the command again.

The default run takes three parts (the environment, one bench.py part, the resumable oracle runs and their report:
about 40 s on 2 cores); every part, the GPU suite's 100 s among them, is ``slow`` (5 minutes)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ["env", "smoke", "sample", "nograd", "memory", "sync", "updates", "mcq", "hf_grpo", "serve", "tests", "scaling",
         "overhead", "oracle"]
pytestmark = pytest.mark.ray


def run(out: Path, *extra: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "benchmarks/gpu/run.sh", "--device", "cpu", "--quick", "--out", str(out), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def oracle_rows(out: Path) -> list[str]:
    return [r["model"] for r in json.loads((out / "oracle.json").read_text())["rows"]]


def test_gpu_runner_on_the_cpu_runs_its_parts_skips_them_then_stops_at_the_budget(tmp_path):
    out, parts = tmp_path / "gpu", ["env", "mcq", "oracle"]
    r = run(out, "--budget", "600", "--parts", " ".join(parts))
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    assert r.stdout.rstrip().endswith(f"== all parts done: {out}")
    assert sorted(p.stem for p in out.glob("*.done")) == sorted(parts)
    assert "torch" in (out / "env.txt").read_text()
    assert json.loads((out / "mcq.json").read_text())["rows"]["cpu"]["total_s"] > 0
    assert oracle_rows(out) == ["MLE (pretrained)", "SeqGAN", "SeqGAN-PPO-dynamic"]

    again = run(out, "--parts", " ".join(parts), timeout=300)  # resumable: what is done is skipped
    assert again.returncode == 0 and again.stdout.count("done before, skipped") == len(parts), again.stdout[-3000:]

    (out / "oracle.done").unlink()
    spent = run(out, "--budget", "0", "--parts", "oracle hf_grpo", timeout=300)  # stops before the next part
    assert spent.returncode == 3 and "run the same command again" in spent.stdout
    assert not (out / "oracle.done").exists() and not (out / "hf_grpo.done").exists()


@pytest.mark.slow
def test_gpu_runner_on_the_cpu_runs_every_part_then_skips_them(tmp_path):
    out = tmp_path / "gpu"
    r = run(out, "--budget", "1400")
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    assert r.stdout.rstrip().endswith(f"== all parts done: {out}")
    assert all((out / f"{p}.done").exists() for p in PARTS)
    assert "torch" in (out / "env.txt").read_text()
    for name in ("smoke", "tests"):
        log = (out / f"{name}.log").read_text()
        assert " passed" in log and " failed" not in log and (out / f"{name}.rc").read_text().strip() == "0"
    for part in ("sample", "nograd", "sync"):
        assert json.loads((out / f"{part}.json").read_text())["rows"], part
    assert [r["error"] for r in json.loads((out / "sync.json").read_text())["rows"]][:2] == ["", ""]
    memory = json.loads((out / "learner_memory_vocab_quick.json").read_text())["runs"]
    assert memory and all(r["update_mb"] > 0 for r in memory)
    updates = json.loads((out / "updates.json").read_text())
    assert updates["device"] == "cpu" and all(r["cpu_s"] > 0 and r["device_s"] > 0 for r in updates["rows"])
    assert (out / "updates.png").stat().st_size > 0
    assert json.loads((out / "mcq.json").read_text())["rows"]["cpu"]["total_s"] > 0
    assert json.loads((out / "hf_grpo.json").read_text())["rows"]["cpu"]["steps_per_s"] > 0
    serve = json.loads((out / "serve_load_quick.json").read_text())
    assert serve["settings"]["device"] == "cpu"
    assert json.loads((out / "scaling.json").read_text())["workers"] == [1, 2]
    assert (out / "ray_overhead.json").exists()
    assert oracle_rows(out) == ["MLE (pretrained)", "SeqGAN", "SeqGAN-PPO-dynamic"]

    again = run(out, timeout=300)  # resumable: what is done is skipped
    assert again.returncode == 0, again.stdout[-3000:]
    assert again.stdout.count("done before, skipped") == len(PARTS)

    for p in ("oracle", "overhead"):
        (out / f"{p}.done").unlink()
    spent = run(out, "--budget", "0", timeout=300)  # the budget stops it before the next part
    assert spent.returncode == 3 and "run the same command again" in spent.stdout
    assert not (out / "overhead.done").exists()


def test_gpu_runner_refuses_a_bad_option():
    r = subprocess.run(["bash", "benchmarks/gpu/run.sh", "--device", "tpu"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "--device cuda or cpu" in r.stderr
