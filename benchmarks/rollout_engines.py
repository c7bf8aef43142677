"""Rollout engines side by side on the CPU: tokens/s of the built-in HF sampler against vLLM (rayseq.engines), and
the time of one weights sync through Ray's object store against a gloo broadcast (``ray.util.collective``).

Generation (``--part generate``): two local GPT-2-shaped models built from config with random weights and the tiny
test tokenizer (400 tokens; tests/hf_fixtures.py): ``tiny`` (2 layers × 32, one head: the vLLM tests' model) and
``gpt2-12x768`` (12 layers × 768, 12 heads, 85M parameters). Each cell samples ``rows`` completions of up to
``--max-tokens`` tokens (no early end: the end token is banned for the measurement, so every cell decodes the same
number of tokens) at temperature 1, as ``rows / G`` prompts of 16 tokens × G completions each (G = 1, or 8 as
GRPO's groups); vLLM with prefix caching on and off (the G copies of a prompt share its prefill when on). The HF
sampler is :meth:`HFCausalLM.sample` on the G-times repeated prompts (what a rollout worker runs). float32 both,
``torch_threads`` threads. One warm-up per engine, then ``--repeats`` timed runs of each cell, interleaved; median
tokens/s = generated tokens / wall seconds.

Weight sync (``--part sync``): a learner actor and ``--receivers`` receiving actors; per model size the float32 and
bfloat16 state dict of the GPT-2 shape goes to every receiver (a) as today: ``FlatWeights.pack`` into the object
store, each receiver fetches and unpacks it; (b) over a gloo group: the learner broadcasts the same bytes in buckets
of ``--bucket-mb``, each receiver into preallocated buffers. Median seconds of ``--repeats`` syncs, from the call to
every receiver holding its copy.

    .venv-vllm/bin/python benchmarks/rollout_engines.py                  # both parts, ~15 min on 2 cores
    .venv-vllm/bin/python benchmarks/rollout_engines.py --part generate --repeats 2
    .venv-vllm/bin/python benchmarks/rollout_engines.py --part sync

Needs the vllm extra (an environment of its own: pip install -e ".[vllm]"). Writes
``benchmarks/results/rollout_engines.{md,json,png}``. GPU figures belong to the GPU suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

MODELS = {"tiny": {"n_embd": 32, "n_layer": 2, "n_head": 1},
          "gpt2-12x768": {"n_embd": 768, "n_layer": 12, "n_head": 12}}
PROMPT_LEN = 16


def build_model(root: Path, name: str) -> Path:
    """The tiny tokenizer with a randomly initialised GPT-2 of ``MODELS[name]``'s shape, saved in ``root/name``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.hf_fixtures import make_tiny_hf

    out = make_tiny_hf(root / name, n_head=1)
    shape = MODELS[name]
    if name != "tiny":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=len(tok), n_positions=256, **shape, bos_token_id=tok.bos_token_id,
                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        GPT2LMHeadModel(config).save_pretrained(out)
    return out


def prompts(vocab_size: int, n: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab_size, (n, PROMPT_LEN), generator=g)
    return src, torch.full((n,), PROMPT_LEN)


def generate_part(args) -> list[dict]:
    import torch

    from rayseq.data.hf_text import HFVocab
    from rayseq.engines.vllm_engine import VLLMEngine
    from rayseq.models.hf import HFCausalLM

    torch.set_num_threads(args.torch_threads)
    rows_out = []
    root = Path(tempfile.mkdtemp(prefix="rollout_engines_"))
    for name in args.models:
        path = build_model(root, name)
        vocab = HFVocab(str(path))
        # the end token banned too: every completion runs to max_tokens, so each cell decodes the same tokens
        policy = HFCausalLM(str(path), vocab.specials, vocab_size=len(vocab)).eval()
        policy.banned_ids = (*policy.banned_ids, vocab.specials.eos)
        policy.logit_bias[vocab.specials.eos] = float("-inf")
        engines = {"hf": None}
        for caching in (True, False):
            engines[f"vllm prefix={'on' if caching else 'off'}"] = VLLMEngine(
                path, separator_id=vocab.specials.bos, eos_id=vocab.specials.eos, banned_ids=policy.banned_ids,
                vocab_size=policy.vocab_size, seed=0, policy=policy,
                engine_kwargs={"enable_prefix_caching": caching, "kv_cache_memory_bytes": 2 << 30,
                               "max_num_seqs": 256})
        cells = [(engine_name, rows, G) for rows in args.rows for G in args.groups if rows >= G
                 for engine_name in engines]

        def run(engine_name, rows, G, seed, policy=policy, engines=engines):
            return sample_once(policy, engines[engine_name], rows, G, seed, args.max_tokens)

        for cell in dict.fromkeys((e, min(args.rows), 1) for e in engines):  # warm-up
            run(*cell, seed=99)
        times = {cell: [] for cell in cells}
        for r in range(args.repeats):  # interleaved: the machine's other load hits every cell alike
            for cell in cells:
                tokens, seconds = run(*cell, seed=r)
                times[cell].append((tokens, seconds))
                print(name, cell, f"{tokens / seconds:.0f} tok/s", flush=True)
        for (engine_name, rows, G), runs in times.items():
            rows_out.append({"model": name, "engine": engine_name, "rows": rows, "G": G,
                             "tokens": runs[0][0], "tok_per_s": statistics.median(t / s for t, s in runs),
                             "seconds": statistics.median(s for _, s in runs)})
    return rows_out


def sample_once(policy, engine, rows: int, G: int, seed: int, max_tokens: int) -> tuple[float, float]:
    """(generated tokens, wall seconds) of ``rows`` completions as rows / G prompts × G, by ``engine`` (None: the
    policy's own sampler on the repeated prompts)."""
    import torch

    src, src_len = prompts(policy.vocab_size, rows // G, seed)
    t0 = time.perf_counter()
    if engine is None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            out = policy.sample(src.repeat_interleave(G, 0), src_len.repeat_interleave(G, 0), max_tokens,
                                generator=gen)
    else:
        out = engine.generate(src, src_len, max_tokens, n=G, seed=seed)
    return float(out.token_mask.sum()), time.perf_counter() - t0


def sync_part(args) -> list[dict]:
    import ray
    import torch

    ray.init(num_cpus=args.receivers + 1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo"}})

    @ray.remote(num_cpus=1)
    class Member:
        def __init__(self, rank, world, group):
            import ray.util.collective as col

            torch.set_num_threads(1)
            col.init_collective_group(world, rank, backend="gloo", group_name=group)
            self.group, self.rank = group, rank
            self.state = None

        def make(self, name, dtype):
            from transformers import GPT2Config, GPT2LMHeadModel

            shape = MODELS[name]
            torch.manual_seed(0)
            model = GPT2LMHeadModel(GPT2Config(vocab_size=400, n_positions=256, **shape)).to(getattr(torch, dtype))
            self.state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
            return sum(v.numel() * v.element_size() for v in self.state.values())

        def pack(self):
            from rayseq.distributed.weights.flat import FlatWeights

            return FlatWeights.pack({"generator": self.state})

        def fetch(self, weights):
            from rayseq.distributed.weights.flat import as_state_dicts

            state = as_state_dicts(weights)["generator"]
            return float(sum(v.double().sum() for v in state.values()))

        def buckets(self, bucket_bytes):
            """The state dict as flat byte buckets of about ``bucket_bytes``, as the learner sends them (the same
            layout on every member)."""
            from rayseq.distributed.weights.collective import buckets

            return buckets(self.state, bucket_bytes)

        def broadcast(self, bucket_bytes):
            import ray.util.collective as col

            bufs = self.buckets(bucket_bytes) if self.rank == 0 else [torch.empty_like(b) for b in
                                                                       self.buckets(bucket_bytes)]
            t0 = time.perf_counter()
            for b in bufs:
                col.broadcast(b, src_rank=0, group_name=self.group)
            seconds = time.perf_counter() - t0
            return seconds, float(sum(b.double().sum() for b in bufs))

    rows = []
    world = args.receivers + 1
    members = [Member.remote(r, world, "sync") for r in range(world)]
    bucket = int(args.bucket_mb * (1 << 20))
    for name in args.models:
        for dtype in ("float32", "bfloat16"):
            nbytes = ray.get([m.make.remote(name, dtype) for m in members])[0]
            ray.get([m.broadcast.remote(bucket) for m in members])  # warm-up: the group's first connection
            store, collective = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                ref = members[0].pack.remote()
                ray.get([m.fetch.remote([ref]) for m in members[1:]])
                store.append(time.perf_counter() - t0)
                del ref
                t0 = time.perf_counter()
                out = ray.get([m.broadcast.remote(bucket) for m in members])
                collective.append(time.perf_counter() - t0)
                assert len({s for _, s in out}) == 1  # every receiver holds the learner's bytes
            for how, secs in (("object store", store), ("gloo broadcast", collective)):
                rows.append({"model": name, "dtype": dtype, "bytes": nbytes, "how": how, "receivers": args.receivers,
                             "seconds": statistics.median(secs)})
                print(rows[-1], flush=True)
    ray.shutdown()
    return rows


def table(gen: list[dict], sync: list[dict]) -> str:
    lines = []
    if gen:
        lines += ["### Generation, tokens/s (median; float32, CPU)", "",
                  "| model | completions | G | HF sampler | vLLM, prefix caching on | vLLM, prefix caching off | "
                  "vLLM (on) / HF |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        cells = {}
        for r in gen:
            cells.setdefault((r["model"], r["rows"], r["G"]), {})[r["engine"]] = r["tok_per_s"]
        for (model, rows, G), by in cells.items():
            hf, on, off = by.get("hf"), by.get("vllm prefix=on"), by.get("vllm prefix=off")
            lines.append(f"| {model} | {rows} | {G} | {hf:.0f} | {on:.0f} | {off:.0f} | {on / hf:.1f}× |")
    if sync:
        lines += ["", "### One weights sync, seconds (median), learner → receivers", "",
                  "| model | dtype | MB | receivers | object store (today) | gloo broadcast | store / broadcast |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        cells = {}
        for r in sync:
            cells.setdefault((r["model"], r["dtype"], r["bytes"], r["receivers"]), {})[r["how"]] = r["seconds"]
        for (model, dtype, nbytes, n), by in cells.items():
            store, bcast = by["object store"], by["gloo broadcast"]
            lines.append(f"| {model} | {dtype} | {nbytes / 2**20:.1f} | {n} | {store:.3f} | {bcast:.3f} | "
                         f"{store / bcast:.1f}× |")
    return "\n".join(lines)


def plot(gen: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in gen))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4))
    axes = [axes] if len(models) == 1 else axes
    for ax, model in zip(axes, models):
        for engine in dict.fromkeys(r["engine"] for r in gen):
            for G, style in ((1, "-"), (8, "--")):
                pts = sorted((r["rows"], r["tok_per_s"]) for r in gen
                             if r["model"] == model and r["engine"] == engine and r["G"] == G)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", label=f"{engine}, G={G}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("completions per call")
        ax.set_ylabel("generated tokens / s")
        ax.set_title(f"{model} (CPU, float32)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("generate", "sync", "both"), default="both")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--rows", nargs="+", type=int, default=[16, 64, 256])
    p.add_argument("--groups", nargs="+", type=int, default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--torch-threads", type=int, default=2)
    p.add_argument("--receivers", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=64.0)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = p.parse_args(argv)
    gen = []
    if args.part in ("generate", "both"):
        if len(args.models) == 1:
            gen = generate_part(args)
        else:  # one process per model: a process's vLLM engines share its global parallel state, torn down with them
            for name in args.models:
                with tempfile.TemporaryDirectory() as tmp:
                    cmd = [sys.executable, __file__, "--part", "generate", "--models", name, "--out", tmp,
                           "--rows", *map(str, args.rows), "--groups", *map(str, args.groups),
                           "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats),
                           "--torch-threads", str(args.torch_threads)]
                    subprocess.run(cmd, check=True)
                    gen += json.loads((Path(tmp) / "rollout_engines.json").read_text())["generate"]
    sync = sync_part(args) if args.part in ("sync", "both") else []
    from benchmarks._report import write_report

    old = {}
    # a part run alone keeps the other part's figures
    if (args.out / "rollout_engines.json").exists() and args.part != "both":
        old = json.loads((args.out / "rollout_engines.json").read_text())
    gen, sync = gen or old.get("generate", []), sync or old.get("sync", [])
    write_report(args.out, "rollout_engines", table(gen, sync), {"generate": gen, "sync": sync, "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}})
    if gen:
        plot(gen, args.out / "rollout_engines.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
