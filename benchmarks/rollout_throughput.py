"""Seconds per SeqGAN generator update spent on Monte-Carlo rewards: plain loop, batched search, Ray, lower bound.

SeqGAN (Yu et al. 2017) Eq. 4: Q(Y_1:t−1, y_t) = (1/N) Σ_n D(Y^n_1:T) for t < T, each prefix Y_1:t completed N
times by the rollout policy and every completion scored by the discriminator D; Q = D(Y) at t = T. At the
paper's sizes (B = 64 sequences, T = 20, N = 16, V = 5,000, LSTM generator emb 32 / hidden 32, the CNN D of
``rayseq.algos.seqgan.DiscConfig``: emb 64, 12 filter sizes, 1,720 features) one update samples
B·N·T(T−1)/2 = 194,560 tokens and scores B·(T−1)·N = 19,456 continuations of length T.

Rows (one generator G and one D, both from ``Learner`` at seed 0, and one rollout of B sequences for all):
  (a) plain loop      ``mc_search_loop``: for n, for t, re-run the prefix from zero, sample to the end with
                      ``torch.multinomial`` one position at a time, score the B sequences with D right away
                      (the structure of public SeqGAN code); then D(Y) and ``q_values``. In-process.
  (b) batched cached  ``mc_search`` (one batch of all B·(T−1)·N continuations from cached prefix states,
                      inverse-CDF sampler fused with the output projection, chunk by chunk) + D over all
                      continuations with ``D.score_shared_prefix`` (the windows inside prefix t are the same
                      for its N continuations: convolved once per sequence) + D(Y) + ``q_values``.
  (c) Ray             ``RolloutGroup.run_on_shards`` + ``ScorerGroup.run_on_pending``: the rollout split over rollout
                      workers, each shard's search scored on a scorer actor (1 torch thread each,
                      ``score_continuations``: the same prefix-shared D), weights already synced; only those two calls
                      are timed.
  (d) lower bound     no search bookkeeping: R = B·N·(T−1) rows decoded for T/2 steps from one state with the
                      same decoder step and fused sampler (the same B·N·T(T−1)/2 sampled tokens), plus one
                      ``D.score_shared_prefix`` over the B·(T−1)·N continuations of (b). What the batched
                      search would cost if joining prefixes, indexing and writing the continuations were free.

Every row: one warm-up (the plain loop's with N = 1: its per-(n, t) work is the same for every n), then
``--repeats`` timed runs, interleaved round-robin across rows so that load from other users of the machine
hits all rows alike; min and median seconds. The Ray runtimes are all created before timing (Ray gets
logical CPUs for all their bundles at once; idle actors use no CPU) and their worker processes run at nice 0
(Ray's default is 15, which would make them lose every contention with the in-process rows). OpenMP waits
passively (``OMP_WAIT_POLICY=PASSIVE`` unless set): with libgomp's default spinning, 2-thread rows on a shared
machine measure the scheduler, not the code (below, at the imports).

Command   python benchmarks/rollout_throughput.py [--repeats 3] [--loop-repeats 3] [--json PATH] [--no-ray]
              [--ray-layouts 1x1 2x1 2x2]
          python benchmarks/rollout_throughput.py --quick   # smoke test: B=8, N=4, V=500, small D, 1 Ray layout
Time      about 9 minutes on a 2-core machine (the plain loop ~40 s per run, the other rows ~8 s; Ray start-up
          ~45 s); --quick ~50 s.
Writes    benchmarks/results/rollout_throughput.md and .json (--quick: rollout_throughput_quick.*;
          --json PATH: PATH and PATH with suffix .md)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Before torch loads libgomp: its default spin-wait makes every 2-thread op wait for a descheduled thread while
# other processes hold the cores (measured on a shared 2-core machine: an 8-row LSTM step 0.14 ms at 1 thread,
# 5-9 ms at 2 threads; 0.2 ms with PASSIVE). Export OMP_WAIT_POLICY yourself to measure another policy.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._report import write_report  # noqa: E402
from rayseq.algos.seqgan import concat_columns, mc_continuations, score_continuations  # noqa: E402
from rayseq.config import build_config  # noqa: E402
from rayseq.distributed.actors.learner import Learner  # noqa: E402
from rayseq.distributed.actors.worker import RolloutWorker  # noqa: E402
from rayseq.models.sampling import sample_projected  # noqa: E402
from rayseq.rewards.mc_search import mc_search, mc_search_loop, q_values  # noqa: E402
from rayseq.types import RolloutRequest  # noqa: E402

PAPER = {"B": 64, "T": 20, "N": 16, "V": 5000}
QUICK = {"B": 8, "T": 20, "N": 4, "V": 500}
QUICK_D = ["disc.emb_dim=16", "disc.filter_sizes=[1,2,3,5]", "disc.num_filters=[16,16,16,16]"]
# Ray rows: every worker / scorer actor reserves CPU_PER_ACTOR logical CPUs and runs 1 torch thread
CPU_PER_ACTOR = 0.5
LEARNER_CPUS = 0.5  # idle while mc_q runs (weights are synced before timing)
SEED = 0
TARGET = 6.0  # the best batched row should be at least 6x the fastest plain loop


def overrides(s: dict, quick: bool) -> list[str]:
    return [
        "task.name=oracle", f"task.vocab_size={s['V']}", f"task.seq_len={s['T']}", "model.cell=lstm",
        "model.emb_dim=32", "model.hidden_dim=32", "algo.name=seqgan", f"algo.mc_rollouts={s['N']}",
        "algo.rollout_update_rate=0", "progress=false", f"seed={SEED}", *(QUICK_D if quick else []),
    ]


@dataclass
class Row:
    key: str  # a, a1, b, b1, c1x1, c2x1, c2x2, d, d1
    label: str  # "(a) plain loop"
    setting: str  # threads or actors, as printed
    fn: Callable[[], dict]  # one timed run -> its phase timings
    warmup: Callable[[], object]
    threads: int | None  # torch threads of this process during the row (None: Ray rows, driver idle)
    repeats: int
    times: list[float] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.label}, {self.setting}"

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    def phase_median(self, k: str) -> float:
        return statistics.median(p[k] for p in self.phases)


class InProcess:
    """G, D and the rollout in this process, and the in-process rows' functions."""

    def __init__(self, cfg, s: dict):
        learner = Learner(cfg)  # seeds torch with cfg.seed: the same G and D weights as the Ray runtimes' learners
        worker = RolloutWorker(cfg, 0)
        worker.set_weights(learner.get_weights(), 0)
        self.rollout = worker.sample(learner.task.sample_prompts(np.random.default_rng(SEED), s["B"]),
                                     RolloutRequest(max_len=s["T"], seed=SEED))
        self.gen, self.disc = worker.generator.eval(), learner.algo.modules["disc"].eval()
        self.B, self.T, self.N = s["B"], s["T"], s["N"]
        self.bs = cfg.scorer.batch_size
        r = self.rollout
        self.src, self.src_len, self.tokens = (torch.from_numpy(a) for a in (r.src, r.src_len, r.tokens))
        self.mask = torch.from_numpy(r.token_mask)
        self.lengths = (self.mask > 0).sum(1).long()
        c = mc_search(self.gen, self.src, self.src_len, self.tokens, self.mask, self.N,
                      generator=torch.Generator().manual_seed(SEED))
        self.cont, self.cont_len = c.tokens, c.lengths  # (d)'s D input
        self.q = {}  # row key -> Q (B, T), for the sanity check

    def plain_loop(self, n: int | None = None, key: str | None = None) -> dict:
        d_s = 0.0

        def score(y, lengths):  # D on the B completions of one (n, t), as public code does
            nonlocal d_s
            t0 = time.perf_counter()
            out = self.disc.score(y, lengths, batch_size=self.bs)
            d_s += time.perf_counter() - t0
            return out

        t0 = time.perf_counter()
        _, d_cont = mc_search_loop(self.gen, self.src, self.src_len, self.tokens, self.mask, n or self.N,
                                   generator=torch.Generator().manual_seed(SEED), score=score)
        t1 = time.perf_counter()
        d_full = self.disc.score(self.tokens, self.lengths, batch_size=self.bs)
        q = q_values(d_cont, d_full, self.lengths)
        t2 = time.perf_counter()
        if key:
            self.q[key] = q.numpy()
        return {"search_s": t1 - t0 - d_s, "score_s": d_s, "rest_s": t2 - t1}

    def batched(self, key: str | None = None) -> dict:
        B, T, N = self.B, self.T, self.N
        t0 = time.perf_counter()
        c = mc_search(self.gen, self.src, self.src_len, self.tokens, self.mask, N,
                      generator=torch.Generator().manual_seed(SEED))
        t1 = time.perf_counter()
        d_cont = self.disc.score_shared_prefix(self.tokens, self.lengths, c.tokens, c.lengths, torch.arange(1, T),
                                               batch_size=self.bs)
        t2 = time.perf_counter()
        d_full = self.disc.score(self.tokens, self.lengths, batch_size=self.bs)
        q = q_values(d_cont.view(B, T - 1, N), d_full, self.lengths)
        t3 = time.perf_counter()
        if key:
            self.q[key] = q.numpy()
        return {"search_s": t1 - t0, "score_s": t2 - t1, "rest_s": t3 - t2}

    @torch.no_grad()
    def lower_bound(self) -> dict:
        """R = B·N·(T−1) rows, T/2 decoder steps each from the all-zero state (the prefix pass is left out),
        the search's step: decoder, then the fused output projection + banned-id bias + inverse-CDF sampler;
        then one prefix-shared D pass over (b)'s continuations."""
        g = self.gen
        R, steps = self.B * self.N * (self.T - 1), self.T // 2
        t0 = time.perf_counter()
        u = torch.rand(steps, R, generator=torch.Generator().manual_seed(SEED))
        h = g.encode(torch.zeros(R, 0, dtype=torch.long), torch.zeros(R, dtype=torch.long))
        y = torch.full((R,), g.bos_id, dtype=torch.long)
        bias = g.out.bias + g.logit_bias
        for p in range(steps):
            out, h = g.decoder(g.embedding(y).unsqueeze(1), h)
            y = sample_projected(out[:, 0], g.out.weight, bias, u[p])
        t1 = time.perf_counter()
        self.disc.score_shared_prefix(self.tokens, self.lengths, self.cont, self.cont_len, torch.arange(1, self.T),
                                      batch_size=self.bs)
        t2 = time.perf_counter()
        return {"search_s": t1 - t0, "score_s": t2 - t1, "rest_s": 0.0}


class RayRows:
    """One set of Ray actor groups per (workers, scorers) layout, weights and D synced once before timing."""

    def __init__(self, base: list[str], layouts: list[tuple[int, int]], rollout, n_rollouts: int):
        from rayseq.distributed.groups import ActorGroups
        from rayseq.distributed.groups.placement import bundles
        from rayseq.distributed.runtime import init_ray

        os.environ.setdefault("RAY_worker_niceness", "0")  # Ray starts workers at nice 15 by default
        self.cfgs = {
            (n, m): build_config(None, base + [
                f"rollout.num_workers={n}", f"scorer.num_scorers={m}", f"rollout.num_cpus_per_worker={CPU_PER_ACTOR}",
                f"scorer.num_cpus_per_scorer={CPU_PER_ACTOR}", f"learner.num_cpus={LEARNER_CPUS}",
                "rollout.torch_threads=1", "scorer.torch_threads=1",
            ])
            for n, m in layouts
        }
        self.logical_cpus = sum(b["CPU"] for c in self.cfgs.values() for b in bundles(c))
        t0 = time.perf_counter()
        self.started = init_ray(min_cpus=self.logical_cpus, log_to_driver=False)
        self.rts = {}
        try:
            for layout, cfg in self.cfgs.items():
                rt = ActorGroups(cfg)
                self.rts[layout] = rt
                rt.rollout.sync_weights()
                rt.scorer.sync_weights()
        except BaseException:
            self.shutdown()
            raise
        self.startup_s = time.perf_counter() - t0
        self.rollout, self.n_rollouts = rollout, n_rollouts
        self.q = {}

    def mc_q(self, layout: tuple[int, int], key: str | None = None) -> dict:
        t0 = time.perf_counter()
        rt = self.rts[layout]
        pending = rt.rollout.run_on_shards(mc_continuations, self.rollout.split(layout[0]), self.n_rollouts, 1.0,
                                           seed=SEED)
        refs, infos = rt.scorer.run_on_pending(score_continuations, pending)
        info = {"mc_s": max(i["mc_s"] for i in infos), "score_s": max(i["score_s"] for i in infos)}
        q = concat_columns(rt.fetch(refs), self.rollout.tokens.shape[1])  # the per-shard Q, fetched for the check
        wall = time.perf_counter() - t0
        if key:
            self.q[key] = q
        # mc_s, score_s: the slowest worker's search and the slowest scorer call; with fewer scorers than
        # workers one scorer's calls run one after the other, so the overhead below includes the extra calls
        return {"mc_s": info["mc_s"], "score_s": info["score_s"],
                "overhead_s": wall - info["mc_s"] - info["score_s"]}

    def shutdown(self) -> None:
        import ray

        for rt in self.rts.values():
            rt.shutdown()
        if self.started:
            ray.shutdown()


def run_rows(rows: list[Row]) -> None:
    """Warm every row up, then time them round-robin: repeat r of every row before repeat r + 1 of any."""
    for row in rows:
        if row.threads:
            torch.set_num_threads(row.threads)
        t0 = time.perf_counter()
        row.warmup()
        print(f"  warm-up {row.name}: {time.perf_counter() - t0:.2f} s", file=sys.stderr, flush=True)
    for r in range(max(row.repeats for row in rows)):
        for row in rows:
            if r >= row.repeats:
                continue
            if row.threads:
                torch.set_num_threads(row.threads)
            t0 = time.perf_counter()
            phases = row.fn()
            row.times.append(time.perf_counter() - t0)
            row.phases.append(phases)
            print(f"  run {r + 1} {row.name}: {row.times[-1]:.2f} s", file=sys.stderr, flush=True)


def pct(x: float, total: float) -> str:
    return f"{100 * x / total:.0f}%"


def report(rows: list[Row], s: dict, args, ray_rows: RayRows | None, inproc: InProcess, load: dict) -> tuple[str, dict]:
    by = {r.key: r for r in rows}
    a2, a1 = by["a"], by["a1"]
    a_best = min(a2, a1, key=lambda r: r.median)
    B, T, N, V = s["B"], s["T"], s["N"], s["V"]
    n_cont, n_tok = B * (T - 1) * N, B * N * T * (T - 1) // 2
    lines = [
        f"# SeqGAN Monte-Carlo rewards per generator update{' (QUICK smoke test, not a result)' if args.quick else ''}",
        "",
        f"B = {B} sequences, T = {T}, N = {N} rollouts, V = {V:,}, LSTM G emb 32 / hidden 32, CNN D "
        f"{'(small)' if args.quick else '(paper size: 12 filter sizes, 1,720 features)'}: {n_cont:,} continuations "
        f"and {n_tok:,} sampled tokens per update. Seconds per update (the whole Q (B, T)). "
        f"{os.cpu_count()} CPU cores (load average {load['before']:.1f} before, "
        f"{load['after']:.1f} after), OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; rows interleaved "
        f"round-robin, {args.repeats} timed runs per row after one "
        f"warm-up (plain loop: {args.loop_repeats} runs, warm-up with N = 1).",
        "",
        "| row | threads / actors | min s | median s | speedup vs (a) 2 threads | speedup vs fastest (a) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r.label} | {r.setting} | {min(r.times):.2f} | {r.median:.2f} | "
                     f"{a2.median / r.median:.2f}x | {a_best.median / r.median:.2f}x |")
    best = min((r for r in rows if r.key.startswith(("b", "c"))), key=lambda r: r.median)
    speedup = a_best.median / best.median

    def split(r: Row) -> tuple[float, float, float]:
        return tuple(r.phase_median(k) for k in ("search_s", "score_s", "rest_s"))

    notes = ["", "## Where the time goes", ""]
    for a, b, d in ((a1, by["b1"], by["d1"]), (a2, by["b"], by["d"])):
        (a_s, a_d, _), (b_s, b_d, b_r), (d_s, d_d, _) = split(a), split(b), split(d)
        notes += [
            f"- {a.setting}: (a) plain loop {a.median:.1f} s = search {a_s:.1f} s ({pct(a_s, a.median)}: "
            f"{N * (T - 1)} prefix re-runs, {N * (T - 1) * T:,} decoder steps of {B} rows, each with a (B, V) "
            f"output projection, prefix steps included, and softmax + torch.multinomial) + D {a_d:.1f} s "
            f"({pct(a_d, a.median)}: {N * (T - 1)} calls of {B} sequences). "
            f"(b) batched {b.median:.1f} s = search {b_s:.1f} s ({pct(b_s, b.median)}) + D over all continuations "
            f"{b_d:.1f} s ({pct(b_d, b.median)}) + D(Y) and q_values {b_r:.3f} s; against (a) the search is "
            f"{a_s / b_s:.1f}x faster (no prefix re-runs, inverse-CDF sampler fused with the output projection, "
            f"{T - 1} batched steps) and D {a_d / b_d:.1f}x (the same {n_cont:,} sequences in "
            f"{-(-n_cont // inproc.bs)} chunk(s) instead of {N * (T - 1)} calls, and each prefix's windows "
            f"convolved once for its {N} continuations): {a.median / b.median:.1f}x in all. "
            f"(d) lower bound {d.median:.1f} s = sampling {d_s:.1f} s + D {d_d:.1f} s: the search's bookkeeping "
            f"(joining prefixes, cached-state gathers, scatters into the continuations) costs {b_s - d_s:+.1f} s "
            f"({b_s / d_s:.2f}x the bare sampling); what remains is the V = {V:,} output projection and the "
            "sampler's exp / cumsum / search over V for every token, and D's convolutions of the windows that "
            "reach past each prefix plus its highway layer on every continuation."
        ]
    slow = a2.median / a1.median
    notes.append(
        f"- Threads: 2 threads take {slow:.2f}x the time of 1 for (a), {by['b'].median / by['b1'].median:.2f}x "
        f"for (b), {by['d'].median / by['d1'].median:.2f}x for (d) (0.5 would be a perfect split). The plain loop's "
        f"ops on {B} rows are too small to split; the batched rows' large ops can use a second core only when "
        "other users leave one free."
        + (" Above 1: every oneDNN LSTM / convolution call is a parallel region that waits for its second thread "
           "whenever that thread is descheduled; the 1-thread rows and the 1-thread Ray actors are the stable "
           "comparison." if slow > 1.2 else "")
    )
    ray_json = []
    if ray_rows is not None:
        for r in rows:
            if not r.key.startswith("c"):
                continue
            mc, sc, ov = (r.phase_median(k) for k in ("mc_s", "score_s", "overhead_s"))
            ray_json.append({"name": r.name, "wall_s": r.median, "worker_mc_s": mc, "scorer_score_s": sc,
                             "overhead_s": ov})
            notes.append(
                f"- (c) Ray, {r.setting}: {r.median:.2f} s = slowest worker's search {mc:.2f} s + slowest scorer "
                f"call {sc:.2f} s + transfer / overhead {ov:+.2f} s (wall − both)."
            )
        notes.append(
            "  Overhead = wall − max worker mc_s − max scorer score_s: a scorer serving two workers scores their "
            "shards one after the other, which counts here as overhead; a shard scored while the other is still "
            f"searched makes it smaller. Ray start-up (not timed in the rows): {ray_rows.startup_s:.1f} s for "
            f"{len(ray_rows.rts)} runtime(s); Ray had {ray_rows.logical_cpus:g} logical CPUs so that they coexist "
            f"on {os.cpu_count()} cores (actors {CPU_PER_ACTOR} CPU each, 1 torch thread; learner idle)."
        )
    notes.append(
        f"- Best of (b), (c): {best.name} at {best.median:.2f} s: {speedup:.1f}x faster than the fastest plain loop "
        f"({a_best.name}), {a2.median / best.median:.1f}x faster than (a) at 2 threads; target {TARGET:g}x "
        f"{'met' if speedup >= TARGET else 'NOT met'}."
    )
    # every oracle sequence has T tokens (no end token), so Q[:, T−1] = D(Y) in every row
    qs = {**inproc.q, **(ray_rows.q if ray_rows else {})}
    q_check = max(float(np.abs(q[:, -1] - qs["b"][:, -1]).max()) for q in qs.values())
    means = {k: float(q[:, :-1].mean()) for k, q in qs.items()}
    notes += [
        f"- Check: Q[:, T] = D(Y) agrees across rows to {q_check:.1e}; mean Q over t < T per row: "
        + ", ".join(f"{k} {v:.4f}" for k, v in means.items()) + " (independent random continuations).",
        "- (d) lower bound = a floor for this algorithm on this hardware, not an alternative: R = B·N·(T−1) rows "
        "decoded for T/2 steps from one state with the search's step (decoder, output projection, inverse-CDF "
        "sampler), the same token count as the search without per-prefix joins or scatters, plus one D pass over "
        "the search's continuations with the prefix-shared D.",
    ]
    table = "\n".join(lines + notes)
    payload = {
        "rows": [{"key": r.key, "name": r.name, "label": r.label, "setting": r.setting, "threads": r.threads,
                  "median_s": r.median, "min_s": min(r.times), "times_s": r.times,
                  "speedup_vs_plain_loop_2_threads": a2.median / r.median,
                  "speedup_vs_fastest_plain_loop": a_best.median / r.median,
                  "phases_median_s": {k: r.phase_median(k) for k in (r.phases[0] if r.phases else {})}}
                 for r in rows],
        "speedup_vs_plain_loop": speedup,
        "speedup_vs_plain_loop_note": "fastest plain-loop row (1 or 2 threads) / best median of (b), (c)",
        "speedup_vs_plain_loop_2_threads": a2.median / best.median,
        "speedup_same_threads": {"1": a1.median / by["b1"].median, "2": a2.median / by["b"].median},
        "best_row": best.name,
        "sizes": {**s, "quick": args.quick, "continuations": n_cont, "tokens_sampled": n_tok},
        "repeats": args.repeats,
        "loop_repeats": args.loop_repeats,
        "load_average": load,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "ray": ray_json,
        "ray_startup_s": ray_rows.startup_s if ray_rows else None,
        "q_last_column_max_abs_diff": q_check,
        "q_mean": means,
    }
    return table, payload


def layout(text: str) -> tuple[int, int]:
    """``"2x1"`` -> (2 rollout workers, 1 scorer)."""
    n, m = (int(x) for x in text.split("x"))
    if n < 1 or m < 1:
        raise ValueError(text)
    return n, m


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="timed runs per row after one warm-up (default 3)")
    p.add_argument("--loop-repeats", type=int, default=None, help="timed runs of the plain loop (default --repeats)")
    p.add_argument("--quick", action="store_true", help="smoke test: B=8, N=4, V=500, small D; *_quick files")
    p.add_argument("--no-ray", action="store_true", help="skip the Ray rows (c)")
    p.add_argument("--ray-layouts", nargs="+", type=layout, default=None, metavar="WxS",
                   help="Ray rows as workers x scorers (default 1x1 2x1 2x2; --quick: 2x2)")
    p.add_argument("--json", type=Path, default=None, help="write the JSON here (and the table next to it, .md)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args()
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    args.loop_repeats = args.repeats if args.loop_repeats is None else args.loop_repeats
    if args.loop_repeats < 1:
        p.error("--loop-repeats must be >= 1")
    if args.json is not None and args.json.suffix != ".json":
        p.error(f"--json must name a .json file, got {args.json}")
    s = QUICK if args.quick else PAPER
    layouts = args.ray_layouts or ([(2, 2)] if args.quick else [(1, 1), (2, 1), (2, 2)])
    load = {"before": os.getloadavg()[0]}
    base = overrides(s, args.quick)
    inproc = InProcess(build_config(None, base + ["rollout.num_workers=0"]), s)

    def threads(th: int) -> str:
        return f"{th} thread{'s' if th > 1 else ''}"

    rows = []
    for key, th in (("a", 2), ("a1", 1)):
        rows.append(Row(key, "(a) plain loop", threads(th), lambda k=key: inproc.plain_loop(key=k),
                        lambda: inproc.plain_loop(n=1), th, args.loop_repeats))
    for key, th in (("b", 2), ("b1", 1)):
        rows.append(Row(key, "(b) batched cached, in-process", threads(th), lambda k=key: inproc.batched(key=k),
                        inproc.batched, th, args.repeats))
    ray_rows = None
    try:
        if not args.no_ray:
            ray_rows = RayRows(base, layouts, inproc.rollout, s["N"])
            for n, m in layouts:
                key = f"c{n}x{m}"
                rows.append(Row(key, "(c) batched, Ray actors",
                                f"{n} worker{'s' if n > 1 else ''} + {m} scorer{'s' if m > 1 else ''}",
                                lambda k=key, lay=(n, m): ray_rows.mc_q(lay, key=k),
                                lambda lay=(n, m): ray_rows.mc_q(lay), None, args.repeats))
        for key, th in (("d", 2), ("d1", 1)):
            rows.append(Row(key, "(d) lower bound", threads(th), inproc.lower_bound, inproc.lower_bound, th,
                            args.repeats))
        run_rows(rows)
    finally:
        if ray_rows is not None:
            ray_rows.shutdown()
    load["after"] = os.getloadavg()[0]
    table, payload = report(rows, s, args, ray_rows, inproc, load)
    if args.json is not None:
        out, name = args.json.parent, args.json.stem
    else:
        out, name = args.out, "rollout_throughput_quick" if args.quick else "rollout_throughput"
    write_report(out, name, table, payload)


if __name__ == "__main__":
    main()
