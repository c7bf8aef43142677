"""TRL as a peer: the same GRPO setup trained by Hugging Face TRL's GRPOTrainer, by rayseq in-process and by rayseq
on Ray with 2 rollout workers, on one tiny local GPT-2 (issue 28 item 5).

Run book (from the repository root; needs the peers extra: pip install -e ".[hf,peers]")
  python benchmarks/trl_peer.py                      # 2 seeds × batches 8 and 64 × 3 methods, interleaved
  python benchmarks/trl_peer.py --quick              # smoke test: seed 0, batch 8, 6 steps, *_quick files
  python benchmarks/trl_peer.py --steps 300 --seeds 0 1 2
  python benchmarks/trl_peer.py --report-only        # tables and plot again from runs/trl_peer/*.json
Finished runs (runs/trl_peer/trl_peer-<method>-b<batch>-s<seed>.json) are reused; --fresh reruns them.

What is the same for the three: the model (a 2-layer GPT-2, hidden 32, with a byte-level BPE tokenizer of 400
tokens, both built here as tests/hf_fixtures.py builds them: nothing is downloaded), the training prompts (the
first chit-chat messages, prepared prompt-only by ``python -m rayseq.data prepare``; TRL gets the same train
split), the reward (:func:`vowel_share`, one function on TRL's keyword protocol that both call), group size G = 4,
completions of at most 12 tokens (the end token included), temperature 1, the learning rate, Adam without weight
decay at a constant rate, gradient norm clipped at 1, β = 0 (no KL term, no reference model), one gradient step per
batch of B completions (B / 4 prompts), the token-mean surrogate (TRL ``loss_type="dapo"``, the normalisation
rayseq's GRPO uses), advantages (r − mean_group) / std_group, and one torch thread per process.

Each (seed, batch, method) is its own process, run one after another in the order seed → batch → method, so the
methods alternate under whatever else loads the machine. Seconds per step: the wall time between the ends of
consecutive steps (TRL: ``on_step_end``; rayseq: its per-iteration report), the median over the steps after the
first ``--warmup``, then the median over seeds; completions per second = B / that. Start-up (imports, model
building, Ray and its actors) is apart. Reward: the mean reward of each step's sampled completions.

Outputs in ``--out`` (default benchmarks/results): trl_peer.md / .json (every run's per-step times and rewards),
trl_peer.png (reward against steps and against seconds, per batch size); runs under runs/trl_peer/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

METHODS = ("trl", "rayseq", "rayseq_ray")
LABELS = {"trl": "TRL GRPOTrainer", "rayseq": "rayseq in-process", "rayseq_ray": "rayseq on Ray, 2 workers"}
GROUP, COMPLETION_LEN, LR, N_PROMPTS = 4, 12, 3e-3, 256
VOWELS = frozenset("aeiou")


def vowel_share(completions, **kwargs):
    """The share of a completion's letters that are vowels (0 without letters): dense, and learnable by emitting
    vowel-only tokens. TRL's keyword protocol, so TRL and rayseq call the very same function."""
    out = []
    for c in completions:
        letters = [ch for ch in c.lower() if ch.isalpha()]
        out.append(sum(ch in VOWELS for ch in letters) / len(letters) if letters else 0.0)
    return out


# ------------------------------------------------------------------------------------------------- setup


def setup(work: Path) -> tuple[Path, Path]:
    """The tiny model folder and the prepared prompt-only dataset (made once)."""
    from rayseq.data import PrepareOptions, prepare
    from tests.hf_fixtures import chitchat_lines, make_tiny_hf

    model, data = work / "tiny-gpt2", work / "data"
    if not (model / "config.json").is_file():
        make_tiny_hf(model)
    if not (data / "manifest.json").is_file():
        prompts = list(dict.fromkeys(chitchat_lines(2 * N_PROMPTS)))[:N_PROMPTS]
        src = work / "prompts.jsonl"
        src.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
        prepare(f"jsonl:{src}", data, PrepareOptions(quiet=True, max_src_len=64, max_tgt_len=COMPLETION_LEN - 1,
                                                     valid_frac=0.02, test_frac=0.02))
    return model, data


# --------------------------------------------------------------------------------------------- one run


def run_trl(model: Path, data: Path, batch: int, seed: int, steps: int, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rayseq.data import DialogueData

    torch.set_num_threads(1)
    prompts = DialogueData.load(data).splits["train"].prompts
    ends, rewards = [], []

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    args = GRPOConfig(output_dir=str(work / "trl_out"), per_device_train_batch_size=batch, num_generations=GROUP,
                      max_completion_length=COMPLETION_LEN, temperature=1.0, learning_rate=LR, beta=0.0,
                      loss_type="dapo", scale_rewards="group", lr_scheduler_type="constant", weight_decay=0.0,
                      max_grad_norm=1.0, max_steps=steps, logging_steps=1, report_to="none", save_strategy="no",
                      use_cpu=True, seed=seed, disable_tqdm=True, dataloader_num_workers=0)
    t0 = time.perf_counter()
    GRPOTrainer(model=str(model), reward_funcs=vowel_share, args=args,
                train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
                processing_class=AutoTokenizer.from_pretrained(str(model), local_files_only=True),
                callbacks=[Record()]).train()
    return timings(t0, ends, rewards)


def timings(t0: float, ends: list[float], rewards: list[float]) -> dict:
    """Start-up = until the first step ended (building the trainer, Ray's actors, the first step); the step ends
    after it, in seconds from it, so that every method's clock starts at its first step's end."""
    return {"startup_s": ends[0] - t0, "step_ends": [e - ends[0] for e in ends], "rewards": rewards}


def run_rayseq(model: Path, data: Path, batch: int, seed: int, steps: int, work: Path, workers: int) -> dict:
    import torch

    from rayseq.config import build_config
    from rayseq.distributed.driver import Trainer

    torch.set_num_threads(1)
    ends, rewards = [], []

    def record(row, trainer):
        if row.get("stage") == "train":
            ends.append(time.perf_counter())
            rewards.append(float(row["rollout/reward_mean"]))

    actors = ["rollout.num_cpus_per_worker=0.5", "scorer.num_cpus_per_scorer=0.5", "learner.num_cpus=0.5"]
    cfg = build_config(None, [
        "task.name=pairs", f"task.data={data}", "task.val_size=4", "task.test_size=100", "model.arch=hf",
        f"model.path={model}", "algo.name=grpo", f"algo.group_size={GROUP}", f"train.batch_size={batch}",
        f"algo.minibatch_size={batch}", "algo.epochs=1", f"algo.lr={LR}", "algo.kl_coef=0", "algo.max_grad_norm=1.0",
        "train.pretrain_iters=0", f"train.iters={steps}", "train.eval_every=0", "reward.fn=benchmarks.trl_peer:"
        "vowel_share", f"seed={seed}", "progress=false", f"rollout.num_workers={workers}",
        f"run_dir={work / 'run'}", *(actors if workers else [])])
    t0 = time.perf_counter()
    Trainer(cfg, report=record).run()
    return timings(t0, ends, rewards)


def one(method: str, batch: int, seed: int, steps: int, root: Path) -> dict:
    work = root / f"{method}-b{batch}-s{seed}"
    shutil.rmtree(work, ignore_errors=True)  # a fresh run directory each time
    work.mkdir(parents=True)
    model, data = setup(root)
    if method == "trl":
        out = run_trl(model, data, batch, seed, steps, work)
    else:
        out = run_rayseq(model, data, batch, seed, steps, work, workers=2 if method == "rayseq_ray" else 0)
    return {"method": method, "batch": batch, "seed": seed, "steps": steps, **out}


# ------------------------------------------------------------------------------------------------ report


def step_seconds(run: dict, warmup: int) -> list[float]:
    """Seconds of steps warmup+1.. (step 1 is in the start-up)."""
    ends = run["step_ends"]
    return [b - a for a, b in zip(ends[:-1], ends[1:])][max(warmup - 1, 0):]


def summarise(runs: list[dict], warmup: int, last: int = 10) -> dict:
    """Per (batch, method): median over seeds of (median step seconds), completions/s, final reward."""
    out: dict = {}
    for r in runs:
        s = out.setdefault(str(r["batch"]), {}).setdefault(r["method"], {"step_s": [], "final_reward": [],
                                                                          "startup_s": []})
        s["step_s"].append(statistics.median(step_seconds(r, warmup)))
        s["final_reward"].append(statistics.mean(r["rewards"][-last:]))
        s["startup_s"].append(r["startup_s"])
    for batch, methods in out.items():
        for m in methods.values():
            m["median_step_s"] = statistics.median(m["step_s"])
            m["completions_per_s"] = int(batch) / m["median_step_s"]
            m["median_final_reward"] = statistics.median(m["final_reward"])
    return out


def table(summary: dict, runs: list[dict], warmup: int, load: list[float]) -> str:
    lines = ["| batch (completions) | method | ms / step (median; per seed) | completions / s | vs TRL | "
             "reward, last 10 steps (median; per seed) | start-up s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for batch in sorted(summary, key=int):
        ms = summary[batch]
        trl = ms.get("trl")
        for m in METHODS:
            if m not in ms:
                continue
            s = ms[m]
            ratio = f"{s['completions_per_s'] / trl['completions_per_s']:.2f}×" if trl else ""
            lines.append(f"| {batch} | {LABELS[m]} | {1000 * s['median_step_s']:.1f} "
                         f"({', '.join(f'{1000 * x:.1f}' for x in s['step_s'])}) | {s['completions_per_s']:.0f} | "
                         f"{ratio} | {s['median_final_reward']:.3f} "
                         f"({', '.join(f'{x:.3f}' for x in s['final_reward'])}) | "
                         f"{statistics.median(s['startup_s']):.1f} |")
        if "rayseq" in ms and "rayseq_ray" in ms:
            lines.append(f"| {batch} | Ray / in-process step time | "
                         f"{ms['rayseq_ray']['median_step_s'] / ms['rayseq']['median_step_s']:.2f}× | | | | |")
    steps = runs[0]["steps"] if runs else 0
    lines.append("")
    lines.append(f"{steps} steps per run, medians over steps {warmup + 1}..{steps} of each run, then over seeds "
                 f"{sorted({r['seed'] for r in runs})}; load average while measuring: "
                 f"{min(load):.1f}–{max(load):.1f} (`uptime`, {os.cpu_count()} cores).")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in runs})
    fig, axes = plt.subplots(len(batches), 2, figsize=(11, 3.6 * len(batches)), squeeze=False)
    colors = {"trl": "tab:red", "rayseq": "tab:blue", "rayseq_ray": "tab:green"}
    for i, b in enumerate(batches):
        for r in (r for r in runs if r["batch"] == b):
            label = f"{LABELS[r['method']]} s{r['seed']}"
            n = min(len(r["rewards"]), len(r["step_ends"]))
            axes[i][0].plot(range(1, n + 1), r["rewards"][:n], color=colors[r["method"]], alpha=0.7, label=label)
            axes[i][1].plot(r["step_ends"][:n], r["rewards"][:n], color=colors[r["method"]], alpha=0.7, label=label)
        axes[i][0].set(xlabel="step", ylabel="mean reward of the step's completions", title=f"batch {b}: per step")
        axes[i][1].set(xlabel="seconds after the first step", title=f"batch {b}: per second")
        axes[i][1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--warmup", type=int, default=10, help="first steps left out of the medians")
    ap.add_argument("--quick", action="store_true", help="seed 0, batch 8, 6 steps; *_quick outputs")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--runs", type=Path, default=REPO / "runs" / "trl_peer")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--fresh", action="store_true", help="rerun runs whose results exist")
    ap.add_argument("--one", nargs=3, metavar=("METHOD", "BATCH", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.batches, args.steps, args.warmup = [0], [8], 6, 2
    name = "trl_peer_quick" if args.quick else "trl_peer"
    if args.one:  # a child process: one run, its JSON on stdout's last line
        method, batch, seed = args.one[0], int(args.one[1]), int(args.one[2])
        print(json.dumps(one(method, batch, seed, args.steps, args.runs)))
        return 0
    args.runs.mkdir(parents=True, exist_ok=True)
    setup(args.runs)
    results, load = [], []
    for seed in args.seeds:
        for batch in args.batches:
            for method in args.methods:
                path = args.runs / f"{name}-{method}-b{batch}-s{seed}.json"
                if not args.report_only and not (path.is_file() and not args.fresh):  # finished runs are reused
                    load.append(os.getloadavg()[0])
                    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                           "TOKENIZERS_PARALLELISM": "false"}
                    t0 = time.time()
                    for _attempt in range(2):  # once more if Ray's node did not start on an overloaded machine
                        proc = subprocess.run([sys.executable, __file__, "--one", method, str(batch), str(seed),
                                               "--steps", str(args.steps), "--runs", str(args.runs)],
                                              capture_output=True, text=True, env=env, cwd=REPO)
                        if "timed out during startup" not in proc.stderr:
                            break
                    if proc.returncode:
                        print(proc.stderr[-4000:], file=sys.stderr)
                        return 1
                    path.write_text(proc.stdout.strip().splitlines()[-1] + "\n")
                    print(f"{method:10s} batch {batch:3d} seed {seed}: {time.time() - t0:.0f} s", file=sys.stderr)
                if path.is_file():  # --report-only: the runs finished so far
                    results.append(json.loads(path.read_text()))
    load = load or [float("nan")]
    summary = summarise(results, args.warmup)
    write_report(args.out, name, table(summary, results, args.warmup, load),
                 {"summary": summary, "runs": results, "load_average": load, "warmup": args.warmup,
                  "settings": {"group": GROUP, "completion_len": COMPLETION_LEN, "lr": LR, "prompts": N_PROMPTS}})
    plot(results, args.out / f"{name}.png")
    return 0


from benchmarks._report import write_report  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
