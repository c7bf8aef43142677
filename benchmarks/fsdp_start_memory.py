"""Peak host memory of each rank while two sharded learners start (``learner.strategy=fsdp``, two ranks, gloo on the
CPU), before and after the ranks but rank 0 built the policy on the ``meta`` device and received their shards from
rank 0's.

The policy is a Llama-shaped causal LM with Llama-3.2-1B's vocabulary (V = 128,256, tied embeddings), two layers
512 wide: about 70 M parameters, 0.28 GB in fp32, most of it the embedding; random weights saved as safetensors (no
download), the tokenizer a small BPE one (the rows beyond it are banned ids). The run is PPO with the KL penalty
(``algo.kl_coef=0.1``), so the start has two steps: the learners' construction and sharding (``Learner(cfg, rank)``
then ``join_data_parallel``), and the ``train`` stage's start, which builds the sharded KL reference.

Each code tree runs in a process of its own, which starts the two ranks (``torch.multiprocessing``, spawned); each
rank reports its resident set after its imports (``base``), its peak resident set (``ru_maxrss``) after each step,
less ``base``, and what it holds at the end. "before" runs the same script on the code of ``--before`` (a git
revision, extracted with ``git archive``): every rank reads the whole model from disk onto its device before
sharding, and again for the reference. "after" runs this tree.

Run book (from the repository root):

    python benchmarks/fsdp_start_memory.py --before df402b0   # benchmarks/results/fsdp_start_memory.{md,json}
    python benchmarks/fsdp_start_memory.py --quick            # V = 4,096, 64 wide, this tree only (tests/benchmarks)
"""

from __future__ import annotations

import inspect
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks._report import before_after_parser, extract_revision, git, write_report  # noqa: E402

FULL = {"vocab": 128_256, "width": 512, "layers": 2}
QUICK = {"vocab": 4096, "width": 64, "layers": 1}
PAIRS = [("hello there", "hi , how are you ?"), ("how is the weather ?", "sunny and warm"),
         ("do you like tea ?", "i like coffee more"), ("good night", "sleep well")]


def build_inputs(out: Path, shape: dict) -> tuple[Path, Path]:
    """The model folder (a Llama of ``shape``, random weights, a small tokenizer) and a prepared prompt -> reply
    dataset, under ``out``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rayseq.data.preparation import PrepareOptions, prepare
    from rayseq.models.tiny_hf import train_tokenizer

    model = out / "model"
    topics = ["tea", "coffee", "rain", "music", "books", "dogs", "cats", "films"]
    texts = [*(t for pair in PAIRS for t in pair), *topics, "do you like or"]
    train_tokenizer(texts * 20, vocab_size=300).save_pretrained(model)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["width"],
                                 intermediate_size=2 * shape["width"], num_hidden_layers=shape["layers"],
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                 tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
                                 eos_token_id=2)).save_pretrained(model)
    rows = [{"input": p, "reply": r, "conv_id": f"c{i}"} for i in range(64) for p, r in PAIRS]
    # and a question of each conversation's own: the held-out splits keep what no training conversation asks
    rows += [{"input": f"do you like {topics[i % 8]} or {topics[i // 8]} ?", "reply": PAIRS[i % 4][1],
              "conv_id": f"c{i}"} for i in range(64)]
    (out / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = out / "prepared"
    prepare(f"jsonl:{out / 'pairs.jsonl'}", data, PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.2, seed=0))
    return model, data


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def one_rank(rank: int, spec: dict) -> None:
    """One rank's start (a spawned process): its memory after each step, written to ``spec["out"]``."""
    sys.path.insert(0, spec["tree"])  # the code measured (before: the extracted revision)
    import torch.distributed.checkpoint  # noqa: F401 -- what the start imports, imported before the base is taken
    import torch.distributed.fsdp  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401

    import rayseq.models.hf  # noqa: F401
    from rayseq.config import build_config
    from rayseq.distributed.actors.learner import Learner

    cfg = build_config(None, spec["overrides"])
    base = rss_mb()
    takes_rank = "rank" in inspect.signature(Learner).parameters
    learner = Learner(cfg, rank) if takes_rank else Learner(cfg)
    built = {"built_peak_mb": peak_mb() - base, "built_held_mb": rss_mb() - base}
    learner.join_data_parallel(rank, 2, "127.0.0.1", spec["port"], 300.0)
    started = {"start_peak_mb": peak_mb() - base, "start_held_mb": rss_mb() - base}
    learner.start_stage("train")  # the KL reference
    record = {"rank": rank, "base_mb": base, **built, **started, "reference_peak_mb": peak_mb() - base,
              "held_mb": rss_mb() - base}
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(record))
    import torch.distributed as dist

    dist.destroy_process_group()


def one(spec: dict) -> list[dict]:
    """Both ranks of one code tree (``--one``)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        spec["port"] = s.getsockname()[1]
    mp.start_processes(one_rank, args=(spec,), nprocs=2, start_method="spawn")
    return [json.loads(Path(spec["out"], f"rank{r}.json").read_text()) for r in (0, 1)]


def main(argv=None) -> int:
    args = before_after_parser(__doc__, "V = 4,096, 64 wide").parse_args(argv)
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return 0
    shape = QUICK if args.quick else FULL
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"after": REPO}
        if args.before:
            trees = {"before": extract_revision(args.before, Path(tmp) / "before"), **trees}
        model, data = build_inputs(Path(tmp), shape)
        weights_mb = sum(f.stat().st_size for f in model.glob("*.safetensors")) / 2**20
        overrides = ["task.name=pairs", f"task.data={data}", "model.arch=hf", f"model.path={model}",
                     "learner.strategy=fsdp", "learner.num_learners=2", "learner.torch_threads=1", "algo.name=ppo",
                     "algo.kl_coef=0.1", "progress=false"]
        for code, tree in trees.items():
            out = Path(tmp) / f"out-{code}"
            out.mkdir()
            spec = {"tree": str(tree), "overrides": overrides, "out": str(out)}
            proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True,
                                  text=True, env={**os.environ, "PYTHONPATH": str(tree)})
            if proc.returncode:
                raise RuntimeError(f"{code}: {proc.stderr[-3000:]}")
            rows += [{"code": code, **r} for r in json.loads(proc.stdout.strip().splitlines()[-1])]
    header = (f"Two FSDP learner ranks (gloo, CPU) start on a Llama of V = {shape['vocab']:,}, {shape['layers']} "
              f"layers × {shape['width']} wide ({weights_mb:,.0f} MB of fp32 weights); MB above each rank's "
              "resident set after its imports. Peak: `ru_maxrss` after the step.")
    lines = [header, "",
             "| code | rank | built: peak MB | sharded: peak MB | reference: peak MB | held at the end MB |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['code']} | {r['rank']} | {r['built_peak_mb']:,.0f} | {r['start_peak_mb']:,.0f} | "
              f"{r['reference_peak_mb']:,.0f} | {r['held_mb']:,.0f} |" for r in rows]
    name = "fsdp_start_memory_quick" if args.quick else "fsdp_start_memory"
    write_report(args.out, name, "\n".join(lines),
                 {"shape": shape, "weights_mb": weights_mb, "before": args.before and git("rev-parse", args.before),
                  "runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
