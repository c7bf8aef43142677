"""Learner: holds the generator, its optimizer and the configured algorithm with the modules it declared
(``Algorithm.build_modules``: the value baseline, the models it trains besides the generator, the frozen KL
reference), the way its strategy holds them (:mod:`.strategies`: replicated or FSDP2); applies the stage's update (MLE
pretraining, then the algorithm's) and the algorithm's other updates."""

from __future__ import annotations

import os
import random
import time

import numpy as np
import torch

from rayseq.algos import MLE, LearnerState, make_algo
from rayseq.algos.common import behaviour_logprobs
from rayseq.algos.iteration import ALGO_PRETRAIN, stage_name
from rayseq.algos.reward_refresh import RewardRefresh
from rayseq.checkpoint import algorithm_entries
from rayseq.config import RunConfig, blame
from rayseq.distributed.actors.strategies import files_of, make_strategy
from rayseq.distributed.handles import as_rollout, resolve
from rayseq.distributed.runtime import placement_group_id
from rayseq.distributed.weights.flat import FlatWeights
from rayseq.models import make_generator
from rayseq.rewards.trained import REFRESHED
from rayseq.seeding import set_deterministic
from rayseq.tasks import make_task
from rayseq.tasks.evaluation import figures
from rayseq.types import PromptBatch, PromptKeys, Rollout, prompt_arrays


class Learner:
    """One learner rank: build (the generator, the algorithm's modules) → wrap (its strategy, once the ranks have
    joined their process group) → update → publish (whole weights) → save (in its strategy's format). ``cfg``: the
    run's config; ``rank``: its rank among the learners (0 in-process), known as it is built: a sharded learner's
    ranks but rank 0 build the generator's layout alone (:meth:`.strategies.FSDP.build`)."""

    def __init__(self, cfg: RunConfig, rank: int = 0):
        self.cfg = cfg
        c = self.cfg
        torch.set_num_threads(c.learner.torch_threads)
        set_deterministic(c.deterministic)
        torch.manual_seed(c.seed)
        random.seed(c.seed)
        np.random.seed(c.seed % 2**32)  # noqa: NPY002 -- seeds third-party code that uses the legacy RNG
        use_cuda = c.learner.device == "cuda" or (c.learner.device == "auto" and c.learner.num_gpus > 0)
        if use_cuda and not torch.cuda.is_available():  # never a silent CPU fallback
            raise blame("learner.device", RuntimeError(
                f"learner.device={c.learner.device} with learner.num_gpus={c.learner.num_gpus}, but no CUDA device is "
                "visible to the learner; use learner.device=cpu"))
        self.device = torch.device("cuda" if use_cuda else "cpu")
        self.task = make_task(c.task, c.reward)
        self.dtype = getattr(torch, c.model.dtype)  # the compute precision (fp32 master weights whatever it is)
        self.strategy = make_strategy(c.learner, self.device, self.dtype, rank)  # how it holds its modules
        generator = self.strategy.build(lambda: make_generator(c, self.task))
        self.state = LearnerState(
            generator=generator,
            gen_opt=torch.optim.Adam(generator.parameters(), lr=c.train.pretrain_lr),
            device=self.device,
            micro_batch=c.learner.micro_batch_size,
            max_reply_len=self.task.max_tgt_len,
        )
        # the configured algorithm, with what it trains besides the generator (built once, here)
        self.algo = make_algo(c.algo, c.seed)
        self.algo.modules = self.algo.build_modules(c, generator, self.task, self.device)
        # the entropy bonus of regularized (rollout) algorithms (their KL penalty is the algorithm's: Algorithm.learn)
        self.state.entropy_coef = c.algo.entropy_coef if c.algorithm.regularized else 0.0
        # a reward model the run refreshes online (reward.refresh): this rank's trainable copy
        refreshed = c.reward.refreshed if c.uses_reward_config else None
        self.refresh = RewardRefresh(refreshed, self.task, self.device, c.seed) if refreshed else None
        self.stage = "mle"
        self.pretrainer = MLE(c.algo, c.seed)  # the update of MLE pretraining (and of the algorithm's own stage)
        self.version = 0
        # the generator changed since its weights were last published without a new version (an algorithm's
        # validation undid updates, a checkpoint was loaded): an evaluation's decodes then carry fresh weights
        self.weights_changed = False
        if c.learner.activation_checkpointing:
            generator.enable_checkpointing()

    @property
    def updater(self):
        """Whose ``update`` the stage runs: the algorithm's in ``train``, MLE's before."""
        return self.algo if self.stage == "train" else self.pretrainer

    def pid(self) -> int:
        return os.getpid()

    def placement(self) -> dict:
        """Where the learner runs: pid, device, placement group id (diagnostics)."""
        return {"pid": os.getpid(), "device": str(self.device), "placement_group": placement_group_id()}

    @staticmethod
    def probe_run_dir(location: str, rel: str, token: str, rank: int) -> dict:
        """Whether this learner's node sees the run directory as the driver does (:func:`.run_dir.probe`)."""
        from rayseq.distributed.run_dir import node, probe

        return probe(location, rel, token, rank, node())

    # -- data parallel (learner.num_learners > 1; rayseq.distributed.groups.LearnerGroup sets it up) ------------
    @staticmethod
    def rendezvous() -> tuple[str, int]:
        """Rank 0's address for the process group: this node's IP and a free TCP port on it."""
        import socket

        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join_data_parallel(self, rank: int, world: int, address: str, port: int, timeout_s: float) -> str:
        """Join the learners' process group as ``rank`` of ``world`` (gloo on CPU, NCCL on GPU; rank 0 listens at
        ``address:port``); every update from here on takes this rank's rows of each minibatch and sums the ranks'
        gradients (:mod:`rayseq.algos.parallel`); the strategy wraps the modules it holds (``learner.strategy=fsdp``:
        sharded). ``timeout_s``: how long a collective waits for a lost rank. Returns the backend."""
        import datetime

        import torch.distributed as dist

        backend = self.cfg.learner.backend
        if backend == "auto":  # NCCL needs a GPU of each rank's own: learners sharing one use gloo
            backend = "nccl" if self.device.type == "cuda" and self.cfg.learner.num_gpus >= 1 else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        self.state.dp, optimizers = self.strategy.wrap(rank, world, self.modules(), self.optimizers())
        self.state.gen_opt = optimizers.pop("gen_opt")
        self.algo.modules.update(optimizers)
        return backend

    def modules(self) -> dict:
        """Every module this learner holds, by name: the generator and the algorithm's."""
        return {"generator": self.state.generator,
                **{k: m for k, m in self.algo.modules.items() if isinstance(m, torch.nn.Module)}}

    def optimizers(self) -> dict:
        """Every optimizer this learner holds, by name: the generator's (``gen_opt``) and the algorithm's."""
        return {"gen_opt": self.state.gen_opt,
                **{k: o for k, o in self.algo.modules.items() if isinstance(o, torch.optim.Optimizer)}}

    def actor_id(self) -> str | None:
        """This learner's Ray actor id (hex; None in-process): what a RayActorError names when it is the one lost."""
        import ray

        return ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None

    def start_stage(self, stage: str) -> None:
        """``mle`` (pretraining), ``algo_pretrain`` (the algorithm's own pretraining of its modules; G unchanged) or
        ``train`` (the configured algorithm, with a fresh Adam at algo.lr, after its ``Algorithm.start``)."""
        stage = stage_name(stage)
        if stage == self.stage:
            return
        if stage not in (ALGO_PRETRAIN, "train"):
            raise ValueError(f"unknown stage {stage!r}")
        self.stage = stage
        if stage == "train":
            self.state.gen_opt = torch.optim.Adam(self.state.generator.parameters(), lr=self.cfg.algo.lr)
            self.algo.start(self.state)
            for name in self.algo.frozen_copies():  # π_ref of the KL penalty: the generator now, frozen
                self.algo.modules[name] = self.strategy.reference(self.state.generator,
                                                                  lambda: make_generator(self.cfg, self.task))

    def get_weights(self) -> dict:
        """The generator's state dict and what the algorithm publishes to the rollout workers with it
        (``Algorithm.worker_weights``), on CPU: one version (sharded: every rank gathers, rank 0's is whole)."""
        return self.strategy.whole({"generator": self.state.generator.state_dict(), **self.algo.worker_weights()})

    def get_flat_weights(self) -> FlatWeights:
        """:meth:`get_weights` as one buffer (what the Ray groups publish: one object per version)."""
        self.weights_changed = False
        return FlatWeights.pack(self.get_weights())

    def get_eval_weights(self) -> FlatWeights:
        """:meth:`get_weights` as one buffer for an evaluation's decodes alone (not published: the workers' samplings
        keep the version's published weights)."""
        return FlatWeights.pack(self.get_weights())

    def changed_since_publish(self) -> bool:
        return self.weights_changed

    # -- the learner's end of rollout.weight_sync=collective (rayseq.distributed.weights.transport) -------------
    def send_weights(self, spec, bucket_bytes: int) -> None:
        """Broadcast the generator's weights to the rollout workers over the group ``spec`` (a
        :class:`~rayseq.distributed.weights.collective.GroupSpec`: rank 0, its store here), bucket by bucket in the
        compute precision, each whole tensor made as its bucket fills (sharded: every rank takes part in each
        tensor's gather, rank 0 sends)."""
        from rayseq.distributed.weights import collective as weight_sync

        self.weights_changed = False  # published (over the group, not the object store)
        weight_sync.send(self.strategy.whole_tensors(self.state.generator.state_dict()), spec, bucket_bytes,
                         root=self.strategy.rank == 0)

    def leave_weight_group(self, group_name: str) -> None:
        """Drop this process's membership of the weights group ``group_name`` (a group being replaced)."""
        from rayseq.distributed.weights import collective as weight_sync

        weight_sync.leave(group_name)

    # -- versions, the algorithm's calls, updates -----------------------------------------------------
    def get_version(self) -> int:
        """Generator updates so far (the weights version the rollouts of the next update are tagged with)."""
        return self.version

    def scorer_version(self) -> int:
        """The version of what the scorers hold of the algorithm's (``Algorithm.scorer_weights``; 0: nothing), plus
        the refreshes of a refreshed reward model (an algorithm that publishes to the scorers reads no reward.*:
        only one of the two counts)."""
        return self.algo.scorer_weights()[0] + (self.refresh.version if self.refresh is not None else 0)

    def get_scorer_weights(self) -> dict:
        """``{name: state dict}`` the scorers load (``Algorithm.scorer_weights``; sharded: gathered as
        :meth:`get_weights`), and a refreshed reward model's (under ``REFRESHED``)."""
        out = self.strategy.whole(self.algo.scorer_weights()[1])
        return out if self.refresh is None else {**out, REFRESHED: self.refresh.weights()}

    def refresh_reward(self, shards: Rollout | list) -> dict:
        """A refresh of the reward model on sampled groups (a Rollout, or its shard handles, fetched here):
        :meth:`rayseq.algos.reward_refresh.RewardRefresh.update`."""
        with self.strategy.compute():
            return self.refresh.update(as_rollout(shards))

    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int):
        """The algorithm's request built from the learner's copy (algorithms whose requests carry state)."""
        return self.algo.rollout_request(iteration, max_len, temperature, seed)

    def validate(self) -> dict:
        """Validation-set reward handed to the algorithm (``Algorithm.on_validation``)."""
        with self.strategy.compute():
            reward = self.task.validation_reward(self.state.generator, self.device)
        self.weights_changed = True  # the algorithm may undo updates (ERPO interpolation), the version as it was
        return self.algo.on_validation(self.state, reward)

    def update(self, batch, iteration: int) -> dict:
        """The stage's update (MLE's, then the algorithm's) on ``batch`` (a rollout, prompts with targets, or their
        keys: :class:`~rayseq.types.PromptKeys`, read here); its metrics."""
        batch = prompt_arrays(batch, self.task)
        self.state.generator.train()
        with self.strategy.compute():
            metrics = self.updater.learn(self.state, batch, iteration)
        if self.updater.kind == "rollout":
            metrics["rollout/staleness"] = float(self.version - batch.version)
        self.version += 1
        metrics["learner/version"] = float(self.version)
        return metrics

    def update_rollout(self, shards: list, iteration: int, scores: list | None = None, rows=None) -> dict:
        """The rollout algorithm's update on a rollout that arrives as shard handles (ObjectRefs fetched here, from
        the object store, never through the driver; in-process the shards themselves), concatenated here in shard
        order. Returns the metrics: each configured reward term (``reward/<name>``), the scores' (below), the
        update's.

        ``scores``: per-shard handles of what the algorithm's iteration computed on the scorers (e.g. action values),
        which the learner's copy of the algorithm gives the rollout (``Algorithm.assign_scores``). ``rows``: (N,) the
        rows of the concatenation to train on (dynamic sampling's kept groups); None: all."""
        t0 = time.perf_counter()
        parts = [shards] if isinstance(shards, Rollout) else resolve(shards)
        rollout = as_rollout(shards if isinstance(shards, Rollout) else parts)
        if rows is not None:
            rollout = rollout.rows(np.asarray(rows, dtype=np.int64))
        sampled = [p.info.get("sample_s", 0.0) for p in parts]
        metrics = {"time/fetch_s": time.perf_counter() - t0,  # the shards from the object store, concatenated
                   "time/sample_s": max(sampled),  # the slowest worker's
                   "time/sample_total_s": sum(sampled)}  # every worker's: their busy time
        if rollout.logp is None:  # an engine's samples (rollout.engine=vllm): the policy's log-probs are computed here
            with self.strategy.compute():
                metrics.update(behaviour_logprobs(self.state, rollout, self.cfg.rollout.logp_correction,
                                                  self.cfg.rollout.tis_cap))
        if rollout.term_scores is not None:  # reward.*: each term, as reward/<name>
            metrics.update(self.task.reward.metrics(rollout.term_scores))
        if scores is not None:
            metrics.update(self.algo.assign_scores(rollout, resolve(scores)))
        t1 = time.perf_counter()
        metrics.update(self.update(rollout, iteration))
        metrics["time/update_s"] = time.perf_counter() - t1  # the algorithm's update alone (time/learn_s: and calls)
        return metrics

    def update_and_publish(self, shards: list, iteration: int, scores: list | None = None,
                           rows=None) -> tuple[dict, FlatWeights]:
        """:meth:`update_rollout`, and the updated weights (the Ray groups' two return objects: the metrics go to
        the driver, the weights by reference to the workers with their next call)."""
        metrics = self.update_rollout(shards, iteration, scores, rows)
        t0 = time.perf_counter()
        weights = self.get_flat_weights()
        metrics["time/publish_s"] = time.perf_counter() - t0
        return metrics, weights

    def aux_update(self, positives: PromptBatch | PromptKeys, negatives: Rollout | list, seed: int) -> dict:
        """The algorithm's update of a model of its own on real ``positives`` (or their keys) against sampled
        ``negatives`` (a Rollout, or the shard handles of one, fetched here): ``Algorithm.aux_update``."""
        with self.strategy.compute():
            return self.algo.aux_update(self.state, prompt_arrays(positives, self.task), as_rollout(negatives), seed)

    def evaluate(self, split: str = "val", decoded: list | None = None) -> tuple[dict, dict]:
        """The task's ``val/*`` (during training: what selects) or ``test/*`` (once, reported) metrics. ``decoded``:
        the split's decodes (the task's ``eval_decodes``, :mod:`rayseq.tasks.evaluation`) made on the rollout
        workers, or their handles (fetched here): only the figures are computed here, reading the policy where
        they need its likelihood (no gradients, in the task's evaluation batches); None: the whole evaluation here.
        An algorithm that evaluates what it trains itself (``evaluate(state, task, split)``: a reward model) reports
        its own."""
        own = getattr(self.algo, "evaluate", None)
        with self.strategy.compute():
            if own is not None:
                return own(self.state, self.task, split)
            if decoded is None:
                return self.task.evaluate(self.state.generator, self.device, split=split)
            return figures(self.task, split, resolve(decoded), self.state.generator, self.device)

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self, modules: bool = True) -> dict:
        """The training state: generator, its optimizer, stage, version, RNG and the algorithm's state (its modules, the
        value baseline and the KL reference among them, and the rest: ``Algorithm.state_dict``, under ``algo``).
        ``modules=False``: without the modules and optimizers (what a sharded checkpoint keeps beside their shards)."""
        s = self.state
        out = {
            "generator": s.generator.state_dict(),
            "gen_opt": s.gen_opt.state_dict(),
            "stage": self.stage,
            "version": self.version,
            "torch_rng": torch.get_rng_state(),
        } if modules else {"stage": self.stage, "version": self.version, "torch_rng": torch.get_rng_state()}
        if self.device.type == "cuda":  # dropout and anything else drawn on the GPU
            out["cuda_rng"] = torch.cuda.get_rng_state_all()
        algo_state = self.algo.state_dict() if modules else self.algo.state_beside_modules()
        if algo_state:
            out["algo"] = algo_state
        if self.refresh is not None:  # whole on every rank, written beside a sharded checkpoint's shards too
            out["reward_refresh"] = self.refresh.state_dict()
        return out

    def save(self, location: str, stem: str) -> dict:
        """Write this learner's state into the checkpoints of the run at ``location`` (its run directory: a path or a
        URI), named after ``stem``, on the CPU, in its strategy's format (whole files; with ``learner.strategy=fsdp``
        every rank its shards of the modules and optimizers, rank 0 the whole generator weights and the rest:
        :mod:`.strategies`); nothing of it goes back. Returns the files written and their SHA-256 (what the
        checkpoint's head records)."""
        return self.strategy.files.save(self, location, stem)

    @property
    def weights_format(self) -> str:
        """How the checkpoint writes the generator's weights: ``safetensors`` (a Hugging Face policy) or ``torch``."""
        from rayseq import registry

        return getattr(registry.model_class(self.cfg.model.arch), "weights_format", "torch")

    def module_pairs(self) -> dict:
        """What a sharded checkpoint holds: each module with its optimizer (None for one the learner does not step: a
        moving average the algorithm keeps, the KL reference)."""
        optimizers = [o for o in self.algo.modules.values() if isinstance(o, torch.optim.Optimizer)]

        def owner(module) -> torch.optim.Optimizer | None:
            ids = {id(p) for p in module.parameters()}
            return next((o for o in optimizers if any(id(p) in ids for g in o.param_groups for p in g["params"])),
                        None)

        pairs = {"generator": (self.state.generator, self.state.gen_opt)}
        pairs.update({k: (m, owner(m)) for k, m in self.algo.modules.items() if isinstance(m, torch.nn.Module)})
        return pairs

    def whole_state(self) -> dict:
        """Each module's weights and its optimizer's state (the generator's, the value baseline's, ...), whole and keyed
        by parameter names (sharded: gathered, every rank calls it, rank 0's answer): what compares learners of any
        strategy."""
        return self.strategy.whole_state({k: pair for k, pair in self.module_pairs().items() if pair[1] is not None})

    def shard_sizes(self) -> dict:
        """Elements this rank holds of its modules' parameters and of their optimizers' state, against the whole:
        ``{"params": (held, whole), "optimizer": (held, whole)}``."""
        return self.strategy.shard_sizes(list(self.modules().values()), list(self.optimizers().values()))

    def restore(self, path: str) -> list:
        """Load the checkpoint ``path`` (its head; this learner reads its own files: the driver never holds them).
        Returns what it read of a sharded checkpoint's shards (:meth:`load_state_dict`)."""
        from rayseq.checkpoint import load_checkpoint

        return self.load_state_dict(load_checkpoint(path, map_location=self.device)["learner"])

    def load_state_dict(self, state: dict) -> list:
        """Restore :meth:`state_dict`, in the format it was written in (:func:`.strategies.files_of`: whole files, or a
        sharded learner's shards, resharded to this learner's ranks, each rank reading its own parts alone; or a
        checkpoint written before algorithms owned their modules). Returns what was read of the shards: ``(file,
        entry, bytes)`` each (whole files: none)."""
        reads = files_of(state).restore(self, state)
        self.version = int(state["version"])
        self.weights_changed = True
        # RNG states are CPU byte tensors; a checkpoint read with map_location=cuda moved them to the device
        torch.set_rng_state(state["torch_rng"].cpu())
        if self.device.type == "cuda" and "cuda_rng" in state:
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda_rng"]])
        self.algo.load_state_dict(algorithm_entries(state))
        if self.refresh is not None and "reward_refresh" in state:
            self.refresh.load_state_dict(state["reward_refresh"])
        return reads

    def apply_config_lrs(self) -> dict:
        """Set the optimizers' learning rates from the config: ``load_state_dict`` restores the saved ones,
        and a resumed run (a Tune PBT exploit: another trial's checkpoint, a mutated ``algo.lr``) must use
        its own. Returns the rates now in use, by optimizer."""
        c = self.cfg
        lrs = {"gen_opt": c.algo.lr if self.stage == "train" else c.train.pretrain_lr, **self.algo.config_lrs(c)}
        opts = {"gen_opt": self.state.gen_opt, **self.algo.modules}
        for name, lr in lrs.items():
            for g in opts[name].param_groups:
                g["lr"] = lr
        return lrs

    def init_from(self, path: str) -> dict:
        """Start from the checkpoint ``path`` of another run: its pretrained generator, the algorithm's modules that are
        carried over when both runs hold them (``Algorithm.carried``: the value baseline) and what the algorithm
        pretrains itself (when that run has it: ``Algorithm.init_from``); optimizers and stage start fresh. Returns
        what this run needs, and whether it was there."""
        from rayseq.checkpoint import load_checkpoint

        state = load_checkpoint(path, map_location=self.device)["learner"]
        carried = {k: self.algo.modules[k] for k in self.algo.carried if k in self.algo.modules}
        files_of(state).read_modules(self, state, {"generator": self.state.generator, **carried})
        self.weights_changed = True
        return {"generator": True, **self.algo.init_from(algorithm_entries(state))}


def evaluate_checkpoint(location: str, split: str = "test", device: str = "cpu") -> tuple[dict, dict]:
    """The ``split`` metrics (and details) of a checkpoint's generator (file, run directory or URI), on this
    process: e.g. the test figures of the trial a search chose on its validation metric. Its algorithm evaluates it
    as its training does (:meth:`~rayseq.algos.common.Algorithm.evaluate_saved`: a reward model's preference figures
    with its head; the task's evaluation otherwise)."""
    from rayseq.checkpoint import load_checkpoint

    ck = load_checkpoint(location, training_state=False)
    cfg = RunConfig.model_validate(ck["config"])
    task = make_task(cfg.task, cfg.reward)
    generator = make_generator(cfg, task).to(device)
    generator.load_state_dict(ck["learner"]["generator"])
    return make_algo(cfg.algo, cfg.seed).evaluate_saved(location, generator, task, split, device)
