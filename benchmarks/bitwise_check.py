"""Refactor guard: short in-process runs of several configurations, their metrics and a SHA-256 of every tensor
of the final checkpoint, written to a folder; ``--compare A B`` says which configurations are bit-identical.

Same seed -> same metrics and weights is the promise of a refactor. Timings (``time/*``)
and the run's wall clock differ from run to run and are left out; everything else is compared exactly.

    PYTHONPATH=$PWD python benchmarks/bitwise_check.py --out /tmp/before            # on the old code
    PYTHONPATH=$PWD python benchmarks/bitwise_check.py --out /tmp/after             # on the new code
    python benchmarks/bitwise_check.py --compare /tmp/before /tmp/after

``--only NAME[,NAME]`` runs a subset; ``--list`` names the configurations. The HF configuration needs the hf
extra (transformers); it is skipped, and says so, without it. ``--workers N`` runs them on N Ray rollout workers
(and a scorer actor) instead: compared with an in-process folder, that is the Ray path's parity (shard seeds make a
1-worker run sample what the in-process run samples); ``driver/recv_bytes``, which only Ray runs have, is left out.
``--learners N`` (with ``--workers``) runs the data-parallel algorithms' configurations on N learner ranks. The
configurations that need Ray actors (two FSDP learner ranks, the collective weight sync) are skipped in-process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TINY = ["model.emb_dim=16", "model.hidden_dim=32", "task.test_size=100", "train.pretrain_iters=6",
        "train.pretrain_batch_size=16", "train.iters=4", "train.batch_size=16", "train.eval_every=2",
        "progress=false", "rollout.num_workers=0", "seed=3", "train.checkpoint_every=5"]
ORACLE = ["task.name=oracle", "task.vocab_size=60", "task.oracle_hidden=8", "task.seq_len=6", "task.num_train=300",
          "task.test_size=100", "task.eval_samples=200", "model.cell=lstm", "model.emb_dim=8", "model.hidden_dim=16",
          "train.pretrain_iters=6", "train.pretrain_batch_size=32", "train.pretrain_lr=1e-2", "train.iters=3",
          "train.batch_size=16", "train.eval_every=2", "progress=false", "algo.lr=1e-2", "algo.mc_rollouts=3",
          "disc.emb_dim=8", "disc.filter_sizes=[1,2,3]", "disc.num_filters=[4,4,4]", "disc.pretrain_steps=2",
          "disc.d_steps=1", "disc.epochs=1", "disc.num_negatives=32", "disc.batch_size=16",
          "rollout.num_workers=0", "seed=5"]
PAIRS = ["task.name=pairs", "task.test_size=100", "task.val_size=10", "model.emb_dim=16", "model.hidden_dim=32",
         "train.pretrain_iters=4", "train.pretrain_batch_size=16", "train.iters=3", "train.batch_size=16",
         "train.eval_every=2", "rollout.num_workers=0", "progress=false", "seed=2"]
HF = ["task.name=pairs", "task.test_size=100", "task.val_size=10", "train.pretrain_iters=2",
      "train.pretrain_batch_size=8", "train.iters=2", "train.batch_size=8", "train.eval_every=2",
      "algo.minibatch_size=8", "rollout.num_workers=0", "progress=false", "seed=1"]

# name -> (overrides, needs): needs "corpus" (a prepared pairs folder) and/or "hf" (a tiny GPT-2)
CONFIGS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "counting_ppo_dynamic": (TINY + ["algo.name=ppo_dynamic", "algo.minibatch_size=8"], ()),
    "counting_ppo_dynamic_pipeline": (TINY + ["algo.name=ppo_dynamic", "algo.minibatch_size=8",
                                              "rollout.pipeline=true"], ()),
    "counting_grpo": (TINY + ["algo.name=grpo", "algo.group_size=4"], ()),
    "counting_rloo": (TINY + ["algo.name=rloo", "algo.group_size=4"], ()),
    "counting_grpo_dynamic_sampling": (TINY + ["algo.name=grpo", "algo.group_size=4", "algo.dynamic_sampling=true",
                                               "algo.max_resample_rounds=2", "algo.eps_high=0.28"], ()),
    "counting_seqgan_ppo_dynamic": (TINY + ["algo.name=seqgan_ppo_dynamic", "algo.minibatch_size=8",
                                            "algo.mc_rollouts=2", "algo.rollout_update_rate=0.8",
                                            "disc.pretrain_steps=2", "disc.d_steps=2", "disc.epochs=1",
                                            "disc.num_negatives=32", "algo.g_steps=2"], ()),
    "oracle_seqgan": (ORACLE + ["algo.name=seqgan"], ()),
    "counting_seqgan_critic": (TINY + ["algo.name=seqgan_critic", "algo.critic_warmup=1", "disc.pretrain_steps=1",
                                       "disc.num_negatives=32", "disc.epochs=1"], ()),
    "counting_seqgan_ppo_same_policy": (TINY + ["algo.name=seqgan_ppo", "algo.minibatch_size=8", "algo.mc_rollouts=2",
                                                "algo.rollout_update_rate=0", "disc.pretrain_steps=1", "disc.d_steps=1",
                                                "disc.epochs=1", "disc.num_negatives=32"], ()),
    "counting_actor_critic": (TINY + ["algo.name=actor_critic", "algo.critic_warmup=1"], ()),
    "counting_mixer_ppo": (TINY + ["algo.name=mixer_ppo", "algo.minibatch_size=8"], ()),
    "counting_reinforce_kl": (TINY + ["algo.name=reinforce", "algo.kl_coef=0.05", "algo.entropy_coef=0.01"], ()),
    "counting_mle": (TINY + ["algo.name=mle"], ()),
    "counting_raml": (TINY + ["algo.name=raml"], ()),
    "pairs_ppo": (PAIRS + ["algo.name=ppo", "algo.minibatch_size=8"], ("corpus",)),
    "pairs_scst": (PAIRS + ["algo.name=scst"], ("corpus",)),
    "pairs_erpo_interpolation": (PAIRS + ["algo.name=erpo_interpolation", "algo.interp_val_every=1"], ("corpus",)),
    "hf_ppo_dynamic": (HF + ["algo.name=ppo_dynamic", "algo.kl_coef=0.05"], ("corpus", "hf")),
    "counting_ppo_staleness2": (TINY + ["algo.name=ppo", "algo.minibatch_size=8", "rollout.max_staleness=2",
                                        "algo.kl_coef=0.05"], ()),
    # these run only on Ray actors (--workers N): two FSDP learner ranks, the collective weight sync
    "counting_ppo_fsdp": (TINY + ["algo.name=ppo", "algo.minibatch_size=8", "algo.kl_coef=0.05",
                                  "learner.num_learners=2", "learner.strategy=fsdp"], ("ray",)),
    "hf_ppo_dynamic_fsdp": (HF + ["algo.name=ppo_dynamic", "algo.kl_coef=0.05", "learner.num_learners=2",
                                  "learner.strategy=fsdp"], ("corpus", "hf", "ray")),
    "counting_grpo_collective": (TINY + ["algo.name=grpo", "algo.group_size=4", "rollout.weight_sync=collective",
                                         "rollout.max_staleness=1"], ("ray",)),
}


def _digest(value, h) -> None:
    """Feed ``value`` (nested dicts / lists of tensors, arrays, numbers, strings) into hash ``h``."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, np.ndarray):
        h.update(f"A{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(f"K{k}".encode())
            _digest(value[k], h)
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        for v in value:
            _digest(v, h)
    else:
        h.update(repr(value).encode())


def sharded_entries(location: str) -> dict:
    """A sharded learner's modules and optimizers (its ``torch.distributed.checkpoint`` directory at ``location``),
    read whole: ``{name: state dict, name.optim: optimizer state}``."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from rayseq.checkpoint import read_directory

    with tempfile.TemporaryDirectory(prefix="bitwise-dcp-") as tmp:
        local = Path(tmp) / "dcp"
        local.mkdir()
        read_directory(location, local)
        dcp_to_torch_save(local, Path(tmp) / "whole.pt")
        return torch.load(Path(tmp) / "whole.pt", weights_only=False)


def tensor_hashes(ck: dict) -> dict:
    """SHA-256 of each entry of the checkpoint's learner state (model, optimizers, RNG, and each entry of the
    algorithm's own state: its modules, e.g. the discriminator or the critic, and counters) and of the driver state
    (data RNG, position). The algorithm's entries are hashed one by one as ``learner.<name>``, wherever the
    checkpoint keeps them (a checkpoint written before algorithms owned their modules has them at the top level); a
    sharded learner's modules and optimizers as ``learner.dcp.<name>``, read from its shards (not the directory's
    name, which is the run's)."""
    out = {}
    for section in ("learner", "driver"):
        entries = dict(ck[section])
        if section == "learner" and isinstance(entries.get("algo"), dict):
            entries.update(entries.pop("algo"))
        if section == "learner" and isinstance(entries.get("dcp"), str):
            entries.update({f"dcp.{k}": v for k, v in sharded_entries(entries.pop("dcp")).items()})
        for k, v in entries.items():
            h = hashlib.sha256()
            _digest(v, h)
            out[f"{section}.{k}"] = h.hexdigest()
    return out


def _clean(v):
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return v


RAY = ["scorer.num_scorers=1", "learner.num_cpus=0.5", "rollout.num_cpus_per_worker=0.5",
       "scorer.num_cpus_per_scorer=0.5"]


def run_one(name: str, out: Path, corpus: Path | None, hf_dir: Path | None, workers: int = 0,
            learners: int = 1) -> dict:
    import pyarrow.parquet as pq

    from rayseq.checkpoint import load_checkpoint
    from rayseq.config import build_config
    from rayseq.distributed.driver import Trainer

    overrides, _ = CONFIGS[name]
    extra = [f"task.data={corpus}"] if corpus is not None else []
    extra += ["model.arch=hf", f"model.path={hf_dir}"] if hf_dir is not None else []
    extra += [f"rollout.num_workers={workers}", *RAY] if workers else []
    extra += [f"learner.num_learners={learners}"] if learners > 1 else []
    with tempfile.TemporaryDirectory(prefix=f"bitwise-{name}-") as tmp:
        run_dir = Path(tmp) / "run"
        summary = Trainer(build_config(None, [*overrides, *extra, f"run_dir={run_dir}"])).run()
        rows = pq.read_table(run_dir / "metrics.parquet").to_pylist()
        tensors = tensor_hashes(load_checkpoint(summary["checkpoint"]))
    rows = [{k: _clean(v) for k, v in r.items() if not k.startswith("time/") and k != "driver/recv_bytes"}
            for r in rows]
    record = {"name": name, "rows": rows, "final": {k: _clean(v) for k, v in summary["metrics"].items()},
              "tensors": tensors, "workers": workers, "learners": learners}
    (out / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True, default=str))
    return record


def _fixtures(needs: set, root: Path) -> tuple[Path | None, Path | None]:
    corpus = hf_dir = None
    if "corpus" in needs:
        from rayseq.data.preparation import PrepareOptions, prepare
        from tests.conftest import write_corpus

        corpus = root / "prepared"
        if not corpus.exists():
            prepare(f"jsonl:{write_corpus(root / 'pairs.jsonl')}", corpus,
                    PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.2, seed=0))
    if "hf" in needs:
        from tests.conftest import GREETINGS, REPLIES, TOPICS
        from tests.hf_fixtures import make_tiny_hf

        hf_dir = root / "tiny-gpt2"
        if not hf_dir.exists():
            make_tiny_hf(hf_dir, extra_lines=tuple(GREETINGS + REPLIES + TOPICS) * 5)
    return corpus, hf_dir


def _data_parallel(name: str) -> bool:
    """Whether configuration ``name``'s algorithm runs on several learner ranks."""
    from rayseq import registry

    algo = next(o.split("=", 1)[1] for o in CONFIGS[name][0] if o.startswith("algo.name="))
    return registry.algorithm_class(algo).data_parallel


def _renamed(row: dict) -> dict:
    """A metrics row with its stage as this version names it (the algorithm's own pretraining stage was ``disc``)."""
    from rayseq.algos.iteration import stage_name

    return {**row, "stage": stage_name(row["stage"])} if "stage" in row else row


def compare(a: Path, b: Path, add_ok: bool = False, removed_ok: tuple[str, ...] = ()) -> int:
    """Prints which configurations of folders ``a`` and ``b`` are bit-identical; non-zero if any is not.
    ``add_ok``: a metrics column that ``b``'s row has and ``a``'s lacks is listed, not counted as a difference (a
    counter the newer code also writes in rows that had none). ``removed_ok``: checkpoint entries (``learner.<name>``)
    that ``a`` has and ``b`` lacks are listed, not counted (state the newer code no longer keeps)."""
    names = sorted({p.stem for p in a.glob("*.json")} | {p.stem for p in b.glob("*.json")})
    bad = 0
    print(f"{'configuration':34s} {'rows':>5s} {'metrics':>8s} {'tensors':>8s}  result")
    for name in names:
        pa, pb = a / f"{name}.json", b / f"{name}.json"
        if not (pa.exists() and pb.exists()):
            print(f"{name:34s} {'':>5s} {'':>8s} {'':>8s}  missing in {'A' if not pa.exists() else 'B'}")
            bad += 1
            continue
        ra, rb = json.loads(pa.read_text()), json.loads(pb.read_text())
        diffs, added = [], {}
        if len(ra["rows"]) != len(rb["rows"]):
            diffs.append(f"{len(ra['rows'])} vs {len(rb['rows'])} rows")
        for i, (x, y) in enumerate(zip(map(_renamed, ra["rows"]), map(_renamed, rb["rows"]))):
            for k in sorted(set(x) | set(y)):
                if x.get(k) is None and y.get(k) is not None and add_ok:  # a column only B's row fills: listed
                    added[k] = added.get(k, 0) + 1
                elif x.get(k) != y.get(k):
                    diffs.append(f"row {i} {k}: {x.get(k)} vs {y.get(k)}")
        for k in sorted(set(ra["final"]) | set(rb["final"])):
            if ra["final"].get(k) != rb["final"].get(k):
                diffs.append(f"final {k}: {ra['final'].get(k)} vs {rb['final'].get(k)}")
        # under Ray the driver's Python `random` state is also drawn by Ray itself (two runs of the same code differ):
        # the in-process records compare it
        ray = ra.get("workers") or rb.get("workers")
        removed = []
        for k in sorted(set(ra["tensors"]) | set(rb["tensors"])):
            if k == "driver.python_rng" and ray:
                continue
            if k in removed_ok and k in ra["tensors"] and k not in rb["tensors"]:
                removed.append(k)
            elif ra["tensors"].get(k) != rb["tensors"].get(k):
                diffs.append(f"tensor {k} differs")
        ncols = len({k for r in ra["rows"] for k in r})
        print(f"{name:34s} {len(ra['rows']):5d} {ncols:8d} {len(ra['tensors']):8d}  "
              f"{'identical' if not diffs else 'DIFFERENT'}"
              + (f" (B adds {', '.join(f'{k} in {n} rows' for k, n in added.items())})" if added else "")
              + (f" (B no longer keeps {', '.join(removed)})" if removed else ""))
        for d in diffs[:8]:
            print(f"    {d}")
        bad += bool(diffs)
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--only", default="")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--compare", nargs=2, type=Path)
    ap.add_argument("--allow-added-columns", action="store_true",
                    help="with --compare: metrics columns only B's rows have are listed, not differences")
    ap.add_argument("--allow-removed-tensors", default="", metavar="ENTRY[,ENTRY]",
                    help="with --compare: checkpoint entries (learner.<name>) only A has are listed, not differences")
    ap.add_argument("--workers", type=int, default=0, help="Ray rollout workers (0: in-process)")
    ap.add_argument("--learners", type=int, default=1,
                    help="learner ranks (with --workers; only the data-parallel algorithms' configurations run)")
    ap.add_argument("--fixtures", type=Path, default=Path(tempfile.gettempdir()) / "rayseq-bitwise-fixtures")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(CONFIGS))
        return 0
    if args.compare:
        return compare(*args.compare, add_ok=args.allow_added_columns,
                       removed_ok=tuple(k for k in args.allow_removed_tensors.split(",") if k))
    if args.out is None:
        ap.error("--out DIR (or --compare A B, --list)")
    names = [n for n in args.only.split(",") if n] or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; --list names them")
    import torch

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    args.fixtures.mkdir(parents=True, exist_ok=True)
    for name in names:
        needs = set(CONFIGS[name][1])
        if "ray" in needs and not args.workers:
            print(f"{name}: skipped (runs on Ray actors: --workers N)")
            continue
        if args.learners > 1 and not _data_parallel(name):
            print(f"{name}: skipped (not data-parallel)")
            continue
        if "hf" in needs:
            try:
                import transformers  # noqa: F401
            except ImportError:
                print(f"{name}: skipped (no transformers)")
                continue
        corpus, hf_dir = _fixtures(needs, args.fixtures)
        for attempt in range(3):  # a loaded machine: Ray's node may not start within its fixed 30 s; try again
            try:
                rec = run_one(name, args.out, corpus, hf_dir, args.workers, args.learners)
                break
            except Exception as exc:
                if "timed out during startup" not in str(exc) or attempt == 2:
                    raise
                print(f"{name}: Ray did not start ({exc}); again", flush=True)
        print(f"{name}: {len(rec['rows'])} rows, {len(rec['tensors'])} tensors hashed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
