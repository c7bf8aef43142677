"""How a learner holds the modules it trains (``learner.strategy``): one class per way, chosen once
(:func:`make_strategy`), as torchtitan has one ``parallelize_*`` function per parallelism and RLlib one ``Learner``
class per framework. The learner reads build → wrap → update → publish → save whatever its strategy; the strategy
answers what differs (:class:`LearnerStrategy`):

================================  ==================================  ==============================================
                                  :class:`Replicated`                 :class:`FSDP`
================================  ==================================  ==============================================
build (each rank, on its own)     the whole modules                   rank 0 the whole modules; the other ranks their
                                                                      layout alone, on the ``meta`` device
each rank holds                   the whole modules and optimizers    1/N of every module's parameters, gradients and
                                                                      Adam moments (FSDP2, :mod:`.sharding`)
wrap (after joining the ranks)    nothing                             every module sharded, filled from rank 0's
                                                                      (scattered), its optimizer rebuilt
gradients                         summed in one all-reduce            reduce-scattered by FSDP in backward
compute precision                 autocast to ``model.dtype``         FSDP's mixed precision
the KL reference π_ref            a frozen copy of the generator      a new generator, built on the ``meta`` device
                                                                      and sharded the same way, holding the same
                                                                      shards
whole weights (publishing)        each rank its own                   gathered tensor by tensor in the compute
                                                                      precision: every rank takes part, rank 0's
checkpoint                        whole files, rank 0                 DCP shards, each rank its own; rank 0 the whole
                                                                      generator weights and the rest
ranks that take part in a read    rank 0                              every rank
================================  ==================================  ==============================================

Both split the rows of a pass without gradients over the ranks the same way
(:func:`rayseq.algos.parallel.rows_without_grad`). FSDP over one rank has nothing to shard: its modules stay whole and
are computed as a replicated learner's, and it writes the sharded checkpoint format all the same.

A checkpoint is read in the format it was written in (:func:`files_of`: :class:`WholeFiles` or
:class:`ShardedFiles`), whatever the strategy of the learner that reads it: a sharded checkpoint reshards to any
number of ranks.

References: torchtitan ``parallelize_llama``; RLlib ``Learner.build()``; torch FSDP2 and
``torch.distributed.checkpoint``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Protocol

import torch
from torch import nn

from rayseq.algos.parallel import DataParallel, is_dtensor
from rayseq.models import reference_policy


class LearnerStrategy(Protocol):
    """What a learner asks of the way it holds its modules. ``rank``: this learner's rank (the one it was made with,
    0 in-process); ``files``: the format it writes checkpoints in."""

    rank: int
    files: WholeFiles | ShardedFiles

    def build(self, make: Callable[[], nn.Module]) -> nn.Module:
        """The generator as this rank first holds it, before the ranks join. ``make``: builds it (the global RNG
        drawn from as for any module)."""

    @staticmethod
    def reading_ranks(actors: list) -> list:
        """The learner actors (rank order) that take part in what reads the model: weights, state, evaluation,
        checkpoints and the publishing after an update; the first one's answer is the group's."""

    def wrap(self, rank: int, world: int, modules: dict[str, nn.Module],
             optimizers: dict[str, torch.optim.Optimizer]) -> tuple[DataParallel, dict[str, torch.optim.Optimizer]]:
        """Hold ``modules`` as this strategy does, once the ranks have joined their process group.

        Args:
            rank: this learner's rank.
            world: the number of ranks.
            modules: every module the learner holds, by name (the generator, the algorithm's).
            optimizers: every optimizer over them, by name.

        Returns:
            This rank's :class:`~rayseq.algos.parallel.DataParallel` (how the ranks' gradients are summed) and the
            optimizers to use from now on, by the same names.
        """

    def compute(self) -> AbstractContextManager:
        """The context of the learner's forward passes (its compute precision)."""

    def reference(self, generator: nn.Module, build: Callable[[], nn.Module]) -> nn.Module:
        """π_ref of the KL penalty: ``generator`` as it is now, frozen. ``build``: a new generator of the same
        configuration (the global RNG is left as it was)."""

    def whole(self, state: dict, publish: bool = True) -> dict:
        """``{name: state dict or None}`` whole and on the CPU (rank 0's where the ranks gather it; ``{}`` on the
        others). ``publish``: floating tensors in the compute precision (bf16: half the bytes), else as held (fp32
        master weights)."""

    def whole_tensors(self, state: dict, publish: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of one state dict, each whole and on the CPU, made when the stream is asked for it (the
        collective sync's buckets: :func:`rayseq.distributed.weights.collective.send`); rank 0's where the ranks
        gather them (every rank drains the stream, the others yield nothing). ``publish``: as :meth:`whole`."""

    def load_whole(self, module: nn.Module, full: dict) -> None:
        """Whole tensors (a replicated learner's, another run's) into a held ``module``."""

    def whole_state(self, pairs: dict) -> dict:
        """``{name: module state, name + ".optim": optimizer state}`` of ``pairs`` (``{name: (module, optimizer)}``),
        whole and keyed by parameter names (rank 0's answer; every rank calls it): what compares learners of any
        strategy."""

    def shard_sizes(self, modules: list[nn.Module], optimizers: list[torch.optim.Optimizer]) -> dict:
        """Elements this rank holds of ``modules``' parameters and of ``optimizers``' state, against the whole:
        ``{"params": (held, whole), "optimizer": (held, whole)}``."""


def _autocast(device: torch.device, dtype: torch.dtype) -> Callable[[], AbstractContextManager]:
    """Autocast to ``dtype`` (bf16 compute on fp32 master weights); nothing in fp32."""
    return nullcontext if dtype == torch.float32 else partial(torch.autocast, device.type, dtype=dtype)


def _frozen_copy(generator: nn.Module, dtype: torch.dtype):
    """The generator's own ``reference_policy()``: a frozen copy, in the compute precision (bf16 too); a LoRA policy:
    itself with its adapters off."""
    ref = reference_policy(generator)
    return ref.to(dtype) if isinstance(ref, nn.Module) else ref


def _cast(t: torch.Tensor, dtype: torch.dtype, publish: bool) -> torch.Tensor:
    return t.to(dtype) if publish and t.is_floating_point() else t


def _rng_from_rank0() -> None:
    """Set the global (CPU) RNG to rank 0's (a collective)."""
    import torch.distributed as dist

    state = [torch.get_rng_state()]
    dist.broadcast_object_list(state, src=0)
    torch.set_rng_state(state[0])


def _optimizer_tensors(optimizers: list) -> list[torch.Tensor]:
    return [t for o in optimizers for st in o.state.values() for t in st.values()
            if isinstance(t, torch.Tensor) and t.dim() > 0]


class Replicated:
    """``learner.strategy=replicated``: every rank holds the whole modules and their optimizers; the ranks'
    gradients are summed in one all-reduce of a flat buffer before each step (:class:`DataParallel`), so every rank
    takes the same step. Rank 0 answers what reads the model and writes the checkpoint (whole files).

    Args:
        device: the learner's device.
        dtype: the compute precision (``model.dtype``).
    """

    def __init__(self, device: torch.device, dtype: torch.dtype, rank: int = 0):
        self.device, self.dtype = device, dtype
        self.rank = rank
        self.files = WholeFiles()
        self._precision = _autocast(device, dtype)

    @staticmethod
    def reading_ranks(actors: list) -> list:
        """Rank 0 alone: the ranks hold the same."""
        return actors[:1]

    def build(self, make):
        """The whole generator, on every rank (the same seed: the same weights)."""
        return make().to(self.device)

    def wrap(self, rank, world, modules, optimizers):
        """Nothing to change in the modules: the gradients are all-reduced (:meth:`DataParallel.all_reduce_grads`)."""
        self.rank = rank
        return DataParallel(rank, world, self.device), optimizers

    def compute(self):
        return self._precision()

    def reference(self, generator, build):
        return _frozen_copy(generator, self.dtype)

    def whole(self, state, publish=True):
        return {k: None if v is None else dict(self.whole_tensors(v, publish)) for k, v in state.items()}

    def whole_tensors(self, state, publish=True):
        return ((n, _cast(t.detach().cpu(), self.dtype, publish)) for n, t in state.items())

    def load_whole(self, module, full):
        module.load_state_dict(full)

    def whole_state(self, pairs):
        from torch.distributed.checkpoint.state_dict import get_state_dict

        out = {}
        for name, (module, opt) in pairs.items():
            out[name], out[f"{name}.optim"] = get_state_dict(module, opt)
        return out if self.rank == 0 else {}

    def shard_sizes(self, modules, optimizers):
        params = sum(p.numel() for m in modules for p in m.parameters())
        state = sum(t.numel() for t in _optimizer_tensors(optimizers))
        return {"params": (params, params), "optimizer": (state, state)}


class ShardedDataParallel(DataParallel):
    """A sharded rank's :class:`DataParallel`: FSDP has reduce-scattered (summed) the gradients in backward."""

    def all_reduce_grads(self, params) -> None:
        """Nothing left to sum: each rank's gradient shards are the sum over the ranks already."""


class FSDP:
    """``learner.strategy=fsdp``: FSDP2 over the ranks (:mod:`.sharding`): every module the learner holds is sharded
    as the ranks join (:meth:`wrap`), each rank keeping 1/N of its parameters, gradients and Adam moments;
    ``model.dtype=bfloat16`` computes through FSDP's mixed precision (fp32 master shards), ``learner.cpu_offload``
    keeps shards and optimizer state in host memory. Whatever reads the whole model (publishing, evaluation,
    checkpoints) is a collective every rank takes part in; checkpoints are ``torch.distributed.checkpoint`` shards.
    Over one rank (no :meth:`wrap`) nothing is sharded: the modules stay whole and compute as a replicated learner's.

    No rank but rank 0 ever holds a whole module: the others build the generator on the ``meta`` device (its layout,
    no storage, no weights read: :meth:`build`) and receive their shards from rank 0's as the modules are sharded
    (:meth:`wrap`); the KL reference is built on the ``meta`` device on every rank (:meth:`reference`).

    Args:
        device: the learner's device.
        dtype: the compute precision (``model.dtype``).
        cpu_offload: ``learner.cpu_offload``.
        rank: this learner's rank (0: it builds the whole modules, the weights the others receive).
    """

    def __init__(self, device: torch.device, dtype: torch.dtype, cpu_offload: bool = False, rank: int = 0):
        self.device, self.dtype, self.cpu_offload = device, dtype, cpu_offload
        self.rank, self.world = rank, 1
        self.files = ShardedFiles()
        self._precision = _autocast(device, dtype)  # until the modules are sharded (one rank: never)

    @staticmethod
    def reading_ranks(actors: list) -> list:
        """Every rank: reading a sharded model is a collective."""
        return list(actors)

    def build(self, make):
        """Rank 0: the whole generator. The others: its layout on the ``meta`` device (a Hugging Face policy's
        weights not read: :func:`rayseq.models.hf.load_causal_lm`), given storage and rank 0's values as it is
        sharded (:meth:`wrap`)."""
        if self.rank == 0:
            return make().to(self.device)
        with torch.device("meta"):
            return make()

    def wrap(self, rank, world, modules, optimizers):
        """Shard every module (:func:`.sharding.shard_modules`), fill it from rank 0's (:func:`.sharding.
        fill_from_rank0`: the other ranks built the generator on the ``meta`` device, and drew the modules built
        after it from an RNG that its weights had not advanced) and build its optimizer again over the shards (before
        the first update: nothing in it yet). The global RNG continues from rank 0's, as it would have had every rank
        built the same whole modules."""
        from rayseq.distributed.actors.sharding import fill_from_rank0, materialize, rebuild_optimizer, shard_modules

        names = {id(p): f"{m}.{n}" for m, module in modules.items() for n, p in module.named_parameters()}
        whole = {m: {n: p.detach() for n, p in module.named_parameters()} for m, module in modules.items()} \
            if rank == 0 else {}  # what rank 0 scatters (the modules are sharded in place)
        shard_modules(modules, world, self.device, dtype=self.dtype, cpu_offload=self.cpu_offload)
        for name, module in modules.items():
            if any(t.device.type == "meta" for t in (*module.parameters(), *module.buffers())):
                materialize(module, self.device, self.cpu_offload)
            fill_from_rank0(module, whole.pop(name, {}))
        _rng_from_rank0()
        params = {f"{m}.{n}": p for m, module in modules.items() for n, p in module.named_parameters()}
        self.rank, self.world = rank, world
        self._precision = nullcontext  # FSDP's mixed precision casts the gathered parameters itself
        return (ShardedDataParallel(rank, world, self.device),
                {k: rebuild_optimizer(opt, names, params) for k, opt in optimizers.items()})

    def compute(self):
        return self._precision()

    def reference(self, generator, build):
        """A sharded module cannot be copied: a new generator (``build``) sharded the same way, holding the same
        shards. A LoRA policy's π_ref is itself with its adapters off; over one rank, a frozen copy."""
        if self.world == 1 or getattr(generator, "lora", False):
            return _frozen_copy(generator, self.dtype)
        from rayseq.distributed.actors.sharding import materialize, shard_modules

        with torch.random.fork_rng(), torch.device("meta"):  # its layout alone: no rank holds it whole
            ref = build()
        shard_modules({"reference": ref}, self.world, self.device, dtype=self.dtype)
        materialize(ref, self.device)
        with torch.no_grad():
            for r, p in zip(ref.parameters(), generator.parameters(), strict=True):
                r.to_local().copy_(p.to_local())
            for r, b in zip(ref.buffers(), generator.buffers(), strict=True):
                r.copy_(b)
        return ref.eval().requires_grad_(False)

    def whole(self, state, publish=True):
        whole = {k: None if v is None else dict(self.whole_tensors(v, publish)) for k, v in state.items()}
        return whole if self.rank == 0 else {}

    def whole_tensors(self, state, publish=True):
        """Every rank casts its shard of each tensor to the compute precision (``publish``) and takes part in its
        all-gather, one tensor at a time (:func:`.sharding.full_tensors`); rank 0 keeps it."""
        from rayseq.distributed.actors.sharding import full_tensors

        return full_tensors(state, self.dtype if publish else None, keep=self.rank == 0)

    def load_whole(self, module, full):
        from rayseq.distributed.actors.sharding import load_full

        load_full(module, full)

    def whole_state(self, pairs):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        out = {}
        for name, (module, opt) in pairs.items():
            out[name], out[f"{name}.optim"] = get_state_dict(module, opt, options=opts)
        return out if self.rank == 0 else {}

    def shard_sizes(self, modules, optimizers):
        def held(t):
            return t.to_local().numel() if is_dtensor(t) else t.numel()

        params = [p for m in modules for p in m.parameters()]
        states = _optimizer_tensors(optimizers)
        return {"params": (sum(held(p) for p in params), sum(p.numel() for p in params)),
                "optimizer": (sum(held(t) for t in states), sum(t.numel() for t in states))}


STRATEGIES = {"replicated": Replicated, "fsdp": FSDP}


def make_strategy(learner_cfg, device: torch.device, dtype: torch.dtype, rank: int = 0) -> LearnerStrategy:
    """The strategy ``learner.strategy`` names, for the learner of ``rank``. ``learner_cfg``: the run's ``learner``
    section."""
    if learner_cfg.strategy == "fsdp":
        return FSDP(device, dtype, cpu_offload=learner_cfg.cpu_offload, rank=rank)
    return Replicated(device, dtype, rank)


# -- checkpoint formats ----------------------------------------------------------------------------------------------
class WholeFiles:
    """A learner's state in whole files (:func:`rayseq.checkpoint.write_learner_state`): the generator's weights, and
    the rest (its optimizer, the algorithm's modules and state, RNG) in one torch file; rank 0 writes them."""

    def save(self, learner, location: str, stem: str) -> dict:
        from rayseq.checkpoint import write_learner_state

        return write_learner_state(location, stem, learner.state_dict(), learner.weights_format)

    def restore(self, learner, state: dict) -> list:
        """The generator and its optimizer into ``learner``, at the stage ``state`` was in (the generator first: the
        stage's start copies it, e.g. into G_β and π_ref). No shard read: ``[]``."""
        learner.strategy.load_whole(learner.state.generator, state["generator"])
        learner.start_stage(state["stage"])
        learner.state.gen_opt.load_state_dict(state["gen_opt"])
        return []

    def read_modules(self, learner, state: dict, modules: dict[str, nn.Module]) -> None:
        """Each of ``modules`` that the state holds (the generator's weights, the algorithm's entries), whole."""
        from rayseq.checkpoint import algorithm_entries

        held = {"generator": state["generator"], **algorithm_entries(state)}
        for name, module in modules.items():
            if name in held:
                learner.strategy.load_whole(module, held[name])


class ShardedFiles:
    """A sharded learner's state: every rank writes its shards of the modules and optimizers
    (``torch.distributed.checkpoint``, ``<stem>.learner/dcp/``; any number of ranks reads them back, resharded), rank 0
    the whole generator weights and the rest (:class:`WholeFiles`' files, without the modules and optimizers)."""

    def save(self, learner, location: str, stem: str) -> dict:
        import tempfile

        from rayseq.checkpoint import learner_folder, write_directory, write_learner_state
        from rayseq.distributed.actors.sharding import save_sharded, sharded_state

        strategy = learner.strategy
        pairs = learner.module_pairs()
        weights = strategy.whole({"generator": pairs["generator"][0].state_dict()}, publish=False)  # every rank
        with tempfile.TemporaryDirectory(prefix="rayseq-dcp-") as local:
            save_sharded(sharded_state(pairs), local)
            dcp = f"{learner_folder(stem)}/dcp"
            files = write_directory(location, dcp, local)  # this rank's shards (rank 0: and the metadata)
        if strategy.rank != 0:
            return {"files": files}
        written = write_learner_state(location, stem, {**learner.state_dict(modules=False),
                                                       "generator": weights["generator"], "dcp": dcp},
                                      learner.weights_format)
        return {**written, "files": {**written["files"], **files}}

    def restore(self, learner, state: dict) -> list:
        """Every module and optimizer of ``learner`` at the stage ``state`` was in, from the shards (this rank's:
        :func:`read_shards`, whose record of what was read it returns)."""
        learner.start_stage(state["stage"])
        return read_shards(state["dcp"], learner.module_pairs())

    def read_modules(self, learner, state: dict, modules: dict[str, nn.Module]) -> None:
        """Each of ``modules`` that the shards hold (not their optimizers)."""
        read_shards(state["dcp"], {k: (m, None) for k, m in modules.items()}, held_only=True)


def files_of(learner_state: dict) -> WholeFiles | ShardedFiles:
    """The format a learner's state (``learner`` of a loaded checkpoint) was written in."""
    return ShardedFiles() if "dcp" in learner_state else WholeFiles()


def read_shards(location: str, pairs: dict, held_only: bool = False) -> list:
    """Fill ``pairs`` (``{name: (module, optimizer or None)}``) from a sharded checkpoint's
    ``torch.distributed.checkpoint`` directory ``location`` (a path or a URI; any number of ranks wrote it), read in
    place: this rank's parts alone (:func:`rayseq.checkpoint.store_reader`). ``held_only``: leave out the names it
    does not hold (another run's, ``train.init_from``). Returns what was read: ``(file, entry, bytes)`` each."""
    from rayseq.distributed.actors.sharding import load_sharded, restore_sharded, saved_names, sharded_state

    if held_only:
        saved = saved_names(location)
        pairs = {k: pair for k, pair in pairs.items() if k in saved}
    reads: list = []
    restore_sharded(pairs, load_sharded(sharded_state(pairs), location, reads))
    return reads
