"""The learner group: one Learner in-process, or ``learner.num_learners`` Learner actors in one torch.distributed
process group (:class:`LearnerGroup`)."""

from __future__ import annotations

from rayseq.config import RunConfig
from rayseq.distributed.actors.learner import Learner
from rayseq.distributed.actors.strategies import STRATEGIES
from rayseq.distributed.groups.calls import two
from rayseq.types import PromptBatch, PromptKeys, RolloutRequest


class LearnerGroup:
    """The learner: the generator, its optimizer, the algorithm's modules (the value baseline, the frozen KL reference,
    ...). One Learner in-process, or ``learner.num_learners`` Ray actors (rank 0 in placement bundle 0, ranks 1.. in
    the bundles after the scorers') in one torch.distributed process group, which each take their rows of every
    minibatch and sum their gradients (:mod:`rayseq.algos.parallel`): calls that change the training state go to every
    rank, calls that read it (weights, state, evaluation, checkpoints, the publishing after an update) to the ranks
    the learners' strategy names (``reading``: rank 0, or every rank of sharded learners, whose reads are
    collectives; :mod:`rayseq.distributed.actors.strategies`), rank 0's answer the group's. Every method waits for its
    answer; a dead learner raises :class:`~.manager.LearnerLost` (the driver rebuilds the group,
    :meth:`restart`)."""

    kind = "learner"
    COLLECTIVE_TIMEOUT_S = 300.0  # how long a rank waits in a collective for the others (then its call fails)

    def __init__(self, cfg: RunConfig, *, manager=None, actor_options: list[dict] | None = None):
        self.is_local = manager is None
        self._eval_tags = 0  # weights fetched for an evaluation under a tag of their own (eval_weights_handle)
        self._manager = manager
        self.rollout = None  # the RolloutGroup, set by ActorGroups: where update_and_sample samples
        self.actors: list = []
        self.reading, self._updating, self._peer_refs = [], [], []
        if self.is_local:
            self.local = Learner(cfg)
        else:
            self._cfg, self._actor_options = cfg, actor_options
            self._start()

    def _start(self, wait_s: float | None = None, again: bool = False) -> None:
        """Start the learner actors (and, with more than one, their process group: rank 0's address, then every
        rank joins), once every actor created so far has started (:meth:`ActorManager.wait_started`: a constructor
        that raised ends the run with :class:`~.startup.StartupFailed`). ``wait_s``: how long they may take to be
        placed and started (a bundle on a lost node waits for Ray to re-place it); None: as long as it takes (the
        placement group is ready). ``again``: they replace actors that failed (:meth:`restart`)."""
        import ray

        self.actors = [ray.remote(Learner).options(**opts).remote(self._cfg, rank)
                       for rank, opts in enumerate(self._actor_options)]
        for rank, (actor, opts) in enumerate(zip(self.actors, self._actor_options)):
            bundle = getattr(opts.get("scheduling_strategy"), "placement_group_bundle_index", None)
            self._manager.starting(f"learner rank {rank}", bundle, actor, actor.get_version.remote(), again)
        try:
            self._manager.wait_started(timeout=wait_s)
        except TimeoutError:
            self._kill()
            raise RuntimeError(f"the rebuilt learner actors did not start within {wait_s:.0f} s (available: "
                               f"{ray.available_resources()}); --resume continues the run once the cluster can "
                               "place them") from None
        except BaseException:
            self._kill()
            raise
        self.actor = self.actors[0]
        self._manager.learner_ids = [a.actor_id.remote() for a in self.actors]  # tells their failures apart
        # the ranks that take part in what reads the model (rank 0's answer is the group's), and the other ranks,
        # which take part in an update but not in publishing its weights
        self.reading = STRATEGIES[self._cfg.learner.strategy].reading_ranks(self.actors)
        self._updating = [a for a in self.actors[1:] if a not in self.reading]
        self._peer_refs: list = []  # peers' parts of collectives whose answers only rank 0's counts (waited for later)
        self._version: int | None = None  # known from the last update (Ray); None: ask the learner
        self._published: tuple | None = None  # (version, FlatWeights ref) returned by the last update (Ray)
        world = len(self.actors)
        if world > 1:
            address, port = self._manager.get_learner([self.actor.rendezvous.remote()], self)[0]
            self._manager.get_learner([a.join_data_parallel.remote(rank, world, address, port,
                                                                   self.COLLECTIVE_TIMEOUT_S)
                                       for rank, a in enumerate(self.actors)], self)

    def _kill(self) -> None:
        """Kill the learner actors (a start that failed: nothing left behind)."""
        ray = self._manager.ray
        for a in self.actors:
            ray.kill(a, no_restart=True)

    def _wait_peers(self) -> None:
        """Wait for the peers' parts of earlier collectives (a lost rank raises LearnerLost here)."""
        refs, self._peer_refs = self._peer_refs, []
        if refs:
            self._manager.get_learner(refs, self)

    def _rank0_ref(self, method):
        """A ref to rank 0's answer to ``method(actor)()`` (every reading rank takes part, the peers' answers waited
        for with the next call)."""
        refs = [method(a).remote() for a in self.reading]
        self._peer_refs.extend(refs[1:])
        return refs[0]

    def restart(self) -> None:
        """Replace every learner actor by a fresh one in its bundle (its state: the caller loads a checkpoint)."""
        self._kill()
        self._start(wait_s=180.0, again=True)

    def _call(self, method, *args, keeps_version: bool = False, every_rank: bool = False):
        """``method(learner)`` (the Learner's bound method, or the actor's) with ``args``, waited for: on the reading
        ranks, or ``every_rank`` (what changes the training state; the arguments put in the object store once); rank
        0's answer. A call that may change the weights version forgets the known one (asked again when needed)."""
        if self.is_local:
            return method(self.local)(*args)
        if not keeps_version:
            self._version = None
        self._wait_peers()
        actors = self.actors if every_rank else self.reading
        if len(actors) > 1:
            args = tuple(self._manager.ray.put(a) for a in args)
        return self._manager.get_learner([method(a).remote(*args) for a in actors], self)[0]

    # -- stages, state, checkpoints -----------------------------------------------------------------
    def start_stage(self, stage: str) -> None:
        return self._call(lambda a: a.start_stage, stage, every_rank=True)

    def state_dict(self) -> dict:
        """Rank 0's training state, fetched (tests, diagnostics; checkpoints are written by :meth:`save`)."""
        return self._call(lambda a: a.state_dict, keeps_version=True)

    def save(self, location: str, stem: str) -> dict:
        """The learners write their state into the run's checkpoints (``Learner.save``: the reading ranks, rank 0 or,
        sharded, every rank its shards); returns the files written and their SHA-256, the only thing that comes
        back."""
        if self.is_local:
            return self.local.save(location, stem)
        self._wait_peers()
        first, *others = self._manager.get_learner([a.save.remote(location, stem) for a in self.reading], self)
        return {**first, "files": {**first["files"], **{k: v for o in others for k, v in o["files"].items()}}}

    def check_run_dir(self, store) -> None:
        """Refuse a local run directory (``store``) that not every learner actor's node sees as the driver does
        (:func:`rayseq.distributed.run_dir.check_shared`); an in-process learner shares the driver's."""
        if self.is_local:
            return
        from rayseq.distributed.run_dir import check_shared, node

        self._wait_peers()
        check_shared(store, lambda location, rel, token: self._manager.get_learner(
            [a.probe_run_dir.remote(location, rel, token, rank) for rank, a in enumerate(self.actors)], self), node())

    def whole_state(self) -> dict:
        """``Learner.whole_state`` (tests, diagnostics)."""
        return self._call(lambda a: a.whole_state, keeps_version=True)

    def restore(self, path: str) -> None:
        """Every rank loads its state from checkpoint ``path`` itself (``Learner.restore``)."""
        return self._call(lambda a: a.restore, path, every_rank=True)

    def load_state_dict(self, state: dict) -> None:
        return self._call(lambda a: a.load_state_dict, state, every_rank=True)

    def apply_config_lrs(self) -> dict:
        return self._call(lambda a: a.apply_config_lrs, keeps_version=True, every_rank=True)

    def init_from(self, path: str) -> dict:
        """Every rank starts from another run's checkpoint ``path`` (``Learner.init_from``); what was there."""
        return self._call(lambda a: a.init_from, path, every_rank=True)

    def evaluate(self, split: str = "val", decoded: list | None = None) -> tuple[dict, dict]:
        """``Learner.evaluate`` on the reading ranks (``decoded``: the decodes' handles, made on the rollout
        workers); rank 0's metrics and details."""
        return self._call(lambda a: a.evaluate, split, decoded, keeps_version=True)

    def placement(self) -> dict:
        return self._call(lambda a: a.placement, keeps_version=True)

    # -- weights ----------------------------------------------------------------------------------
    def version(self) -> int:
        """The generator's weights version (its update count): known from the last update, else asked."""
        if self.is_local:
            return self.local.get_version()
        if self._version is None:
            self._version = self._call(lambda a: a.get_version, keeps_version=True)
        return self._version

    def scorer_version(self) -> int:
        """The version of what the scorers hold of the algorithm's (0: nothing)."""
        return self._call(lambda a: a.scorer_version, keeps_version=True)

    def get_weights(self) -> dict:
        """The published state dicts (the generator's and what the algorithm publishes with it), fetched (tests,
        diagnostics)."""
        return self._call(lambda a: a.get_weights, keeps_version=True)

    def weights_handle(self, version: int):
        """What the rollout group sends its workers for weights ``version``: the state dicts in-process; under Ray
        a FlatWeights ref, the one the last update returned when it is that version (no call), else fetched now."""
        if self.is_local:
            return self.local.get_weights()
        published = self._published
        if published is not None and published[0] == version:
            return published[1]
        self._wait_peers()
        return self._rank0_ref(lambda a: a.get_flat_weights)

    def eval_weights_handle(self, version: int) -> tuple:
        """(handle, version tag) of the weights an evaluation's decodes carry: the published weights of ``version``
        when the learner's generator is still what it published; else (an algorithm's validation undid updates, a
        checkpoint was loaded, the version unchanged) its weights now, under a tag of their own (negative: never a
        version the samplings carry), left unpublished so that the samplings keep the version's weights."""
        if self.is_local or not self._call(lambda a: a.changed_since_publish, keeps_version=True):
            return self.weights_handle(version), version
        self._eval_tags += 1
        return self._rank0_ref(lambda a: a.get_eval_weights), -1 - self._eval_tags

    def scorer_weights_handle(self):
        """What the scorers load of the algorithm's (``{name: state dict}``; under Ray a ref to it)."""
        if self.is_local:
            return self.local.get_scorer_weights()
        self._wait_peers()
        return self._rank0_ref(lambda a: a.get_scorer_weights)

    # -- the algorithm's calls ----------------------------------------------------------------------
    def rollout_request(self, iteration: int, max_len: int, temperature: float, seed: int) -> RolloutRequest:
        """The request the learner's copy of the algorithm builds (an algorithm whose requests carry state of the
        learner's: ``Algorithm.stateful_request``)."""
        return self._call(lambda a: a.rollout_request, iteration, max_len, temperature, seed, keeps_version=True)

    def validate(self) -> dict:
        """The validation reward handed to the learner's algorithm (``Algorithm.on_validation``)."""
        return self._call(lambda a: a.validate, every_rank=True)

    def _sent(self, prompts: PromptBatch) -> PromptBatch | PromptKeys:
        """What the ranks get of ``prompts``: a keyed batch's keys when they are actors (their task reads the rows)."""
        return prompts if self.is_local else prompts.compact()

    def update_batch(self, batch: PromptBatch, iteration: int) -> dict:
        """A supervised update on ``batch`` (MLE pretraining, RAML, ...); its metrics."""
        return self._call(lambda a: a.update, self._sent(batch), iteration, every_rank=True)

    def aux_update(self, positives: PromptBatch, negatives: list, seed: int) -> dict:
        """The algorithm's update of a model of its own on real ``positives`` against sampled ``negatives`` (shard
        handles): ``Algorithm.aux_update``."""
        return self._call(lambda a: a.aux_update, self._sent(positives), negatives, seed, every_rank=True)

    def refresh_reward(self, shards: list) -> dict:
        """A refresh of the run's refreshed reward model on sampled groups (shard handles), on every rank."""
        return self._call(lambda a: a.refresh_reward, shards, every_rank=True)

    def update(self, shards: list, iteration: int, scores: list | None = None, rows=None) -> dict:
        """The rollout algorithm's update on the shard handles (the learner fetches them), with ``scores`` (per-shard
        handles the learner's algorithm gives the rollout, ``Algorithm.assign_scores``); returns its metrics (with
        ``time/sample_s``, the slowest worker's sampling, read from the shards). ``rows``: (N,) int64, the rows of
        the shards' concatenation to train on (dynamic sampling's kept groups); None: all.

        Under Ray the updated weights come back as a second object, kept in the object store for the workers' next
        calls; shards of ``sample(wait=False)`` may still be sampling (the learner starts on them as they arrive;
        a crashed worker's shard is sampled again and the update re-sent: :meth:`ActorManager.retry_update`)."""
        return self._update(shards, iteration, scores, rows)[0]

    def update_and_sample(self, shards: list, iteration: int, prompts: PromptBatch,
                          request: RolloutRequest) -> tuple[dict, list]:
        """:meth:`update`, and ``prompts`` sampled with the weights it makes: (its metrics, the batch's shard handles).

        Under Ray the sampling calls go out right behind the update, carrying the weights ref it will return (the
        version it makes): each worker waits in the object store for the learner's weights and samples at once, with
        no round trip through the driver. An update sent again (a worker lost its shard) sends the batch again with
        the new update's weights. In-process: sampled after the update with its weights."""
        return self._update(shards, iteration, None, None, then=(prompts, request))

    def _update(self, shards: list, iteration: int, scores, rows, then: tuple | None = None) -> tuple[dict, list]:
        """The update, and the batch ``then`` = (prompts, request) sampled with its weights (None: none); (metrics,
        the batch's shard handles)."""
        rollout = self.rollout
        if self.is_local:
            metrics = self.local.update_rollout(shards, iteration, scores, rows)
            if then is None:
                return metrics, []
            rollout.sync_weights()
            return metrics, rollout.sample(*then)
        self._wait_peers()
        # what the rollout group published before, and the version this update makes (for the batch behind it)
        before, after = (None, None) if then is None else (rollout.published(), self.version() + 1)
        self._version = None
        sent: list = []  # the handles of ``then``, sampling behind the update
        peers: list = []  # ranks 1..: the same update on their rows (their metrics are rank 0's)

        def submit(shards):
            metrics_ref, weights_ref = two(self.actor.update_and_publish).remote(shards, iteration, scores, rows)
            peers[:] = [*(two(a.update_and_publish).remote(shards, iteration, scores, rows)[0]  # and the gathering
                          for a in self.reading[1:]),
                        *(a.update_rollout.remote(shards, iteration, scores, rows) for a in self._updating)]
            if then is not None:
                rollout.publish(weights_ref, after)
                sent[:] = rollout.sample(*then, wait=False)
            return metrics_ref, weights_ref

        def on_failure():  # the batch behind went out with weights that never came: dropped (sent again on retry)
            if then is not None:
                self._manager.forget(sent)
                sent.clear()
                rollout.publish(*before)

        metrics, weights_ref, shards = self._manager.retry_update(submit, shards, on_failure, self)
        self._manager.get_learner(peers, self)
        self._manager.forget(shards)  # sampled (the learner has them; it read their timings)
        self._manager.received(metrics)
        self._version = int(metrics["learner/version"])
        self._published = (self._version, weights_ref)
        if then is not None and after != self._version:  # the batch's rollouts carry that version
            raise RuntimeError(f"the learner's update made weights version {self._version}, not {after}")
        return metrics, list(sent)
