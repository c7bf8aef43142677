"""The Transformer policy (``model.arch=transformer``) beside the GRU: counting at one budget, decoding with and
without the KV cache, and SeqGAN's Monte-Carlo search.

Three parts, each measured side by side in this one process (the machine is shared and noisy: medians, rows
interleaved round-robin, 1 torch thread unless said):

  counting   the default job (counting, 1,000 MLE iterations then 200 PPO-dynamic iterations, batch 256) in-process
             (``rollout.num_workers=0``: the loop's own time, no Ray start-up) for the GRU default (emb 128, hidden
             128: 201,742 parameters) and a Transformer of a similar size (hidden 96, 4 heads, ff 192, one encoder
             and one decoder layer: 214,670 parameters), ``--seeds`` seeds each. The budget is the GRU's loop time
             (median over its seeds, the sum of ``time/iter_s``: evaluations excluded, both archs evaluate as
             often); each run's validation precision at the last evaluation inside that budget is shown beside
             its final test precision and its own loop time.
  chitchat   the same comparison on chit-chat (tune_configs/chitchat_quick.yaml: chitchat-dataset, vocabulary
             4,000, batch 128, PPO-dynamic with the BLEU-2 reward) in-process, on a SHORTER schedule than
             benchmarks/chitchat.py so the part fits in 15–20 minutes: 800 MLE iterations (the benchmark: 1,500)
             then its 150 PPO-dynamic iterations, the same for both archs; validation BLEU-2 (1,000 validation
             inputs) every 100 MLE and every 25 RL iterations. The GRU at the benchmark's sizes (emb 64, hidden 128:
             920,992 parameters) and a Transformer of a similar size (hidden 96, 4 heads, ff 192, one encoder and one
             decoder layer, 32 positions: 965,536). Budget as counting's: the GRU's median loop time; each run's
             validation BLEU-2 at the last evaluation inside it is shown beside its final test BLEU-2 (1,000 test
             inputs), its loop and wall seconds and its parameter count. The corpus is prepared into data/chitchat
             first (``python -m rayseq.data prepare chitchat --out data/chitchat``; a few seconds).
  decode     greedy decoding tokens/s at the chit-chat sizes (vocabulary 4,000, replies of 20 tokens after a
             20-token input; GRU emb 256 / hidden 512 as tune_configs/chitchat.yaml, 5.4 M parameters;
             Transformer hidden 256, 4 heads, ff 1,024, 2 + 2 layers, 5.7 M): the Transformer stepping its
             cache (``sample(greedy=True)``: one position per step) and uncached (each step re-runs the decoder
             over the whole prefix, ``logprobs``, and reads its last position), the GRU for scale. ``<eos>`` is
             banned so every row decodes the full length. Batch 64 (serving) and 256 (a rollout).
  mc         seconds of ``mc_search`` per SeqGAN generator update on the oracle configuration (B = 64, T = 20,
             N = 16, V = 5,000: B·N·T(T−1)/2 = 194,560 sampled tokens): SeqGAN's LSTM (emb 32, hidden 32) and a
             decoder-only Transformer of the same size (hidden 32, 2 heads, ff 64, one layer), both continuing
             every prefix from its cached state. D's scoring is the same for both and left out.

Command   python benchmarks/transformer.py [--parts counting chitchat decode mc] [--seeds 0 1] [--repeats 3]
          (parts not named keep their figures from the last report: --parts decode mc re-measures those two)
Time      about 35 minutes on a 2-core machine (counting ≈ 15 of them, chitchat ≈ 15–20).
Writes    benchmarks/results/transformer.md, .json and transformer.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as rollout_throughput.py: no spin-waiting on a shared machine

import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._report import write_report  # noqa: E402
from rayseq.config import build_config, load_yaml  # noqa: E402
from rayseq.distributed.driver import Trainer  # noqa: E402
from rayseq.models import Seq2SeqGRU, TransformerGenerator, make_generator  # noqa: E402
from rayseq.rewards.mc_search import mc_search  # noqa: E402
from rayseq.tasks import make_task  # noqa: E402
from rayseq.tasks.chitchat import ensure_prepared  # noqa: E402

ARCHS = {
    "gru": [],
    "transformer": ["model.arch=transformer", "model.hidden_dim=96", "model.n_heads=4", "model.ff_dim=192",
                    "model.num_layers=1"],
}


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


# -- counting and chit-chat: one budget ---------------------------------------------------------------------------
def train_run(arch: str, seed: int, tmp: Path, base: dict | None, overrides: list[str], metric: str) -> dict:
    """One in-process training run; its validation ``metric`` against the loop clock (the sum of ``time/iter_s``:
    evaluations excluded) and its final test ``metric``."""
    run_dir = tmp / f"{arch}-s{seed}"
    cfg = build_config(base, [*overrides, f"seed={seed}", "rollout.num_workers=0", "progress=false",
                              f"run_dir={run_dir}"])
    task = make_task(cfg.task)
    params = n_params(make_generator(cfg, task))
    del task
    t0 = time.perf_counter()
    summary = Trainer(cfg).run()
    wall = time.perf_counter() - t0
    rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    clock, curve = 0.0, []
    for r in rows:
        clock += r.get("time/iter_s") or 0.0
        if r.get(f"val/{metric}") is not None:
            curve.append((clock, r["stage"], r["iteration"], r[f"val/{metric}"]))
    m = summary["metrics"]
    return {"arch": arch, "seed": seed, "wall_s": wall, "loop_s": clock, "curve": curve, "params": params,
            f"test_{metric}": m[f"test/{metric}"], f"val_{metric}": m.get(f"val/{metric}")}


def at_budget(curve: list, budget: float) -> float | None:
    inside = [c for c in curve if c[0] <= budget]
    return inside[-1][3] if inside else None


def same_budget(part: str, seeds: list[int], base: dict | None, archs: dict, schedule: list[str],
                metric: str) -> tuple[list[dict], float]:
    """Each arch and seed (interleaved: load from other users hits both alike); the budget is the GRU's median loop
    time, and each run's validation ``metric`` at its last evaluation inside it is ``val_<metric>_at_budget``."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for arch, keys in archs.items():
                runs.append(train_run(arch, seed, Path(tmp), base, [*schedule, *keys], metric))
                r = runs[-1]
                print(f"  {part} {arch} seed {seed}: test {metric} {r[f'test_{metric}']:.3f}, loop "
                      f"{r['loop_s']:.0f} s, wall {r['wall_s']:.0f} s, {r['params']:,} parameters", flush=True)
    budget = statistics.median(r["loop_s"] for r in runs if r["arch"] == "gru")
    for r in runs:
        r[f"val_{metric}_at_budget"] = at_budget(r["curve"], budget)
    return runs, budget


def counting(seeds: list[int]) -> tuple[list[dict], float]:
    return same_budget("counting", seeds, None, ARCHS, ["train.pretrain_eval_every=100"], "precision")


CHITCHAT_CONFIG = ROOT / "tune_configs" / "chitchat_quick.yaml"
CHITCHAT_DATA = ROOT / "data" / "chitchat"
# shorter than benchmarks/chitchat.py's schedule (3,000 MLE iterations): about 15 minutes for 2 archs x 2 seeds
CHITCHAT_SCHEDULE = ["train.pretrain_iters=800", "train.iters=150", "train.pretrain_eval_every=100",
                     "train.eval_every=25", "train.checkpoint_every=0"]
CHITCHAT_ARCHS = {
    "gru": [],  # the chit-chat benchmark's emb 64, hidden 128
    "transformer": ["model.arch=transformer", "model.hidden_dim=96", "model.n_heads=4", "model.ff_dim=192",
                    "model.num_layers=1", "model.max_positions=32"],  # sources <= 20 tokens, replies <= 20 + <eos>
}


def chitchat(seeds: list[int], schedule: list[str]) -> dict:
    base = load_yaml(CHITCHAT_CONFIG)
    data = [f"task.data={CHITCHAT_DATA}"]
    cfg = build_config(base, [*schedule, *data])
    ensure_prepared(cfg.task)  # before the clocks start
    runs, budget = same_budget("chitchat", seeds, base, CHITCHAT_ARCHS, [*schedule, *data], "bleu2")
    t = cfg.train
    return {"budget_s": budget, "runs": runs, "config": str(CHITCHAT_CONFIG.relative_to(ROOT)), "schedule": schedule,
            "mle_iters": t.pretrain_iters, "rl_iters": t.iters, "algo": cfg.algo.name, "batch": t.batch_size,
            "mle_eval_every": t.pretrain_eval_every, "rl_eval_every": t.eval_every, "val_size": cfg.task.val_size,
            "test_size": cfg.task.test_size}


# -- decoding ---------------------------------------------------------------------------------------------------
V, SRC, TGT = 4000, 20, 20


def chitchat_models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    ban = (2,)  # <eos>: every row decodes TGT tokens
    return {
        "gru": Seq2SeqGRU(V, emb_dim=256, hidden_dim=512, banned_ids=ban).eval(),
        "transformer": TransformerGenerator(V, hidden_dim=256, num_layers=2, n_heads=4, ff_dim=1024,
                                            banned_ids=ban).eval(),
    }


@torch.no_grad()
def uncached_greedy(model, src, src_len, T: int) -> torch.Tensor:
    """Greedy decoding without a cache: step t re-runs the decoder over <bos>, y_1..y_{t−1}."""
    tokens = torch.zeros(src.shape[0], 0, dtype=torch.long)
    for _ in range(T):
        probe = torch.cat([tokens, torch.zeros(len(tokens), 1, dtype=torch.long)], 1)  # y_t's slot: input y_{t−1}
        nxt = model.logprobs(src, src_len, probe).logits[:, -1].argmax(-1)
        tokens = torch.cat([tokens, nxt[:, None]], 1)
    return tokens


def decode(batches: list[int], repeats: int) -> list[dict]:
    models = chitchat_models()
    params = {k: n_params(m) for k, m in models.items()}
    rows = {(name, b): [] for b in batches for name in ("gru", "transformer cached", "transformer uncached")}
    cpu = {key: [] for key in rows}
    src = {b: torch.randint(4, V, (b, SRC), generator=torch.Generator().manual_seed(b)) for b in batches}
    fns = {
        "gru": lambda b: models["gru"].greedy(src[b], torch.full((b,), SRC), TGT),
        "transformer cached": lambda b: models["transformer"].greedy(src[b], torch.full((b,), SRC), TGT),
        "transformer uncached": lambda b: uncached_greedy(models["transformer"], src[b], torch.full((b,), SRC), TGT),
    }
    b0 = batches[0]  # the two Transformer decodings agree (a check, not a timing)
    same = torch.equal(fns["transformer cached"](b0), fns["transformer uncached"](b0))
    for key in rows:
        fns[key[0]](key[1])  # warm-up
    for _ in range(repeats):
        for (name, b), times in rows.items():
            t0, c0 = time.perf_counter(), time.process_time()
            out = fns[name](b)
            times.append(time.perf_counter() - t0)
            cpu[name, b].append(time.process_time() - c0)
            assert out.shape == (b, TGT)
    result = []
    for (name, b), times in rows.items():
        med, med_cpu = statistics.median(times), statistics.median(cpu[name, b])
        result.append({"model": name, "batch": b, "median_s": med, "tokens_per_s": b * TGT / med,
                       "cpu_s": med_cpu, "tokens_per_cpu_s": b * TGT / med_cpu,
                       "params": params[name.split()[0]], "cached_equals_uncached": same})
    return result


# -- Monte-Carlo search -----------------------------------------------------------------------------------------
def mc(repeats: int) -> list[dict]:
    B, T, N, VO = 64, 20, 16, 5000
    ban = (0, 1, 2, 3)  # the oracle task's specials
    torch.manual_seed(0)
    models = {
        "lstm": Seq2SeqGRU(VO, emb_dim=32, hidden_dim=32, cell="lstm", conditional=False, banned_ids=ban).eval(),
        "transformer": TransformerGenerator(VO, hidden_dim=32, num_layers=1, n_heads=2, ff_dim=64, conditional=False,
                                            banned_ids=ban).eval(),
    }
    empty, zero = torch.zeros(B, 0, dtype=torch.long), torch.zeros(B, dtype=torch.long)
    rollouts = {k: m.sample(empty, zero, T, generator=torch.Generator().manual_seed(1)) for k, m in models.items()}
    times = {k: [] for k in models}
    cpu = {k: [] for k in models}

    def run(k):
        s = rollouts[k]
        return mc_search(models[k], empty, zero, s.tokens, s.token_mask, N, generator=torch.Generator().manual_seed(2))

    for k in models:
        run(k)  # warm-up
    for _ in range(repeats):
        for k in models:
            t0, c0 = time.perf_counter(), time.process_time()
            c = run(k)
            times[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
            assert c.tokens.shape == (B, T - 1, N, T)
    return [{"model": k, "params": n_params(models[k]), "median_s": statistics.median(v), "min_s": min(v),
             "cpu_s": statistics.median(cpu[k]), "tokens_per_s": B * N * T * (T - 1) / 2 / statistics.median(v)}
            for k, v in times.items()]


# -- report -----------------------------------------------------------------------------------------------------
def plot(parts: list[tuple[str, dict]], dec: list[dict], path: Path) -> None:
    """One panel per same-budget part (title, {"runs", "budget_s", "metric"}) and one of decoding throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [(t, c) for t, c in parts if c.get("runs")]
    panels = len(parts) + (1 if dec else 0)
    if not panels:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    for i, (title, c) in enumerate(parts):
        ax, runs = axes[0][i], c["runs"]
        for r in runs:
            xs, ys = [x[0] for x in r["curve"]], [x[3] for x in r["curve"]]
            colour = "C0" if r["arch"] == "gru" else "C1"
            ax.plot(xs, ys, color=colour, ls="-" if r["seed"] == runs[0]["seed"] else "--",
                    label=f"{r['arch']} seed {r['seed']}")
            rl = [x for x in r["curve"] if x[1] != "mle"]
            ax.plot([x[0] for x in rl], [x[3] for x in rl], ".", color=colour, ms=5,
                    label="RL-stage evaluations" if r is runs[0] else None)
        ax.axvline(c["budget_s"], color="grey", lw=0.8, label="budget (GRU loop time)")
        ax.set_xlabel("training loop seconds (evaluations excluded)")
        ax.set_ylabel(f"val/{c['metric']}")
        ax.set_title(title)
        ax.legend(fontsize=8)
    if dec:
        ax = axes[0][len(parts)]
        batches = sorted({d["batch"] for d in dec})
        names = ["gru", "transformer cached", "transformer uncached"]
        w = 0.8 / len(names)
        for j, n in enumerate(names):
            vals = [next(d["tokens_per_s"] for d in dec if d["model"] == n and d["batch"] == b) for b in batches]
            ax.bar([x + j * w for x in range(len(batches))], vals, w, label=n)
        ax.set_xticks([x + w for x in range(len(batches))], [f"batch {b}" for b in batches])
        ax.set_ylabel("greedy tokens / s (1 thread)")
        ax.set_title(f"decoding at chit-chat sizes (V {V}, {TGT} tokens)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def render(payload: dict) -> str:
    """The Markdown tables of the parts in ``payload``."""
    lines, th = [], payload.get("threads", 1)
    if dec := payload.get("decode"):
        reps = payload.get("repeats", {}).get("decode", 3)
        lines += [f"### Greedy decoding at chit-chat sizes (median of {reps}, {th} thread; CPU s: this process's "
                  "CPU time, less sensitive to other users of the machine than wall time)", "",
                  "| model | params | batch | wall s per batch | tokens/s | CPU s per batch | tokens per CPU s | "
                  "vs uncached (CPU) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for d in dec:
            unc = next(x for x in dec if x["model"] == "transformer uncached" and x["batch"] == d["batch"])
            lines.append(f"| {d['model']} | {d['params']:,} | {d['batch']} | {d['median_s']:.3f} | "
                         f"{d['tokens_per_s']:,.0f} | {d['cpu_s']:.3f} | {d['tokens_per_cpu_s']:,.0f} | "
                         f"{unc['cpu_s'] / d['cpu_s']:.2f}× |")
        lines += ["", f"Cached and uncached greedy decoding give the same tokens: {dec[0]['cached_equals_uncached']}.",
                  ""]
    if m := payload.get("mc"):
        reps = payload.get("repeats", {}).get("mc", 3)
        lstm = next(x for x in m if x["model"] == "lstm")
        lines += [f"### Monte-Carlo search per SeqGAN update, oracle configuration (median of {reps}, {th} thread)",
                  "", "| policy | params | mc_search wall s/update | min | CPU s/update | vs LSTM (CPU) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for x in m:
            lines.append(f"| {x['model']} | {x['params']:,} | {x['median_s']:.2f} | {x['min_s']:.2f} | "
                         f"{x['cpu_s']:.2f} | {x['cpu_s'] / lstm['cpu_s']:.2f}× |")
        lines.append("")
    if c := payload.get("counting"):
        lines += [f"### Counting, the default job in-process, same budget: the GRU's loop time {c['budget_s']:.0f} s",
                  "", "| arch | seed | val precision at the budget | final test precision | loop s | wall s |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in c["runs"]:
            vb = r["val_precision_at_budget"]
            lines.append(f"| {r['arch']} | {r['seed']} | {'—' if vb is None else f'{vb:.3f}'} | "
                         f"{r['test_precision']:.3f} | {r['loop_s']:.0f} | {r['wall_s']:.0f} |")
        lines.append("")
    if c := payload.get("chitchat"):
        lines += [f"### Chit-chat, {c['mle_iters']:,} MLE then {c['rl_iters']} {c['algo']} iterations in-process "
                  f"(a shorter schedule than benchmarks/chitchat.py's 3,000 MLE), same budget: the GRU's loop time "
                  f"{c['budget_s']:.0f} s", "",
                  f"`{c['config']}` with `{' '.join(c['schedule'])}`, batch {c['batch']}, the same for both archs. "
                  "BLEU-2: corpus BLEU-2 of greedy replies against all references of each input (validation: "
                  f"{c['val_size']:,} inputs every {c['mle_eval_every']} MLE / {c['rl_eval_every']} RL iterations; "
                  f"test: {c['test_size']:,} inputs at the end). Loop s: the sum of the iterations' times, "
                  "evaluations excluded.", "",
                  "| arch | params | seed | val BLEU-2 at the budget | final val BLEU-2 | final test BLEU-2 | loop s | "
                  "wall s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in c["runs"]:
            vb, vf = r["val_bleu2_at_budget"], r["val_bleu2"]
            lines.append(f"| {r['arch']} | {r['params']:,} | {r['seed']} | {'—' if vb is None else f'{vb:.2f}'} | "
                         f"{'—' if vf is None else f'{vf:.2f}'} | {r['test_bleu2']:.2f} | {r['loop_s']:.0f} | "
                         f"{r['wall_s']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="+", default=["decode", "mc", "counting", "chitchat"],
                   choices=["counting", "chitchat", "decode", "mc"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", nargs="+", type=int, default=[64, 256])
    p.add_argument("--threads", type=int, default=1, help="torch threads of the decode and mc parts")
    p.add_argument("--chitchat-schedule", nargs="+", default=CHITCHAT_SCHEDULE, metavar="KEY=VALUE",
                   help="the chitchat part's schedule overrides (a smoke test: train.pretrain_iters=20 ...)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    # the parts not run now keep their figures from the last report (their own command, date are in "runs")
    old = args.out / "transformer.json"
    payload = json.loads(old.read_text()) if old.exists() else {}
    payload = {k: v for k, v in payload.items() if k in ("decode", "mc", "counting", "chitchat", "repeats", "runs")}
    payload["threads"] = args.threads
    payload.setdefault("repeats", {})
    payload.setdefault("runs", {})
    for part in args.parts:
        payload["runs"][part] = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M")}
    if "decode" in args.parts:
        payload["decode"], payload["repeats"]["decode"] = decode(args.batches, args.repeats), args.repeats
        print(render({"decode": payload["decode"], "threads": args.threads}), flush=True)
    if "mc" in args.parts:
        payload["mc"], payload["repeats"]["mc"] = mc(args.repeats), args.repeats
        print(render({"mc": payload["mc"], "threads": args.threads}), flush=True)
    if "counting" in args.parts:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        runs, budget = counting(args.seeds)
        payload["counting"] = {"budget_s": budget, "runs": runs}
    if "chitchat" in args.parts:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        payload["chitchat"] = chitchat(args.seeds, args.chitchat_schedule)
    plot([("counting: MLE then PPO-dynamic", {"metric": "precision", **payload.get("counting", {})}),
          ("chit-chat: MLE then PPO-dynamic (short schedule)", {"metric": "bleu2", **payload.get("chitchat", {})})],
         payload.get("decode", []), args.out / "transformer.png")
    write_report(args.out, "transformer", render(payload), payload)


if __name__ == "__main__":
    main()
