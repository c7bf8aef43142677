"""What the driver sends a rollout worker per sampling, and what an actor does with the dataset before its first
sample, for a task whose prompts are rows of its data (``pairs``, ``chitchat``):

- ``send``: one sampling through the real ``RolloutGroup.sample`` (waited for, ``ActorManager`` as in a run) on N
  light stand-in actors (``num_cpus=0``, no torch) that hold a table of token rows as a worker's task holds its data
  (one table in the object store, read by every stand-in without a copy). The batch goes out as token arrays (a batch
  that is not keyed) or as its keys (``PromptBatch.compact`` -> ``PromptKeys``, what a keyed batch sends): the
  stand-ins rebuild the rows from the keys, as a worker's task does (``prompt_rows``), inside the timed call. Batches
  of B prompts of S tokens with targets of S tokens (what an MLE batch carries; a sampling batch has no targets and
  half the arrays). Timed: the driver process's CPU (``time.process_time``: its Python thread and Ray's threads in it)
  and the wall clock of the sampling; the bytes are the pickled size of what the calls carry. Arrays and keys
  alternate within each repeat; figures are medians.
- ``start``: the chitchat corpus as ``python -m rayseq.data prepare chitchat`` prepares it (85k rows), loaded and
  re-tokenised by a Hugging Face tokenizer as every rollout worker, scorer and learner does when it builds the task:
  encoded (no ``retokenized/`` file yet) against the ids read back from the file the first process wrote
  (:func:`rayseq.data.hf_text.retokenized`), the ids compared bit for bit. The tokenizer is the tests' byte-level BPE
  (``tests/hf_fixtures.py``) trained on the corpus's first messages; a pretrained tokenizer's vocabulary is larger
  (fewer tokens per row, a little less to encode).

Run book (from the repository root):

    python benchmarks/prompt_data.py            # both parts: results/prompt_data.{md,json}, about 3 minutes
    python benchmarks/prompt_data.py --quick    # a smoke run (tests/benchmarks run it)

Memory: the table (rows x S x 2 int64) once in the object store; the start part about 1 GB (the corpus, its ids).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.driver_fanin import NoPlacement, StandIn, stand_in_config  # noqa: E402  (after the path set-up)


def row_table(rows: int, width: int, seed: int = 0) -> dict:
    """A task's data as arrays: ``rows`` inputs and targets of ``width`` tokens (random ids), full length."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {"src": rng.integers(4, 4000, (rows, width), dtype=np.int64),
            "tgt": rng.integers(4, 4000, (rows, width), dtype=np.int64),
            "len": np.full(rows, width, dtype=np.int64)}


def prompt_rows(table: dict, key, with_targets: bool):
    """The rows ``key`` of ``table`` as a keyed PromptBatch (as ``PairsTask.prompt_rows`` builds them)."""
    from rayseq.types import PromptBatch

    batch = PromptBatch(table["src"][key], table["len"][key], key=key, keyed=True)
    if with_targets:
        batch.tgt, batch.tgt_len = table["tgt"][key], table["len"][key]
    return batch


class KeyedStandIn(StandIn):
    """A stand-in worker holding the task's table (one object-store copy, shared): sampling a shard of keys rebuilds
    its rows first, as a worker's task does; a shard of arrays is used as it came."""

    def __init__(self, table: dict):
        self.table = table  # the arrays read from the object store without a copy

    def sample_shard(self, prompts, request, score: bool = True, weights=None, version: int = -1,
                     report_score: bool = False) -> tuple:
        from rayseq.types import PromptKeys

        if isinstance(prompts, PromptKeys):
            prompts = prompt_rows(self.table, prompts.key, prompts.with_targets)
        return int(prompts.src.sum() % 7), {"rows": len(prompts), "sample_s": 0.0}


def rollout_group(ray, manager, actors: list):
    """The real RolloutGroup over ``actors`` (no scorers: the workers score), with a published weights ref."""
    from rayseq.distributed.groups import RolloutGroup, ScorerGroup

    cfg = stand_in_config(len(actors), scored_remotely=False)
    group = RolloutGroup(cfg, None, ScorerGroup(cfg, None, manager=manager, actors=[]), manager=manager,
                         actors=actors)
    group.publish(ray.put({"w": 0}), 1)
    return group


def measure_send(ray, actors: list, table: dict, sizes: list[tuple[int, int]], repeats: int) -> list[dict]:
    """Median driver CPU and wall ms of one sampling of each (B, S), arrays and keys alternating."""
    import numpy as np

    from rayseq.distributed.groups.manager import ActorManager
    from rayseq.types import RolloutRequest

    group = rollout_group(ray, ActorManager(ray, NoPlacement()), actors)
    request = RolloutRequest(max_len=8, seed=1)
    rng = np.random.default_rng(0)
    rows = []
    for batch, width in sizes:
        view = {k: v[:, :width] if v.ndim == 2 else v for k, v in table.items()}
        keyed = prompt_rows(view, rng.integers(0, len(table["len"]), batch), with_targets=True)
        forms = {"arrays": dataclasses.replace(keyed, keyed=False), "keys": keyed}  # the same rows, sent whole
        sent = {name: sum(len(pickle.dumps(s.compact(), protocol=5)) for s in p.split(len(actors)))
                for name, p in forms.items()}
        for p in forms.values():  # warm-up: the stand-ins' first calls of this shape
            group.sample(p, request)
        times: dict = {name: ([], []) for name in forms}
        for rep in range(repeats):
            for name in (("arrays", "keys") if rep % 2 == 0 else ("keys", "arrays")):
                c0, t0 = time.process_time(), time.perf_counter()
                shards = group.sample(forms[name], request)
                ray.get(shards)
                times[name][0].append((time.process_time() - c0) * 1e3)
                times[name][1].append((time.perf_counter() - t0) * 1e3)
        for name, (cpus, walls) in times.items():
            rows.append({"batch": batch, "tokens": width, "form": name, "actors": len(actors),
                         "sent_bytes": sent[name], "cpu_ms": statistics.median(cpus),
                         "wall_ms": statistics.median(walls), "cpu_ms_all": cpus, "wall_ms_all": walls})
            print(f"send B={batch:5d} S={width:4d} {name:6s} {sent[name] / 1024:10.1f} KiB  driver cpu "
                  f"{rows[-1]['cpu_ms']:8.2f} ms  wall {rows[-1]['wall_ms']:8.2f} ms", flush=True)
    return rows


def measure_start(work: Path, repeats: int, quick: bool) -> dict:
    """Seconds to build the chitchat task's data on a Hugging Face tokenizer: encoded vs read back (medians)."""
    import numpy as np

    from rayseq.data.dataset import DialogueData
    from rayseq.data.hf_text import RETOKENIZED, HFVocab, retokenized
    from rayseq.data.preparation import PrepareOptions, prepare
    from tests.hf_fixtures import make_tiny_hf

    data_dir = work / "chitchat"
    source = "chitchat"
    if quick:  # a few hundred rows of the tests' corpus instead
        from tests.conftest import write_corpus

        source = f"jsonl:{write_corpus(work / 'pairs.jsonl')}"
    prepare(source, data_dir, PrepareOptions(quiet=True, **({"valid_frac": 0.1, "test_frac": 0.2} if quick else {})))
    vocab = HFVocab(str(make_tiny_hf(work / "tokenizer", vocab_size=1000)))
    words = DialogueData.load(data_dir)
    rows = sum(len(s) for s in words.splits.values())
    times: dict = {"encode_s": [], "read_s": [], "load_s": []}
    ids = {}
    for _ in range(repeats):
        shutil.rmtree(data_dir / RETOKENIZED, ignore_errors=True)
        t0 = time.perf_counter()
        words = DialogueData.load(data_dir)
        times["load_s"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ids["encoded"] = retokenized(words, vocab, data_dir)  # no file: encoded (and written)
        times["encode_s"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ids["read"] = retokenized(words, vocab, data_dir)
        times["read_s"].append(time.perf_counter() - t0)
    same = all(np.array_equal(getattr(ids["encoded"].splits[n], f), getattr(ids["read"].splits[n], f))
               for n in words.splits for f in ("src", "src_len", "tgt", "tgt_len"))
    (kept,) = (data_dir / RETOKENIZED).iterdir()
    out = {"rows": rows, "file_bytes": kept.stat().st_size, "identical": same,
           **{k: statistics.median(v) for k, v in times.items()}, "all": times}
    print(f"start: {rows} rows, load {out['load_s']:.2f} s, encode {out['encode_s']:.2f} s, read back "
          f"{out['read_s']:.3f} s ({out['file_bytes'] / 2**20:.0f} MiB), identical: {same}", flush=True)
    out["fit"] = [fit_in_child(data_dir, vocab.path, context) for context in ((256 if quick else 1024), 0)]
    return out


def fit_in_child(data_dir: Path, tokenizer: str, context: int) -> dict:
    """The task's arrays built from the kept ids in a fresh process (``--fit-child``), for a model of ``context``
    positions (0: none): its seconds, peak memory over the loaded corpus and the bytes the arrays hold."""
    import json
    import subprocess

    done = subprocess.run([sys.executable, __file__, "--fit-child", str(data_dir), tokenizer, str(context)],
                          check=True, capture_output=True, text=True, cwd=REPO)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"fit: {context or 'no'} positions: {out['seconds']:.2f} s, peak {out['peak_mib']:.0f} MiB over the "
          f"corpus, arrays {out['held_mib']:.0f} MiB ({out['width']} tokens wide); 512 rows taken in "
          f"{out['batch_ms_held']:.2f} ms ({out['batch_ms_padded']:.2f} ms padded)", flush=True)
    return out


def peak_rss_mib() -> float:
    """This process's peak resident memory (``VmHWM``: ``ru_maxrss`` keeps the forking parent's peak across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def fit_child(data_dir: str, tokenizer: str, context: int) -> None:
    import json

    import numpy as np

    from rayseq.data.dataset import DialogueData
    from rayseq.data.hf_text import HFVocab, retokenized

    words = DialogueData.load(data_dir)
    vocab = HFVocab(tokenizer)
    before = peak_rss_mib()
    t0 = time.perf_counter()
    data = retokenized(words, vocab, data_dir, context or None)
    seconds = time.perf_counter() - t0
    peak = peak_rss_mib() - before
    held = sum(getattr(s, f).nbytes for s in data.splits.values() for f in ("src", "src_len", "tgt", "tgt_len"))
    out = {"context": context, "seconds": seconds, "peak_mib": peak, "held_mib": held / 2**20,
           "width": data.max_src_len}
    # what the layout costs a run: a batch's rows taken (as prompt_rows takes them) and the task's references,
    # from the rows as held and from the same rows padded in memory
    train = data.splits["train"]
    padded = dataclasses.replace(train, src=np.asarray(train.src), tgt=np.asarray(train.tgt))
    batches = np.random.default_rng(0).integers(0, len(train), (20, 512))
    for name, split in (("held", train), ("padded", padded)):
        times = []
        for rows in batches:
            t0 = time.perf_counter()
            split.src[rows], split.tgt[rows]
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        split.references()
        out[f"batch_ms_{name}"], out[f"references_s_{name}"] = statistics.median(times) * 1e3, time.perf_counter() - t0
    print(json.dumps(out))


def table_md(send: list[dict], start: dict | None, footprint: dict) -> str:
    lines = ["# What the driver sends per sampling, and what an actor does with the data before its first sample", "",
             f"`python benchmarks/prompt_data.py`: {footprint['actors']} stand-in rollout workers (`num_cpus=0`, no "
             "torch), the real `RolloutGroup.sample`; B prompts of S tokens with targets of S tokens; medians of "
             f"{len(send[0]['cpu_ms_all']) if send else 0} alternating repeats. Driver CPU: `time.process_time` of the "
             "driver process. Keys: the workers rebuild the rows inside the timed call.", "",
             "| B × S | arrays: sent | keys: sent | arrays: driver CPU | keys: driver CPU | CPU ratio | arrays: wall "
             "| keys: wall | wall ratio |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    by = {(r["batch"], r["tokens"], r["form"]): r for r in send}
    for batch, width in sorted({(r["batch"], r["tokens"]) for r in send}):
        a, k = by[(batch, width, "arrays")], by[(batch, width, "keys")]
        lines.append(f"| {batch:,} × {width} | {a['sent_bytes'] / 1024:,.0f} KiB | {k['sent_bytes'] / 1024:,.1f} KiB "
                     f"| {a['cpu_ms']:.1f} ms | {k['cpu_ms']:.1f} ms | {a['cpu_ms'] / k['cpu_ms']:.1f} "
                     f"| {a['wall_ms']:.1f} ms | {k['wall_ms']:.1f} ms | {a['wall_ms'] / k['wall_ms']:.1f} |")
    if start:
        lines += ["", f"Building the chitchat task on a Hugging Face tokenizer ({start['rows']:,} rows; medians of "
                  f"{len(start['all']['encode_s'])}):", "",
                  "| step | seconds |", "| --- | ---: |",
                  f"| the prepared corpus loaded (every actor, before and after) | {start['load_s']:.2f} |",
                  f"| its ids encoded by the tokenizer (every actor, before; the first process now) | "
                  f"{start['encode_s']:.2f} |",
                  f"| its ids read back from `retokenized/` ({start['file_bytes'] / 2**20:.0f} MiB; every other "
                  f"process now) | {start['read_s']:.3f} |",
                  "", f"Read-back ids identical to the encoded ones: {start['identical']}."]
        lines += ["", "The task's arrays built from the kept ids (a fresh process each; peak: `VmHWM` over the "
                  "loaded corpus; 512 random training rows' inputs and replies taken as held and from the same rows "
                  "padded in memory, medians of 20; the task's references of every training group):", "",
                  "| model positions | input width | seconds | peak memory | arrays held | 512 rows: held | "
                  "512 rows: padded | references: held | references: padded |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for f in start.get("fit", []):
            lines.append(f"| {f['context'] or 'none (a tokenizer alone)'} | {f['width']:,} | {f['seconds']:.2f} | "
                         f"{f['peak_mib']:,.0f} MiB | {f['held_mib']:,.0f} MiB | {f['batch_ms_held']:.2f} ms | "
                         f"{f['batch_ms_padded']:.2f} ms | {f['references_s_held']:.2f} s | "
                         f"{f['references_s_padded']:.2f} s |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--fit-child"]:  # fit_in_child's process
        fit_child(argv[1], argv[2], int(argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--actors", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--parts", nargs="+", choices=["send", "start"], default=["send", "start"])
    ap.add_argument("--quick", action="store_true", help="a smoke run: small batches, the tests' corpus")
    args = ap.parse_args(argv)
    import ray

    from benchmarks._report import write_report

    sizes = [(64, 16), (256, 64)] if args.quick else [(256, 128), (1024, 128), (1024, 512), (4096, 512)]
    actors_n, repeats = (2, 3) if args.quick else (args.actors, args.repeats)
    send, start, footprint = [], None, {"actors": actors_n}
    if "send" in args.parts:
        started = ray.is_initialized()
        if not started:
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        try:
            table = row_table(4096 if args.quick else 16384, max(w for _, w in sizes))
            ref = ray.put(table)
            actors = [ray.remote(num_cpus=0)(KeyedStandIn).remote(ref) for _ in range(actors_n)]
            ray.get([a.pid.remote() for a in actors])
            send = measure_send(ray, actors, table, sizes, repeats)
            footprint.update(with_torch=sum(f["torch"] for f in ray.get([a.footprint.remote() for a in actors])))
            for a in actors:
                ray.kill(a)
        finally:
            if not started:
                ray.shutdown()
    if "start" in args.parts:
        with tempfile.TemporaryDirectory() as work:
            start = measure_start(Path(work), 2 if args.quick else 3, args.quick)
    name = "prompt_data_quick" if args.quick else "prompt_data"
    write_report(args.out, name, table_md(send, start, footprint),
                 {"send": send, "start": start, "footprint": footprint, "sizes": sizes})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
