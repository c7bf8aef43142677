"""A sharded learner's start (``learner.strategy=fsdp`` over two ranks, gloo, each rank a process of its own): rank 1
builds the generator on the ``meta`` device (no whole copy, an HF policy's weights not read) and receives its shards
from rank 0's as the modules are sharded; every rank builds the KL reference on the ``meta`` device. Against the
same two ranks each building the whole modules (``Learner(cfg, rank=0)`` on both: the start every rank made before),
each rank holds the same shards, buffers and RNG state after the start, after an MLE update, once π_ref is taken and
after a PPO update with the KL penalty, exactly; and a sharded checkpoint of the run resumes into learners started
the new way to the same state. The built-in GRU and Transformer, a Hugging Face Llama (rotary frequencies: buffers
outside any state dict) and its LoRA policy (frozen base weights outside the policy's state dict)."""

from __future__ import annotations

import shutil
import socket

import numpy as np
import pytest
import torch

LLAMA = ("task.name=pairs", "model.arch=hf", "task.test_size=100", "task.val_size=10")
PPO_KL = ("algo.name=ppo", "algo.minibatch_size=8", "algo.kl_coef=0.1", "train.batch_size=16",
          "learner.strategy=fsdp", "learner.num_learners=2")
CASES = {"gru": (), "transformer": ("model.arch=transformer",), "llama": LLAMA,
         "llama_lora": (*LLAMA, "model.lora_r=4", "model.lora_target_modules=[q_proj,v_proj]")}


def _held(learner) -> dict:
    """What this rank holds: each module's parameters (its shards) and buffers, each optimizer's state, the RNG."""
    from rayseq.distributed.actors.sharding import is_sharded

    def local(t):
        return (t.to_local() if is_sharded(t) else t).detach().cpu().clone()

    out = {f"{m}.{n}": local(t) for m, module in learner.modules().items()
           for n, t in (*module.named_parameters(), *module.named_buffers())}
    for name, opt in learner.optimizers().items():
        for i, st in enumerate(opt.state.values()):
            out.update({f"{name}.{i}.{k}": local(v) for k, v in st.items() if isinstance(v, torch.Tensor)})
    out["torch_rng"] = torch.get_rng_state()
    return out


def _one_rank(rank: int, ports: list[int], overrides: tuple, out: str) -> None:
    """Rank ``rank`` of both starts (whole on every rank, then from rank 0), the same updates after each; the second
    run's checkpoint resumed into a third start. Writes what it held at each point to ``out``/rank{rank}.pt."""
    import torch.distributed as dist

    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.actors.worker import RolloutWorker
    from rayseq.types import RolloutRequest
    from tests.conftest import tiny_config

    cfg = tiny_config(*overrides)

    def start(built_rank: int, port: int) -> tuple:
        learner = Learner(cfg, built_rank)
        meta = any(p.device.type == "meta" for p in learner.state.generator.parameters())
        learner.join_data_parallel(rank, 2, "127.0.0.1", port, 120.0)
        return learner, meta

    record = {}
    for way, built_rank, port in (("whole", 0, ports[0]), ("from_rank0", rank, ports[1])):
        learner, record[f"{way}.meta"] = start(built_rank, port)
        record[f"{way}.start"] = _held(learner)
        rng = np.random.default_rng(0)
        learner.update(learner.task.sample_prompts(rng, 16, with_targets=True), 0)  # MLE
        learner.start_stage("train")  # π_ref taken
        record[f"{way}.train"] = _held(learner)
        weights = [learner.get_weights()]  # a collective: rank 0's whole, sampled by both ranks alike
        dist.broadcast_object_list(weights, src=0)
        worker = RolloutWorker(cfg)
        worker.set_weights(weights[0], learner.version)
        rollout = worker.sample(learner.task.sample_prompts(rng, 16), RolloutRequest(max_len=6, seed=1))
        record[f"{way}.metrics"] = learner.update(rollout, 0)
        record[f"{way}.update"] = _held(learner)
        if way == "from_rank0":  # its checkpoint: every rank its shards, rank 0 the rest and the head
            path = [_checkpoint(learner, f"{out}/run")]
        dist.destroy_process_group()
    learner, record["resumed.meta"] = start(rank, ports[2])
    dist.broadcast_object_list(path, src=0)
    learner.restore(path[0])
    record["resumed.update"] = _held(learner)
    dist.destroy_process_group()
    torch.save(record, f"{out}/rank{rank}.pt")


def _checkpoint(learner, run_dir: str) -> str | None:
    """The learners' state written as a run's checkpoint (a collective: every rank its files; rank 0 then the head
    over every rank's files, as the driver writes it). The head's path on rank 0, None on the others."""
    import torch.distributed as dist

    from rayseq.checkpoint import FORMAT, checkpoint_stem, save_checkpoint
    from rayseq.config import config_to_dict

    written = learner.save(run_dir, checkpoint_stem(1))
    every = [None, None]
    dist.all_gather_object(every, written)
    if dist.get_rank():
        return None
    head = {"format": FORMAT, "config": config_to_dict(learner.cfg), "task": learner.task.spec(),
            "learner": {"generator": written["generator"], "state": written["state"]},
            "driver": {"iteration": 1, "stage": learner.stage, "stage_iter": 0}}
    return save_checkpoint(run_dir, 1, head, files={k: v for w in every for k, v in w["files"].items()})


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _assert_same(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k}"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_ranks_started_from_rank0_hold_what_ranks_that_built_the_whole_model_hold(tmp_path, corpus, hf_dir, case):
    import torch.multiprocessing as mp

    overrides = (*CASES[case], *PPO_KL)
    if case.startswith("llama"):
        overrides = (*overrides, f"task.data={corpus}", f"model.path={_tiny_llama(hf_dir, tmp_path / 'llama')}")
    mp.start_processes(_one_rank, args=(_ports(3), overrides, str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        # rank 1 built no whole generator (the layout alone); rank 0, and every rank of the old start, did
        assert (got["whole.meta"], got["from_rank0.meta"], got["resumed.meta"]) == (False, rank == 1, rank == 1)
        for point in ("start", "train", "update"):
            _assert_same(got[f"whole.{point}"], got[f"from_rank0.{point}"], f"rank {rank} at {point}")
        assert got["whole.metrics"] == got["from_rank0.metrics"]
        assert got["whole.metrics"]["kl/per_token"] != 0  # π_ref read, and the policy moved from it
        held = got["from_rank0.update"]
        if case != "llama_lora":
            assert any(k.startswith("ref_policy.") for k in held)  # the sharded reference, compared above
        if case == "llama":
            assert any(k.endswith("rotary_emb.inv_freq") for k in held)  # a buffer outside any state dict
        resumed = {k: v for k, v in got["resumed.update"].items() if k != "torch_rng"}
        _assert_same({k: held[k] for k in resumed}, resumed, f"rank {rank} resumed")
        assert resumed.keys() == held.keys() - {"torch_rng"}


def _tiny_llama(hf_dir, out) -> str:
    """A tiny Llama (rotary positions, grouped-query attention) with the tiny GPT-2's tokenizer, random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shutil.copytree(hf_dir, out)
    gpt2 = __import__("json").loads((out / "config.json").read_text())
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=gpt2["vocab_size"], hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=128, tie_word_embeddings=True, bos_token_id=1,
                                 eos_token_id=2, pad_token_id=0)).save_pretrained(out)
    return str(out)


class _Rows(torch.nn.Module):
    """Rows that split evenly over two ranks, unevenly (5: 3 + 2), one row (1 + 0), and a buffer."""

    def __init__(self):
        super().__init__()
        self.even, self.odd = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5, 2))
        self.one = torch.nn.Parameter(torch.randn(1, 6))
        self.register_buffer("freq", torch.randn(7), persistent=False)


def _fill_on_two_ranks(rank: int, port: int, out: str) -> None:
    import os

    import torch.distributed as dist

    from rayseq.distributed.actors.sharding import fill_from_rank0, materialize, shard_modules

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        if rank == 0:
            module = _Rows()
            whole = {n: p.detach() for n, p in module.named_parameters()}
        else:
            with torch.device("meta"):
                module = _Rows()
            whole = {}
        shard_modules({"m": module}, 2, torch.device("cpu"), dtype=torch.float32)
        if rank:
            materialize(module, torch.device("cpu"))
        fill_from_rank0(module, whole)
        torch.save({**{n: p.to_local().clone() for n, p in module.named_parameters()}, "freq": module.freq.clone()},
                   f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_each_rank_receives_the_rows_torch_chunk_gives_it_and_every_buffer(tmp_path):
    """:func:`~rayseq.distributed.actors.sharding.fill_from_rank0` over two ranks (gloo), rank 1 built on the meta
    device: each parameter's shard is ``torch.chunk(whole, 2)[rank]`` (FSDP2's split: 5 rows as 3 + 2, 1 row as
    1 + none), each buffer rank 0's whole."""
    import torch.multiprocessing as mp

    mp.start_processes(_fill_on_two_ranks, args=(_ports(1)[0], str(tmp_path)), nprocs=2, start_method="spawn")
    torch.manual_seed(0)
    whole = _Rows()
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for name, p in whole.named_parameters():
            chunks = torch.chunk(p.detach(), 2)
            want = chunks[rank] if rank < len(chunks) else p.detach()[:0]
            assert torch.equal(got[name], want), (rank, name)
        assert torch.equal(got["freq"], whole.freq)
