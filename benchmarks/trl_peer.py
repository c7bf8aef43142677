"""TRL as a peer: the same GRPO setup trained by Hugging Face TRL's GRPOTrainer, by rayseq in-process and by rayseq
on Ray with 2 rollout workers, on one tiny local GPT-2.

Run book (from the repository root; needs the peers extra: pip install -e ".[hf,peers]")
  python benchmarks/trl_peer.py                      # 5 rounds × batches 8 and 64 × 4 methods, interleaved
  python benchmarks/trl_peer.py --quick              # smoke test: one round, batch 8, 6 steps, *_quick files
  python benchmarks/trl_peer.py --steps 300 --seeds 0 1 2
  python benchmarks/trl_peer.py --methods trl rayseq --batches 64    # the in-process pair only
  python benchmarks/trl_peer.py --report-only        # tables and plot again from runs/trl_peer/*.json
Finished runs (runs/trl_peer/trl_peer-<method>-b<batch>-s<seed>.json) are reused; --fresh reruns them.

What is the same for all: the model (a 2-layer GPT-2, hidden 32, with a byte-level BPE tokenizer of 400 tokens, both
built here as tests/hf_fixtures.py builds them: nothing is downloaded), the training prompts (the first chit-chat
messages, prepared prompt-only by ``python -m rayseq.data prepare``; TRL gets the same train split), the reward
(:func:`vowel_share`, one function on TRL's keyword protocol that both call), group size G = 4, completions of at most
12 tokens (the end token included), temperature 1, the learning rate, Adam without weight decay at a constant rate,
gradient norm clipped at 1, β = 0 (no KL term, no reference model), one gradient step per batch of B completions
(B / 4 prompts), the token-mean surrogate (TRL ``loss_type="dapo"``, the normalisation rayseq's GRPO uses),
advantages (r − mean_group) / std_group, float32 weights and arithmetic, and one torch thread per process (each run
records the thread count and precision its timed steps ran with).

Each system at its best on a CPU: TRL's defaults are made for GPUs — ``bf16=True`` (every forward pass under a
bfloat16 autocast) and ``gradient_checkpointing=True`` (every forward pass recomputed in the backward pass). On a
CPU both cost time and buy nothing for a model of this size; how much depends on the CPU (bfloat16 matrix products
are emulated where it has no native bfloat16 instructions). The method ``trl`` turns both off, the arithmetic rayseq
runs; ``trl_defaults`` keeps TRL's defaults, to show what they cost on the machine at hand.

Rounds: each seed is one round, and a round runs every (batch, method) once, each in its own process, one after
another; the methods' order rotates from round to round, so that neither slow nor fast periods of the machine fall
on one method. Seconds per step: the wall time between the ends of consecutive steps (TRL: ``on_step_end``; rayseq:
its per-iteration report), the median over the steps after the first ``--warmup``; a method's figure is the median
of that over the rounds, and its ratio to TRL is the median over the rounds of the ratio within the round (both
measured minutes apart). Completions per second = B / step time. Start-up (imports, model building, Ray and its
actors, the first step) is apart. Reward: the mean reward of each step's sampled completions.

Outputs in ``--out`` (default benchmarks/results): trl_peer.md / .json (every run's per-step times and rewards),
trl_peer.png (reward against steps and against seconds, and each round's step time, per batch size); runs under
runs/trl_peer/.
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

METHODS = ("trl", "trl_defaults", "rayseq", "rayseq_ray")
LABELS = {"trl": "TRL GRPOTrainer (fp32)", "trl_defaults": "TRL GRPOTrainer, its GPU defaults",
          "rayseq": "rayseq in-process", "rayseq_ray": "rayseq on Ray, 2 workers"}
GROUP, COMPLETION_LEN, LR, N_PROMPTS = 4, 12, 3e-3, 256
VOWELS = frozenset("aeiou")
# TRL's defaults that a CPU run pays for: bfloat16 autocast over every forward pass, and activation checkpointing
# (every forward pass run again in the backward pass). ``trl`` turns them off; ``trl_defaults`` keeps them.
TRL_CPU = {"bf16": False, "gradient_checkpointing": False}


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


def run_trl(model: Path, data: Path, batch: int, seed: int, steps: int, work: Path, defaults: bool = False) -> dict:
    """TRL's GRPOTrainer for ``steps`` steps: in float32 without activation checkpointing, or with TRL's own
    defaults (``defaults=True``: bfloat16 autocast, gradient checkpointing)."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rayseq.data import DialogueData

    torch.set_num_threads(1)
    prompts = DialogueData.load(data).splits["train"].prompts
    ends, rewards, seen = [], [], {}

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            ends.append(time.perf_counter())
            if not seen:  # what the timed steps run with
                seen.update(torch_threads=torch.get_num_threads(), weights=str(next(model.parameters()).dtype),
                            autocast="bfloat16" if args.bf16 else "none",
                            gradient_checkpointing=bool(args.gradient_checkpointing))

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    args = GRPOConfig(output_dir=str(work / "trl_out"), per_device_train_batch_size=batch, num_generations=GROUP,
                      max_completion_length=COMPLETION_LEN, temperature=1.0, learning_rate=LR, beta=0.0,
                      loss_type="dapo", scale_rewards="group", lr_scheduler_type="constant", weight_decay=0.0,
                      max_grad_norm=1.0, max_steps=steps, logging_steps=1, report_to="none", save_strategy="no",
                      use_cpu=True, seed=seed, disable_tqdm=True, dataloader_num_workers=0,
                      **({} if defaults else TRL_CPU))
    t0 = time.perf_counter()
    GRPOTrainer(model=str(model), reward_funcs=vowel_share, args=args,
                train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
                processing_class=AutoTokenizer.from_pretrained(str(model), local_files_only=True),
                callbacks=[Record()]).train()
    return {**timings(t0, ends, rewards), "ran_with": seen}


def timings(t0: float, ends: list[float], rewards: list[float]) -> dict:
    """Start-up = until the first step ended (building the trainer, Ray's actors, the first step); the step ends
    after it, in seconds from it, so that every method's clock starts at its first step's end."""
    return {"startup_s": ends[0] - t0, "step_ends": [e - ends[0] for e in ends], "rewards": rewards}


def run_rayseq(model: Path, data: Path, batch: int, seed: int, steps: int, work: Path, workers: int) -> dict:
    import torch

    from rayseq.config import build_config
    from rayseq.distributed.driver import Trainer

    torch.set_num_threads(1)
    ends, rewards, seen = [], [], {}

    def record(row, trainer):
        if row.get("stage") == "train":
            ends.append(time.perf_counter())
            rewards.append(float(row["rollout/reward_mean"]))
            if not seen:  # in-process the learner is this process; Ray's actors take learner/rollout.torch_threads
                seen.update(torch_threads=torch.get_num_threads() if not workers else cfg.learner.torch_threads,
                            weights="torch.float32", autocast="none", gradient_checkpointing=False)

    actors = ["rollout.num_cpus_per_worker=0.5", "scorer.num_cpus_per_scorer=0.5", "learner.num_cpus=0.5"]
    cfg = build_config(None, [
        "task.name=pairs", f"task.data={data}", "task.val_size=4", "task.test_size=100", "model.arch=hf",
        f"model.path={model}", "algo.name=grpo", f"algo.group_size={GROUP}", f"train.batch_size={batch}",
        f"algo.minibatch_size={batch}", "algo.epochs=1", f"algo.lr={LR}", "algo.kl_coef=0", "algo.max_grad_norm=1.0",
        "train.pretrain_iters=0", f"train.iters={steps}", "train.eval_every=0", "reward.fn=benchmarks.trl_peer:"
        "vowel_share", f"seed={seed}", "progress=false", f"rollout.num_workers={workers}",
        "learner.torch_threads=1", "rollout.torch_threads=1", "scorer.torch_threads=1",
        f"run_dir={work / 'run'}", *(actors if workers else [])])
    t0 = time.perf_counter()
    Trainer(cfg, report=record).run()
    return {**timings(t0, ends, rewards), "ran_with": seen}


def one(method: str, batch: int, seed: int, steps: int, root: Path) -> dict:
    work = root / f"{method}-b{batch}-s{seed}"
    shutil.rmtree(work, ignore_errors=True)  # a fresh run directory each time
    work.mkdir(parents=True)
    model, data = setup(root)
    if method in ("trl", "trl_defaults"):
        out = run_trl(model, data, batch, seed, steps, work, defaults=method == "trl_defaults")
    else:
        out = run_rayseq(model, data, batch, seed, steps, work, workers=2 if method == "rayseq_ray" else 0)
    return {"method": method, "batch": batch, "seed": seed, "steps": steps, **out}


def round_order(methods: list[str], round_index: int) -> list[str]:
    """The methods of round ``round_index``, rotated by one place per round: each method is first, second, ... in
    turn, so that a slow or fast stretch of the machine does not favour one of them."""
    k = round_index % len(methods)
    return methods[k:] + methods[:k]


# ------------------------------------------------------------------------------------------------ report


def step_seconds(run: dict, warmup: int) -> list[float]:
    """Seconds of steps warmup+1.. (step 1 is in the start-up)."""
    ends = run["step_ends"]
    return [b - a for a, b in zip(ends[:-1], ends[1:])][max(warmup - 1, 0):]


def summarise(runs: list[dict], warmup: int, last: int = 10) -> dict:
    """Per (batch, method): each round's median step seconds, their median over rounds, completions/s, the final
    reward; and per method but TRL, its ratio to TRL: TRL's step time over the method's in the same round (seed),
    the median over the rounds that ran both."""
    out: dict = {}
    for r in sorted(runs, key=lambda r: r["seed"]):
        s = out.setdefault(str(r["batch"]), {}).setdefault(r["method"], {"seeds": [], "step_s": [],
                                                                          "final_reward": [], "startup_s": []})
        s["seeds"].append(r["seed"])
        s["step_s"].append(statistics.median(step_seconds(r, warmup)))
        s["final_reward"].append(statistics.mean(r["rewards"][-last:]))
        s["startup_s"].append(r["startup_s"])
    for batch, methods in out.items():
        for m in methods.values():
            m["median_step_s"] = statistics.median(m["step_s"])
            m["completions_per_s"] = int(batch) / m["median_step_s"]
            m["median_final_reward"] = statistics.median(m["final_reward"])
        trl = methods.get("trl")
        for name, m in methods.items():
            if trl is None or name == "trl":
                continue
            base = dict(zip(trl["seeds"], trl["step_s"]))
            m["vs_trl"] = [base[seed] / x for seed, x in zip(m["seeds"], m["step_s"]) if seed in base]
            if m["vs_trl"]:
                m["median_vs_trl"] = statistics.median(m["vs_trl"])
    return out


def table(summary: dict, runs: list[dict], warmup: int) -> str:
    lines = ["| batch (completions) | method | ms / step: median (min–max over rounds) | completions / s | "
             "vs TRL: median (min–max) of the rounds' ratios | reward, last 10 steps: median (min–max) | "
             "start-up s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for batch in sorted(summary, key=int):
        ms = summary[batch]
        for m in METHODS:
            if m not in ms:
                continue
            s = ms[m]
            if m == "trl":
                ratio = "1.00×"
            elif s.get("vs_trl"):
                ratio = f"{s['median_vs_trl']:.2f}× ({min(s['vs_trl']):.2f}–{max(s['vs_trl']):.2f})"
            else:
                ratio = ""
            lines.append(f"| {batch} | {LABELS[m]} | {1000 * s['median_step_s']:.1f} "
                         f"({1000 * min(s['step_s']):.1f}–{1000 * max(s['step_s']):.1f}) | "
                         f"{s['completions_per_s']:.0f} | {ratio} | {s['median_final_reward']:.3f} "
                         f"({min(s['final_reward']):.3f}–{max(s['final_reward']):.3f}) | "
                         f"{statistics.median(s['startup_s']):.1f} |")
        if "rayseq" in ms and "rayseq_ray" in ms:
            lines.append(f"| {batch} | Ray / in-process step time | "
                         f"{ms['rayseq_ray']['median_step_s'] / ms['rayseq']['median_step_s']:.2f}× | | | | |")
    steps = runs[0]["steps"] if runs else 0
    seeds = sorted({r["seed"] for r in runs})
    ran = sorted({(r["method"], json.dumps(r.get("ran_with", {}), sort_keys=True)) for r in runs})
    lines.append("")
    lines.append(f"{len(seeds)} rounds (seeds {', '.join(map(str, seeds))}), the methods' order rotated each round; "
                 f"{steps} steps per run, step times the median over steps {warmup + 1}..{steps} of each run. "
                 "Above 1× = faster than TRL. `vs TRL` pairs each run with TRL's run of the same round.")
    if os.environ.get("ONEDNN_MAX_CPU_ISA"):  # e.g. AVX2: oneDNN without the CPU's native bfloat16 instructions
        lines.append("")
        lines.append(f"oneDNN limited to the {os.environ['ONEDNN_MAX_CPU_ISA']} instruction set "
                     "(`ONEDNN_MAX_CPU_ISA`), as on a CPU without native bfloat16 instructions.")
    lines.append("")
    lines.append("What the timed steps ran with: " + "; ".join(
        f"{LABELS[m]}: " + ", ".join(f"{k} {v}" for k, v in json.loads(w).items()) for m, w in ran if w != "{}") + ".")
    return "\n".join(lines)


def plot(runs: list[dict], summary: dict, warmup: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    batches = sorted({r["batch"] for r in runs})
    fig, axes = plt.subplots(len(batches), 3, figsize=(15, 3.8 * len(batches)), squeeze=False)
    colors = {"trl": "tab:red", "trl_defaults": "tab:orange", "rayseq": "tab:blue", "rayseq_ray": "tab:green"}
    for i, b in enumerate(batches):
        for m in METHODS:
            mine = [r for r in runs if r["batch"] == b and r["method"] == m]
            if not mine:
                continue
            n = min(min(len(r["rewards"]), len(r["step_ends"])) for r in mine)
            curve = np.mean([r["rewards"][:n] for r in mine], axis=0)  # mean over rounds
            step_s = summary[str(b)][m]["median_step_s"]
            axes[i][0].plot(range(1, n + 1), curve, color=colors[m], label=LABELS[m])
            axes[i][1].plot(np.arange(n) * step_s, curve, color=colors[m], label=LABELS[m])
            seeds = summary[str(b)][m]["seeds"]
            axes[i][2].plot(seeds, [1000 * x for x in summary[str(b)][m]["step_s"]], "o-", color=colors[m],
                            label=LABELS[m])
        axes[i][0].set(xlabel="step", ylabel="mean reward (mean over rounds)", title=f"batch {b}: per step")
        axes[i][1].set(xlabel="seconds after the first step (median step time)", title=f"batch {b}: per second")
        axes[i][2].set(xlabel="round (seed)", ylabel="ms / step (median after warm-up)", ylim=(0, None),
                       title=f"batch {b}: each round's step time",
                       xticks=sorted({r["seed"] for r in runs if r["batch"] == b}))
        axes[i][2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="one round per seed")
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
    results = []
    for i, seed in enumerate(args.seeds):
        for batch in args.batches:
            for method in round_order(list(args.methods), i):
                path = args.runs / f"{name}-{method}-b{batch}-s{seed}.json"
                if not args.report_only and not (path.is_file() and not args.fresh):  # finished runs are reused
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
                    print(f"round {i + 1}/{len(args.seeds)}: {method:12s} batch {batch:3d} seed {seed}: "
                          f"{time.time() - t0:.0f} s", file=sys.stderr)
                if path.is_file():  # --report-only: the runs finished so far
                    results.append(json.loads(path.read_text()))
    summary = summarise(results, args.warmup)
    versions = {}
    for pkg in ("torch", "trl", "transformers", "ray"):
        try:
            from importlib.metadata import version

            versions[pkg] = version(pkg)
        except Exception:  # noqa: BLE001 - a missing package is reported as missing
            versions[pkg] = None
    write_report(args.out, name, table(summary, results, args.warmup),
                 {"summary": summary, "runs": results, "warmup": args.warmup, "versions": versions,
                  "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
                  "settings": {"group": GROUP, "completion_len": COMPLETION_LEN, "lr": LR, "prompts": N_PROMPTS,
                               "trl_cpu": TRL_CPU}})
    plot(results, summary, args.warmup, args.out / f"{name}.png")
    return 0


from benchmarks._report import write_report  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
