"""The resident memory (RSS) of a rollout worker with ``rollout.engine=vllm``, on two source trees: one whose worker
keeps a whole Hugging Face copy of the policy beside the engine and recomputes the sampled replies' log-probs with it,
and this one, whose worker keeps only the policy's frame (names and shapes, no weights) and leaves the log-probs to the
learners (:func:`rayseq.algos.common.behaviour_logprobs`).

Each measurement is a fresh process of the vLLM environment (vLLM's CPU build) that builds one ``RolloutWorker`` as a
run builds it (in-process, ``rollout.num_workers=0``), gives it one version of the weights (read from the model's
safetensors file, as the learner would publish them) and samples one shard; it reads its own RSS (``VmRSS`` of
/proc/self/status) after each step and the peak (``VmHWM``). The model is a GPT-2 of random weights (12 layers, 768
wide, heads of 64: 85 M parameters, 340 MB in float32), so that one copy of the weights stands out of vLLM's own
footprint; the engine's key/value cache is fixed at 64 MiB. Medians of ``--repeats`` processes per tree.

Run book (from the repository root; the "before" tree is any older checkout, e.g. ``git archive``):

    mkdir -p /tmp/rayseq-before && git archive 54069ee | tar -x -C /tmp/rayseq-before
    python benchmarks/vllm_worker_memory.py --before /tmp/rayseq-before \
        --python /work/venv-vllm/bin/python             # benchmarks/results/vllm_worker_memory.md, .json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# run in the measured tree's process: build the worker, load one version of the weights, sample one shard
PROBE = r"""
import gc, json, sys
import numpy as np

def rss():
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    return {k: int(status[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}

model_dir, corpus, run_dir = sys.argv[1:4]
import torch
import vllm  # noqa: F401  (its import alone is most of a worker's memory)
from rayseq.config import build_config
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.types import RolloutRequest
out = {"imported": rss()}
cfg = build_config(None, ["task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={model_dir}",
                          "rollout.engine=vllm", "rollout.num_workers=0", "algo.name=grpo", "train.pretrain_iters=0",
                          "rollout.engine_kwargs={kv_cache_memory_bytes: 67108864}", f"run_dir={run_dir}",
                          "progress=false", "seed=0"])
worker = RolloutWorker(cfg)
gc.collect()
out["worker_built"] = rss()
out["holds_policy"] = getattr(worker, "generator", None) is not None
from safetensors.torch import load_file
weights = {"generator": {f"model.{k}": v + 0.01 for k, v in load_file(f"{model_dir}/model.safetensors").items()}}
worker.set_weights(weights, 1)
del weights
gc.collect()
out["weights_loaded"] = rss()
prompts = worker.task.sample_prompts(np.random.default_rng(0), 16)
rollout = worker.sample(prompts, RolloutRequest(max_len=24, seed=1), score=False)
gc.collect()
out["sampled"] = rss()
out["rows"] = len(rollout)
print("RESULT " + json.dumps(out))
"""

STEPS = ("imported", "worker_built", "weights_loaded", "sampled")


def make_model(out: Path) -> Path:
    """The GPT-2 of the module docstring, with the tiny tokenizer of the tests' corpus, in ``out``."""
    from rayseq.models.tiny_hf import make_tiny_lm
    from tests.hf_fixtures import chitchat_lines

    return make_tiny_lm(out, chitchat_lines(), vocab_size=400, positions=128, hidden=768, layers=12, heads=12)


def make_corpus(out: Path) -> Path:
    from rayseq.data.preparation import PrepareOptions, prepare
    from tests.conftest import write_corpus

    out.mkdir(parents=True, exist_ok=True)
    prepared = out / "prepared"
    prepare(f"jsonl:{write_corpus(out / 'pairs.jsonl')}", prepared,
            PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.2, seed=0))
    return prepared


def measure(tree: Path, python: str, model: Path, corpus: Path, scratch: Path) -> dict:
    """One fresh process of ``python`` on the source ``tree``: the probe's RSS figures."""
    env = {**os.environ, "PYTHONPATH": str(tree), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    run_dir = tempfile.mkdtemp(dir=scratch)
    done = subprocess.run([python, "-c", PROBE, str(model), str(corpus), run_dir], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=900)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode or line is None:
        raise RuntimeError(f"the probe failed on {tree}:\n{done.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="a source tree whose vLLM worker keeps an HF copy")
    ap.add_argument("--after", type=Path, default=REPO, help="the tree measured against it (default: this one)")
    ap.add_argument("--python", default="/work/venv-vllm/bin/python", help="the vLLM environment's interpreter")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)
    from benchmarks._report import write_report

    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        model, corpus = make_model(scratch / "gpt2-85m"), make_corpus(scratch / "corpus")
        weights_bytes = (model / "model.safetensors").stat().st_size
        runs = {name: [measure(tree.resolve(), args.python, model, corpus, scratch) for _ in range(args.repeats)]
                for name, tree in (("before", args.before), ("after", args.after))}
    mib = 2**20
    med = {name: {step: statistics.median(r[step]["VmRSS"] for r in rs) for step in STEPS}
           | {"peak": statistics.median(r["sampled"]["VmHWM"] for r in rs)} for name, rs in runs.items()}
    rows = ["| step | RSS before (MiB) | RSS after (MiB) | after − before (MiB) |", "|---|---|---|---|"]
    for step in (*STEPS, "peak"):
        b, a = med["before"][step], med["after"][step]
        rows.append(f"| {step} | {b / mib:.0f} | {a / mib:.0f} | {(a - b) / mib:+.0f} |")
    table = (f"vLLM rollout worker RSS, medians of {args.repeats} processes per tree; model: GPT-2 12 x 768, "
             f"{weights_bytes / mib:.0f} MiB of float32 weights; KV cache 64 MiB\n\n" + "\n".join(rows) +
             f"\n\nholds an HF policy: before {runs['before'][0]['holds_policy']}, after "
             f"{runs['after'][0]['holds_policy']}")
    write_report(args.out, "vllm_worker_memory", table, {
        "weights_bytes": weights_bytes, "repeats": args.repeats, "median_bytes": med, "runs": runs,
        "trees": {"before": str(args.before), "after": str(args.after)}})


if __name__ == "__main__":
    main()
