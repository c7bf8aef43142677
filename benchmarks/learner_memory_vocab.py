"""Peak memory of one whole PPO update (the passes without gradients, the gradient pass, the optimizer steps) on a
policy with a real vocabulary and real lengths, against the batch, ``learner.micro_batch_size`` and the chunked head,
before and after the gradient pass was bounded by its micro-batch.

The policy is a Llama-shaped causal LM with Llama-3.2-1B's vocabulary (V = 128,256, tied embeddings) but two
narrow layers (64 wide), built from config with random weights (no download); prompts of 1,024 tokens and replies of
1,024 (2k positions per row). What the vocabulary costs is then what one sees: the (rows, positions, V) fp32 logits
(1.05 GB per row over the reply at V = 128k) and what is computed from them, against the chunk of positions the head
runs on.

Each measurement runs in a process of its own (``--one``) that builds the policy, its Adam, a value baseline and a
rollout, then runs ``rayseq.algos.ppo.ppo_update`` once (PPO's clip, one minibatch of the whole batch, entropy bonus
0.01); its memory is the process's peak resident set (``ru_maxrss``) less its resident set just before the update.
"before" runs the same script on the code of ``--before`` (a git revision, extracted with ``git archive``): the head
on every position, the whole minibatch in one gradient pass. "after" runs this tree: with ``learner.micro_batch_size``
unset an HF policy takes 16,384 // 2,048 = 8 rows per pass; "after, one chunk" lowers nothing but raises the head's
chunk to the whole micro-batch (``logit_elements``), to show what the chunking alone saves.

On a GPU (``--device cuda``, the GPU runner's ``memory`` part) the update runs on the device and its memory is
what torch's caching allocator held at its peak above what it held before the update (``max_memory_allocated``),
for larger batches (``GPU_RUNS``; this tree only).

Run book (from the repository root):

    python benchmarks/learner_memory_vocab.py --before 213d979   # benchmarks/results/learner_memory_vocab.{md,json,png}
    python benchmarks/learner_memory_vocab.py --quick            # V = 4,096, 64 + 64 tokens (tests/benchmarks)
    python benchmarks/learner_memory_vocab.py --device cuda      # learner_memory_vocab_gpu.{md,json,png}
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks._report import before_after_parser, extract_revision, git  # noqa: E402

FULL = {"vocab": 128_256, "prompt": 1024, "reply": 1024, "width": 64, "layers": 2}
QUICK = {"vocab": 4096, "prompt": 64, "reply": 64, "width": 32, "layers": 1}
# (code, batch, micro-batch, chunked): before = the --before revision; chunked False = the head's chunk raised to the
# whole micro-batch
FULL_RUNS = [("before", 1, None, False), ("before", 2, None, False),
             ("after", 1, None, True), ("after", 2, None, True), ("after", 8, None, True), ("after", 8, 2, True),
             ("after", 2, 1, False)]
QUICK_RUNS = [("after", 2, None, True), ("after", 4, None, True), ("after", 4, 1, True), ("after", 4, 1, False)]
# on a GPU: the unset micro-batch (8 rows a pass here) against the batch; a set one; and one pass of 8 rows with the
# head in one chunk (the (8, 1,024, V) fp32 logits held: what the chunking saves)
GPU_RUNS = [("after", 2, None, True), ("after", 8, None, True), ("after", 32, None, True), ("after", 32, 4, True),
            ("after", 8, 8, False)]


def build_model(out: Path, shape: dict) -> Path:
    """A Llama-shaped causal LM of ``shape`` with random weights, saved in ``out``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["width"], intermediate_size=2 * shape["width"],
                      num_hidden_layers=shape["layers"], num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=shape["prompt"] + shape["reply"] + 8, tie_word_embeddings=True,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one(spec: dict) -> dict:
    """One update in this process (``--one``): its peak memory above what the process held before it."""
    sys.path.insert(0, spec["tree"])  # the code measured (before: the extracted revision)
    import numpy as np
    import torch

    from rayseq.algos.common import LearnerState
    from rayseq.algos.ppo import clip_surrogate, ppo_update
    from rayseq.models.baseline import ValueBaseline
    from rayseq.models.hf import HFCausalLM
    from rayseq.types import Rollout

    torch.manual_seed(0)
    B, S, T, V = spec["batch"], spec["prompt"], spec["reply"], spec["vocab"]
    device = torch.device(spec.get("device", "cpu"))
    gen = HFCausalLM(spec["model"], SimpleNamespace(pad=0, bos=1, eos=2), vocab_size=V).to(device)
    if not spec["chunked"] and hasattr(gen, "logit_elements"):
        gen.logit_elements = 1 << 62  # one chunk: the head on the whole micro-batch's reply positions at once
    baseline = ValueBaseline(gen.state_dim).to(device)
    modules = {"baseline": baseline, "base_opt": torch.optim.Adam(baseline.parameters(), lr=1e-3)}
    state = LearnerState(generator=gen, gen_opt=torch.optim.Adam(gen.parameters(), lr=1e-5), device=device,
                         entropy_coef=0.01, micro_batch=spec["micro"])
    rng = np.random.default_rng(0)
    ones = np.ones((B, T), np.float32)
    rewards = np.zeros((B, T), np.float32)
    rewards[:, -1] = rng.random(B)
    rollout = Rollout(src=rng.integers(3, V, (B, S)), src_len=np.full(B, S), tokens=rng.integers(3, V, (B, T)),
                      token_mask=ones, action_mask=ones.copy(), logp=np.full((B, T), -np.log(V), np.float32),
                      rewards=rewards, score=rewards.sum(1))
    cfg = SimpleNamespace(gamma=1.0, ratio_to="behaviour", normalize_advantages=False, minibatch_size=B, epochs=1,
                          max_grad_norm=1.0, eps=0.2, eps_high=None, behaviour_weight_cap=5.0)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() / 2**20 if cuda else rss_mb()
    t0 = time.perf_counter()
    metrics = ppo_update(cfg, state, rollout, clip_surrogate(cfg), seed=0, modules=modules)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # KB on Linux
    return {"base_mb": base, "peak_mb": peak, "update_mb": peak - base, "seconds": seconds,
            "loss": metrics["loss/policy"]}


def measure(runs, shape: dict, model: Path, trees: dict, device: str = "cpu") -> list[dict]:
    rows = []
    for code, batch, micro, chunked in runs:
        spec = {**shape, "tree": str(trees[code]), "model": str(model), "batch": batch, "micro": micro,
                "chunked": chunked, "device": device}
        proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(trees[code])})
        if proc.returncode:
            raise RuntimeError(f"{code} batch {batch} micro {micro}: {proc.stderr[-2000:]}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append({"code": code, "batch": batch, "micro": micro, "chunked": chunked, **res})
        print(f"{code:6} batch {batch:2} micro {micro!s:4} chunked {chunked!s:5}: update {res['update_mb']:8.0f} MB"
              f" (peak {res['peak_mb']:.0f}) {res['seconds']:.1f} s", flush=True)
    return rows


def logits_mb(rows: int, positions: int, vocab: int) -> float:
    return rows * positions * vocab * 4 / 2**20


def report(rows: list[dict], shape: dict, provenance: list[str], device: str = "cpu") -> str:
    reply = shape["reply"]
    title = f"One PPO update's peak memory at V = {shape['vocab']:,}, {shape['prompt']:,} + {reply:,} tokens per row"
    gpu = device == "cuda"
    what = ("`update MB`: the peak of CUDA memory allocated during the update less what was allocated before it "
            "(`peak MB`: the peak itself)" if gpu else "`update MB`: the update process's peak resident "
            "set less its resident set before the update")
    lines = [f"# {title}",
             "", *provenance, "",
             f"Policy: Llama-shaped, {shape['layers']} layers × {shape['width']} wide, tied embeddings; one minibatch "
             f"of the whole batch, entropy bonus 0.01, value baseline{', on the GPU' if gpu else ''}. {what}. "
             "`reply logits MB`: one (rows, reply, V) fp32 tensor for the rows of one pass, for scale.", "",
             f"| code | batch | micro-batch | head | update MB | peak {'CUDA' if gpu else 'RSS'} MB | reply logits MB "
             "| seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rows_per_pass = r["batch"] if r["code"] == "before" else (r["micro"] or min(r["batch"], max(
            1, 16384 // (shape["prompt"] + reply))))
        micro = ("none (one pass)" if r["code"] == "before" else
                 (f"{r['micro']}" if r["micro"] else f"unset ({rows_per_pass})"))
        head = ("every position" if r["code"] == "before" else
                ("reply, chunked" if r["chunked"] else "reply, one chunk"))
        lines.append(f"| {r['code']} | {r['batch']} | {micro} | {head} | {r['update_mb']:,.0f} | {r['peak_mb']:,.0f} | "
                     f"{logits_mb(rows_per_pass, reply, shape['vocab']):,.0f} | {r['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], shape: dict, out: Path, device: str = "cpu") -> None:
    try:
        import matplotlib
    except ImportError:  # a machine without it (the GPU machine's image): the table and the JSON say it all
        print("matplotlib is not installed: no plot")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    series = {"before (one pass, head on every position)": [r for r in rows if r["code"] == "before"],
              "after, micro-batch unset, chunked head": [r for r in rows if r["code"] == "after" and r["micro"] is None
                                                         and r["chunked"]]}
    for label, pts in series.items():
        if pts:
            ax.plot([r["batch"] for r in pts], [r["update_mb"] for r in pts], "o-", label=label)
    for r in rows:
        if r["code"] == "after" and r["micro"] is not None:
            ax.plot(r["batch"], r["update_mb"], "s" if r["chunked"] else "x",
                    label=f"after, micro-batch {r['micro']}" + ("" if r["chunked"] else ", one chunk"))
    batches = sorted({r["batch"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set(xlabel="rows in the batch", ylabel=f"update's peak MB ({'CUDA allocated' if device == 'cuda' else 'RSS'})",
           title=f"One PPO update, V = {shape['vocab']:,}, {shape['prompt']} + {shape['reply']} tokens per row")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv=None) -> int:
    ap = before_after_parser(__doc__, "V = 4,096, 64 + 64 tokens")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the updates on the GPU, its allocator's peak (GPU_RUNS; with --quick, QUICK_RUNS)")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return 0
    shape = QUICK if args.quick else FULL
    runs = QUICK_RUNS if args.quick else GPU_RUNS if args.device == "cuda" else FULL_RUNS
    if not args.before:
        runs = [r for r in runs if r[0] != "before"]
    name = ("learner_memory_vocab_quick" if args.quick else "learner_memory_vocab") + \
        ("_gpu" if args.device == "cuda" else "")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"after": REPO}
        provenance = [f"- command: `python benchmarks/learner_memory_vocab.py {' '.join(argv or sys.argv[1:])}`",
                      f"- after: this tree at {git('rev-parse', '--short', 'HEAD')}"
                      + (" (with uncommitted changes)" if git("status", "--porcelain") else "")]
        if args.before:
            trees["before"] = extract_revision(args.before, Path(tmp) / "before")
            provenance.append(f"- before: {git('rev-parse', '--short', args.before)}")
        if args.device == "cuda":
            import torch

            provenance.append(f"- device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
        provenance += [f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, "
                       f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
                       f"Python {platform.python_version()}",
                       f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"]
        model = build_model(Path(tmp) / "model", shape)
        rows = measure(runs, shape, model, trees, args.device)
    (args.out / f"{name}.md").write_text(report(rows, shape, provenance, args.device))
    (args.out / f"{name}.json").write_text(json.dumps({"shape": shape, "provenance": provenance, "runs": rows},
                                                      indent=1))
    plot(rows, shape, args.out / f"{name}.png", args.device)
    print(f"wrote {args.out / name}.md, .json, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
