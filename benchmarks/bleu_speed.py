"""Speed of the vectorised sentence BLEU-2 reward against sacrebleu's ``sentence_score`` in a Python loop.

The batch is shaped like chatbot rollouts (Tuan et al. 2018, chatbot experiment: BLEU-2 of each sampled response
against all references of its input): ``--n`` responses of 1..20 tokens as a padded (B, 20) array with
lengths, as the generator returns them; 1..8 references of 1..20 tokens per response as int arrays; ids
from a Zipf law (p(k) ∝ 1/k) over a 4,000-token vocabulary, so that n-grams overlap as in real text.

Timed, each ``--repeats`` times on the same batch (median and min reported):
  rayseq sentence_bleu        rayseq.rewards.sentence_bleu(tokens, refs, hyp_len=lengths), end to end
  sacrebleu (ids -> str)      per sentence: join the ids with spaces, then BLEU.sentence_score
  sacrebleu (str prebuilt)    per sentence: BLEU.sentence_score only, the strings built beforehand
Both compute the same numbers (the max |difference| is printed); the speedups are over the rayseq row.

Command   python benchmarks/bleu_speed.py [--n 5000] [--repeats 5] [--seed 0] [--json PATH]
Time      about 8 s on the 2-core development machine with the defaults (sacrebleu takes most of it).
Writes    the table to stdout; with --json PATH, the timings, batch statistics, command, date and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rayseq.rewards.bleu import sentence_bleu  # noqa: E402

VOCAB = 4000  # id 0 is padding, so responses and references use ids 1..3999
MAX_LEN = 20
MAX_REFS = 8


def make_batch(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[list[np.ndarray]]]:
    """tokens (n, MAX_LEN) int64 padded with 0, lengths (n,), refs: n lists of 1..MAX_REFS id arrays."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, VOCAB)
    p /= p.sum()

    def ids(size: int) -> np.ndarray:
        return rng.choice(np.arange(1, VOCAB), size=size, p=p)

    lengths = rng.integers(1, MAX_LEN + 1, size=n)
    tokens = np.zeros((n, MAX_LEN), dtype=np.int64)
    tokens[np.arange(MAX_LEN) < lengths[:, None]] = ids(int(lengths.sum()))
    refs = [[ids(int(rng.integers(1, MAX_LEN + 1))) for _ in range(rng.integers(1, MAX_REFS + 1))] for _ in range(n)]
    return tokens, lengths, refs


def timed(fn, repeats: int) -> tuple[list[float], object]:
    """Wall seconds of ``repeats`` calls of ``fn`` and its last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=5000, help="responses in the batch (default: 5000)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per method (default: 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this path")
    args = p.parse_args()

    from sacrebleu.metrics import BLEU

    bleu = BLEU(max_ngram_order=2, tokenize="none", effective_order=True)
    tokens, lengths, refs = make_batch(args.n, args.seed)

    def join(ids: np.ndarray) -> str:
        return " ".join(map(str, ids.tolist()))

    def sacre_from_ids() -> np.ndarray:
        scores = [
            bleu.sentence_score(join(row[:n]), [join(r) for r in rs]).score for row, n, rs in zip(tokens, lengths, refs)
        ]
        return np.array(scores) / 100

    hyp_str = [join(row[:n]) for row, n in zip(tokens, lengths)]
    ref_str = [[join(r) for r in rs] for rs in refs]

    def sacre_prebuilt() -> np.ndarray:
        return np.array([bleu.sentence_score(h, rs).score for h, rs in zip(hyp_str, ref_str)]) / 100

    sentence_bleu(tokens[:10], refs[:10], hyp_len=lengths[:10])  # warm-up (first-call imports and allocations)
    methods = {
        "rayseq sentence_bleu": lambda: sentence_bleu(tokens, refs, hyp_len=lengths),
        "sacrebleu (ids -> str)": sacre_from_ids,
        "sacrebleu (str prebuilt)": sacre_prebuilt,
    }
    results, scores = {}, {}
    for name, fn in methods.items():
        times, scores[name] = timed(fn, args.repeats)
        results[name] = {"times_s": times, "median_s": statistics.median(times), "min_s": min(times)}
    ours = results["rayseq sentence_bleu"]
    max_diff = max(float(np.abs(scores[k] - scores["rayseq sentence_bleu"]).max()) for k in scores)
    for r in results.values():
        r["sentences_per_s"] = args.n / r["median_s"]
        r["speedup_median"] = r["median_s"] / ours["median_s"]
        r["speedup_min"] = r["min_s"] / ours["min_s"]

    n_refs = np.array([len(rs) for rs in refs])
    batch = {
        "n": args.n,
        "seed": args.seed,
        "vocab": VOCAB,
        "hyp_len_mean": float(lengths.mean()),
        "refs_per_hyp_mean": float(n_refs.mean()),
        "ref_tokens": int(sum(len(r) for rs in refs for r in rs)),
        "bleu2_mean": float(scores["rayseq sentence_bleu"].mean()),
        "bleu2_nonzero_share": float((scores["rayseq sentence_bleu"] > 0).mean()),
        "max_abs_diff_vs_sacrebleu": max_diff,
    }
    lines = [
        f"Sentence BLEU-2 of {args.n} responses (1..{MAX_LEN} tokens, Zipf ids over {VOCAB}, "
        f"{batch['refs_per_hyp_mean']:.2f} refs/response on average); {args.repeats} repeats; "
        f"mean BLEU-2 {batch['bleu2_mean']:.4f} ({100 * batch['bleu2_nonzero_share']:.1f}% > 0); "
        f"max |rayseq − sacrebleu| = {max_diff:.1e}",
        "",
        "| method | median s | min s | sentences/s | speedup of rayseq (median) | speedup (min) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['median_s']:.4f} | {r['min_s']:.4f} | {r['sentences_per_s']:,.0f} "
            f"| {r['speedup_median']:.1f}x | {r['speedup_min']:.1f}x |"
        )
    table = "\n".join(lines)
    print(table)
    if args.json is not None:
        meta = {
            "command": " ".join(sys.argv),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"benchmark": "bleu_speed", "batch": batch, "results": results, "table": table, **meta}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    if max_diff > 1e-6:
        sys.exit(f"error: rayseq and sacrebleu differ by {max_diff:.2e}")


if __name__ == "__main__":
    main()
