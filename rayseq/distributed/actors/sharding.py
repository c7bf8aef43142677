"""The sharded learner's helpers (``learner.strategy=fsdp``, :class:`~.strategies.FSDP`): FSDP2
(``torch.distributed.fsdp.fully_shard``) over the learner ranks' process group (gloo on CPU device meshes, NCCL on
GPUs), and what it changes around the update.

Every module the learner trains is sharded: the generator (each decoder layer of a Hugging Face policy on its own,
then the rest at the root; a built-in policy at its root), the value baseline and the modules the algorithm declares
(``Algorithm.build_modules``). Each rank holds 1/N of their parameters, gradients and Adam moments; the parameters are
gathered around each forward (the policy's phase methods are registered as forwards: ``logprobs``, ``sample``, ...) and
the gradients reduce-scattered after backward. The update itself stays :mod:`rayseq.algos.parallel`'s: each rank its
rows of every minibatch, its losses scaled by its share of the denominators, the shares' gradients **summed** (the
reduce-scatter sums instead of averaging), so N ranks make the update one learner makes.

What reads the full parameters is a collective: every rank takes part in publishing weights (:func:`full_tensors`),
evaluating and checkpointing (``torch.distributed.checkpoint``: :func:`save_sharded`, :func:`load_sharded`, which
reshard to any number of ranks, one included). ``model.dtype=bfloat16`` computes in bf16 with fp32 master weights and
gradient reduction (``MixedPrecisionPolicy``); ``learner.cpu_offload`` keeps parameters and optimizer state in host
memory (GPU learners).

References: torch FSDP2 (``fully_shard``, ``torch.distributed.checkpoint.state_dict``); veRL's and OpenRLHF's FSDP
workers (a policy's decoder layers wrapped one by one, the root last).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from rayseq.checkpoint import store_reader

# the policy protocol's phase methods the learner calls (rayseq.models.protocol): forwards of the sharded policy
PHASE_METHODS = ("logprobs", "lean_logprobs", "chunked_logprobs", "sample", "greedy", "generate", "first_step_logprobs",
                 "prefix_states", "decode_step", "encode", "advance", "output_logits")


def is_sharded(tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def shard_modules(modules: dict[str, nn.Module], world: int, device: torch.device, *, dtype: torch.dtype,
                  cpu_offload: bool = False) -> None:
    """``fully_shard`` each of ``modules`` over ``world`` ranks (the process group must exist): its blocks
    (``module.fsdp_blocks()`` when it has them) one by one, then the module; the policy's phase methods registered as
    forwards; gradients summed over the ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    mesh = init_device_mesh(device.type, (world,))
    kw: dict = {"mesh": mesh}
    if dtype != torch.float32:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    if cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy()
    for module in modules.values():
        for block in getattr(module, "fsdp_blocks", lambda: [])():
            fully_shard(block, **kw)
        fully_shard(module, **kw)
        for name in PHASE_METHODS:
            if callable(getattr(module, name, None)):
                register_fsdp_forward_method(module, name)
        for sub in module.modules():
            if hasattr(sub, "set_force_sum_reduction_for_comms"):
                sub.set_gradient_divide_factor(1.0)  # each rank's loss carries its share: the sum is the gradient
                sub.set_force_sum_reduction_for_comms(True)


def materialize(module: nn.Module, device: torch.device, cpu_offload: bool = False) -> None:
    """Give a sharded ``module`` built on the ``meta`` device (no storage: :meth:`~.strategies.FSDP.build`) storage
    of its own, uninitialised: each rank its shards of the parameters (on the CPU with ``cpu_offload``), every buffer
    whole on ``device``. Its values come from :func:`fill_from_rank0` or from another module's."""
    module.to_empty(device=torch.device("cpu") if cpu_offload else device)
    for sub in module.modules():
        for name, buf in sub._buffers.items():
            if buf is not None and buf.device != device:
                sub._buffers[name] = buf.to(device)  # the compute reads them on the device


def fill_from_rank0(module: nn.Module, whole: dict[str, torch.Tensor]) -> None:
    """Every parameter and buffer of the sharded ``module`` as rank 0 holds them: a collective, one tensor at a time.
    ``whole``: rank 0's ``named_parameters`` as they were before sharding (``{}`` on the other ranks).

    A parameter is scattered from rank 0 (:func:`_scatter_rows`: each rank receives its own rows, no rank but rank 0
    ever holds it whole), a buffer broadcast whole. What ``torch.distributed.checkpoint.state_dict.
    set_model_state_dict(..., full_state_dict=True, broadcast_from_rank0=True)`` does, but for three things: that
    broadcasts each whole tensor to every rank (a whole-sized buffer on each, the embedding's 2 GB at Llama-3-8B), and
    it loads the module's ``state_dict``, which holds neither what a policy does not train (a LoRA policy's is its
    adapters, not the frozen base weights) nor the non-persistent buffers (rotary frequencies, the banned ids' logit
    bias) that a module built on the meta device lacks too."""
    import torch.distributed as dist
    from torch.distributed.tensor import distribute_tensor

    root = dist.get_rank() == 0
    with torch.no_grad():
        for name, p in module.named_parameters():
            if not is_sharded(p):
                dist.broadcast(p.data, src=0)
            elif _rows_sharded(p):
                _scatter_rows(p, whole[name] if root else None)
            else:  # another layout: distribute_tensor's scatter, from a whole-sized buffer on every rank
                mesh = p.device_mesh
                full = whole[name].to(mesh.device_type) if root else torch.empty(p.shape, dtype=p.dtype,
                                                                                 device=mesh.device_type)
                p.to_local().copy_(distribute_tensor(full, mesh, p.placements, src_data_rank=0).to_local())
        for buf in module.buffers():
            dist.broadcast(buf, src=0)


def _rows_sharded(p) -> bool:
    """Whether the sharded ``p`` is split by rows over a 1-D mesh (FSDP2's layout: ``Shard(0)``)."""
    from torch.distributed.tensor import Shard

    return p.dim() > 0 and p.device_mesh.ndim == 1 and tuple(p.placements) == (Shard(0),)


def _scatter_rows(p, full: torch.Tensor | None) -> None:
    """This rank's rows of ``full`` (rank 0's whole tensor; None on the others) into the row-sharded ``p``. FSDP2
    splits as ``torch.chunk``: ⌈n/N⌉ rows each, rank r's starting at r⌈n/N⌉ (the last ranks' fewer, or none); the
    scatter sends each rank a block of ⌈n/N⌉ rows (the last one padded), received into the shard itself where it is
    one (no copy: the others hold no more than their shards)."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    device = p.device_mesh.device_type
    rows = -(-p.shape[0] // world)
    local = p.to_local()
    if local.shape[0] != max(0, min(rows, p.shape[0] - rank * rows)):
        raise RuntimeError(f"a shard of {local.shape[0]} rows where torch.chunk gives rank {rank} "
                           f"{max(0, min(rows, p.shape[0] - rank * rows))} of {p.shape[0]}")
    whole_block = local.shape[0] == rows and local.is_contiguous() and local.device.type == device
    block = local if whole_block else torch.empty((rows, *p.shape[1:]), dtype=p.dtype, device=device)
    parts = None
    if full is not None:
        full = full.to(device)
        parts = [full[r * rows:(r + 1) * rows].contiguous() for r in range(world)]
        parts = [part if part.shape[0] == rows else torch.cat([part, block.new_zeros((rows - part.shape[0],
                                                                                     *p.shape[1:]))])
                 for part in parts]
    dist.scatter(block, parts, src=0)  # received in place where the shard is a whole block
    if not whole_block:
        local.copy_(block[:local.shape[0]])


def rebuild_optimizer(opt: torch.optim.Optimizer, named: dict[int, str], params: dict[str, nn.Parameter]):
    """``opt``'s class and settings over the sharded parameters: ``named`` maps each of its old parameters (by id)
    to its name, ``params`` the names to the parameters now (sharding replaces them). Its state is empty: sharding
    happens before the first update."""
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [params[named[id(p)]] for p in g["params"]]}
              for g in opt.param_groups]
    return type(opt)(groups, **opt.defaults)


def full_tensors(state: dict, dtype: torch.dtype | None = None,
                 keep: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of ``state`` (name -> tensor), each sharded tensor gathered whole when the stream is asked
    for it (a collective: every rank drains the stream, in the same order) and on the CPU; yielded by the ranks that
    ``keep`` it (rank 0: what it publishes and writes), the others taking their part in each gather and yielding
    nothing.

    One tensor at a time: each rank casts its shard to ``dtype`` where it is floating (on its device, in parallel), so
    the all-gather moves the publishing dtype (bf16: half fp32's bytes); the ranks that ``keep`` the tensor copy it to
    the CPU and the others drop it, so a rank holds at most one whole tensor beyond its shards (and a consumer that
    keeps none, one). Casting the parts or the whole gives the same values (IEEE rounding is elementwise)."""
    for k, v in state.items():
        v = v.detach()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        t = v.full_tensor() if is_sharded(v) else v
        del v
        if keep:
            yield k, t.cpu()
        del t


def load_full(module: nn.Module, full: dict) -> None:
    """Load whole tensors (a replicated learner's, another run's) into a sharded ``module``: each distributed like
    the module's own."""
    from torch.distributed.tensor import distribute_tensor

    own = module.state_dict()
    module.load_state_dict({k: distribute_tensor(v.to(own[k].device_mesh.device_type), own[k].device_mesh,
                                                 own[k].placements) if is_sharded(own[k]) else v
                            for k, v in full.items()})


def sharded_state(pairs: dict[str, tuple[nn.Module, torch.optim.Optimizer | None]]) -> dict:
    """What ``torch.distributed.checkpoint`` saves and loads for modules and their optimizers: ``{name: module state,
    name + ".optim": optimizer state (keyed by parameter names)}``."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    out = {}
    for name, (module, opt) in pairs.items():
        out[name] = module.state_dict()
        if opt is not None:
            out[f"{name}.optim"] = get_optimizer_state_dict(module, opt)
    return out


def restore_sharded(pairs: dict, loaded: dict) -> None:
    """Put what :func:`load_sharded` filled into the modules and optimizers."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    for name, (module, opt) in pairs.items():
        module.load_state_dict(loaded[name])
        if opt is not None:
            set_optimizer_state_dict(module, opt, loaded[f"{name}.optim"])


def save_sharded(state: dict, directory: str) -> None:
    """``torch.distributed.checkpoint.save`` of ``state`` into a local ``directory`` (every rank its shards)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=directory, no_dist=not dist.is_initialized())


def saved_names(location: str) -> set[str]:
    """The top-level names of what a ``torch.distributed.checkpoint`` directory (a path or a URI) holds
    (:func:`sharded_state`'s: each module's, and ``<name>.optim`` counted under ``<name>``)."""
    return {key.split(".", 1)[0] for key in store_reader(location).read_metadata().state_dict_metadata}


def load_sharded(state: dict, location: str, reads: list | None = None) -> dict:
    """Fill ``state`` (:func:`sharded_state` of this learner: its own shards' shapes) from a ``torch.distributed.
    checkpoint`` directory ``location`` (a path or a URI) written by any number of ranks: read in place, this rank's
    shards alone (:func:`store_reader`; ``reads`` gains what it read)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    reader = store_reader(location)
    dcp.load(state, storage_reader=reader, no_dist=not dist.is_initialized())
    if reads is not None:
        reads.extend(reader.reads)
    return state
