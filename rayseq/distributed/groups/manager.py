"""Fault recovery of a run's Ray actors, in one place (as RLlib's ``FaultTolerantActorManager``), shared by the
rollout, scorer and learner groups (:mod:`rayseq.distributed.groups`).

Rollout workers and scorers hold nothing but weights: a call that fails because its actor died waits for Ray to
restart the actor (``max_restarts``), gives it the group's current weights and sends the call again; a lost node
is named in a warning. The learner group holds the training state: a dead learner actor raises
:class:`LearnerLost`, and the driver rebuilds the group from the latest checkpoint (``learner.max_restarts``); its
node's loss ends the run with :class:`~.placement.NodeLost` naming the node (``--resume`` continues
from the last checkpoint).

Calls whose results are still out (``RolloutGroup.sample(wait=False)``: the learner fetches their shards itself)
are tracked here until they are confirmed: a crashed worker's shard (and its chained scoring) is sent again.

An actor whose constructor raised is not a crash: Ray does not re-create it, and one it re-created after a crash whose
constructor raises will not come back either. Both end the run at once with
:class:`~rayseq.distributed.groups.startup.StartupFailed` (:meth:`ActorManager.wait_started` checks every actor once
as the groups start; the waits for re-created actors check it too), never with a wait for Ray or a node-loss message.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import pickle
import time
from dataclasses import dataclass
from typing import Any

from rayseq.distributed.groups.calls import Call, PendingShard
from rayseq.distributed.groups.startup import LABELS, StartupFailed, creation_failure, describe_error, startup_failed

log = logging.getLogger(__name__)


class LearnerLost(RuntimeError):
    """A learner actor died (``ranks``: which of the group's): its training state since the last checkpoint is
    gone; the driver rebuilds the learner group from that checkpoint (``learner.max_restarts``)."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


@dataclass
class Starting:
    """An actor just created, not yet known to have started: ``member`` names it (``rollout worker 1``), ``bundle`` is
    its placement-group bundle (None: not in one), ``ping`` a call it answers once its constructor has returned;
    ``again``: it replaces one that failed (a rebuilt learner)."""

    member: str
    bundle: int | None
    actor: Any
    ping: Any
    again: bool = False


class ActorManager:
    """Waits for calls on stateless actors, re-creating and re-sending after a crash; counts what the driver
    fetches (``recv_bytes``) and the actors restarted (``restarts``)."""

    def __init__(self, ray, placement, note=None):
        self.ray = ray
        self.placement = placement  # rayseq.distributed.groups.placement.Placement: bundle -> node
        self.note = note or (lambda text: None)  # shows a line on the run's progress display
        self.learner_ids: list = []  # refs of the learner actors' Ray ids (hex), answered while they were alive
        self.restarts = 0
        self.recv_bytes = 0  # pickled size of everything the driver fetched (ray.get) through the groups
        self._unconfirmed: dict = {}  # shard ref -> PendingShard
        self._starting: list[Starting] = []  # actors created since the last wait_started

    # -- start-up -----------------------------------------------------------------------------------
    def starting(self, member: str, bundle: int | None, actor, ping, again: bool = False) -> None:
        """An actor just created (:class:`Starting`): the next :meth:`wait_started` checks that it started."""
        self._starting.append(Starting(member, bundle, actor, ping, again))

    def wait_started(self, timeout: float | None = None, every: float = 30.0) -> None:
        """Wait until every actor registered with :meth:`starting` has answered its ping. The first whose constructor
        raised ends the run at once (:class:`StartupFailed`, without waiting for the others); so does any other error
        of the start (a runtime environment that cannot be set up). An actor that crashed while starting (its process
        killed, its node lost) is waited for as Ray re-creates it (up to 120 s). ``timeout``: TimeoutError naming the
        actors not started after that long (None: no limit; a large model takes its time). Every ``every`` seconds
        the progress display names the actors still starting."""
        ray = self.ray
        members, self._starting = self._starting, []
        pending = {m.ping: m for m in members}
        t0 = time.monotonic()
        shown = t0
        while pending:
            waited = time.monotonic() - t0
            if timeout is not None and waited >= timeout:
                raise TimeoutError(f"{', '.join(m.member for m in pending.values())} did not start within "
                                   f"{timeout:.0f} s")
            step = every - (time.monotonic() - shown)  # until the next note, whatever started meanwhile
            if timeout is not None:
                step = min(step, timeout - waited)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, step))
            if time.monotonic() - shown >= every:
                shown = time.monotonic()
                self.note(f"still starting after {shown - t0:.0f} s: {', '.join(m.member for m in pending.values())}")
            for ref in ready:
                member = pending.pop(ref)
                try:
                    ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                    self.check_started(exc, member.member, member.bundle, again=member.again)
                    # it crashed while starting: wait for Ray to re-create it (a learner is not re-created)
                    if (last := self._poll_alive(member.actor, 120.0, True, member.member, member.bundle)) is not None:
                        raise StartupFailed(f"{member.member} on {self._node(member.bundle)} died while starting and "
                                            f"is not back: {describe_error(last)}") from exc
                except ray.exceptions.RayError as exc:
                    raise StartupFailed(f"{member.member} on {self._node(member.bundle)} could not start: "
                                        f"{describe_error(exc)}", cause=exc) from exc

    def check_started(self, exc, member: str, bundle: int | None, again: bool = False) -> None:
        """Raises :class:`StartupFailed` if ``exc`` (a call's failure) says that ``member``'s constructor raised
        (``again``: after Ray re-created it); else nothing."""
        failure = creation_failure(self.ray, exc)
        if failure is not None:
            cause, ip = failure
            raise startup_failed(member, self._node(bundle, ip), cause, again=again) from exc

    def _node(self, bundle: int | None, ip: str | None = None) -> str:
        """The node of placement-group bundle ``bundle`` as a report names it (its id and address; else ``ip``)."""
        describe = getattr(self.placement, "describe_bundle", None)
        if describe is not None and bundle is not None and (text := describe(bundle)):
            return text
        return f"node {ip}" if ip else "its node"

    def received(self, value):
        """Count ``value``'s pickled size in ``recv_bytes`` (what the driver fetched); returns it."""
        self.recv_bytes += len(pickle.dumps(value, protocol=5))
        return value

    # -- the learner ------------------------------------------------------------------------------
    def get_learner(self, refs: list, learners):
        """``ray.get`` of learner calls (one per rank); a dead learner actor raises :class:`LearnerLost` (NodeLost
        if its node went with it)."""
        try:
            return self.received(self.ray.get(refs))
        except self.ray.exceptions.RayError as exc:
            self.learner_failed(exc, learners)
            raise

    def learner_failed(self, exc, learners) -> None:
        """After a learner call of group ``learners`` failed with ``exc``: :class:`NodeLost` if the learner's node
        is lost, :class:`LearnerLost` if one of its actors is dead (a rank's collective fails when another rank
        dies), else nothing (the caller raises ``exc``)."""
        ray = self.ray
        lost = []
        pings = [a.get_version.remote() for a in learners.actors]
        for rank, ping in enumerate(pings):
            try:
                ray.get(ping, timeout=30)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                lost.append(rank)
            except ray.exceptions.GetTimeoutError:  # alive, busy (a collective waiting for a lost rank)
                pass
        if lost:
            if self.placement is not None:  # its node may be going: NodeLost once the GCS has marked it dead
                self.placement.check_learner(wait_s=5)
            raise LearnerLost(f"learner rank{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))} of "
                              f"{len(learners.actors)} died ({type(exc).__name__})", lost) from exc

    def learner_died(self, exc) -> bool:
        """``exc`` (from a Ray call) is a learner actor's death, not a worker's or a scorer's that reached the
        driver through the learner's fetch of its shard."""
        ray = self.ray
        try:  # answered while they were alive (the driver holds those answers)
            learner_ids = ray.get(self.learner_ids, timeout=30)
        except ray.exceptions.RayError:  # one died before it could say: the failure is the learner's
            return True
        return getattr(exc, "actor_id", None) in learner_ids

    def retry_update(self, submit, shards: list, on_failure, learners):
        """``submit(shards) -> (metrics ref, weights ref)`` of a learner update on sampled shards, waited for. If
        it failed because a worker died while sampling one of its shards (the learner fetches them: the update
        changed nothing), the shard is sampled again and the update sent again; any other failure is raised
        (``on_failure()`` first: undo what went out with the failed update). Returns (metrics, weights ref,
        shards)."""
        ray = self.ray
        metrics_ref, weights_ref = submit(shards)
        try:
            return ray.get(metrics_ref), weights_ref, shards
        except ray.exceptions.RayError as exc:
            with contextlib.suppress(ray.exceptions.RayError):  # its second object holds the same error: seen
                ray.get(weights_ref)
            on_failure()
            self.learner_failed(exc, learners)  # a dead learner: NodeLost if its node went with it, else LearnerLost
            restarts = self.restarts
            if not any(ref in self._unconfirmed for ref in shards):
                raise
            shards = self.confirm(shards)
            if self.restarts == restarts:  # every shard was sampled: the learner's own failure (a lost rank?)
                self.learner_failed(exc, learners)
                raise
        metrics_ref, weights_ref = submit(shards)
        try:
            return ray.get(metrics_ref), weights_ref, shards
        except ray.exceptions.RayError as exc2:
            self.learner_failed(exc2, learners)
            raise

    def recover_learner(self, groups) -> None:
        """A learner actor died: every learner actor of ``groups.learner`` is replaced by a fresh one in its bundle,
        the calls of the lost iterations are forgotten (their results unused), and the rollout and scorer groups
        forget the weights they were sent. The caller (the driver) drops the batches sampling ahead and loads the
        latest checkpoint into the new learners."""
        groups.learner.restart()
        self.forget_all()
        groups.rollout.forget_weights()
        groups.scorer.forget_weights()

    # -- calls still out --------------------------------------------------------------------------
    def track(self, ref, pending: PendingShard) -> None:
        """A ``sample(wait=False)`` shard whose result ``ref`` is not confirmed yet (see :meth:`confirm`)."""
        self._unconfirmed[ref] = pending

    def forget(self, refs) -> None:
        """Sampled, or dropped: no longer tracked."""
        for ref in refs or ():
            self._unconfirmed.pop(ref, None)

    def forget_all(self) -> None:
        """Every call still out is dropped (its results will not be used)."""
        self._unconfirmed.clear()

    def confirm(self, shards: list) -> list:
        """``shards`` once sampled: waits for the calls of ``sample(wait=False)`` among them (one wait for all the
        sampling calls, then one for all the scoring calls), a crashed worker's re-sent (its new ref in its place),
        and a crashed scorer's."""
        ray = self.ray
        out = list(shards)
        at = [(k, self._unconfirmed.pop(ref)) for k, ref in enumerate(shards) if ref in self._unconfirmed]
        sampled = [pending.sample.refs[0] for _, pending in at]  # a re-sent call's ref differs from these
        scoring = []  # (k, the scorer's call) of the shards the scorers score
        for (k, pending), first, (rollout, _) in zip(at, sampled, self.wait_all([p.sample for _, p in at])):
            if pending.score is None:
                out[k] = rollout
                continue
            score = pending.score
            if rollout is not first:  # re-sampled: its chained scorer call failed with the worker; score anew
                with contextlib.suppress(ray.exceptions.RayError):
                    ray.get(list(score.refs))
                send = pending.rescore(rollout)
                score = Call(score.group, score.index, send(score.group.actors[score.actor_index]), send,
                             score.worker)
            scoring.append((k, score))
        for (k, _), (scored, _) in zip(scoring, self.wait_all([call for _, call in scoring])):
            out[k] = scored
        return out

    def as_completed(self, calls: list):
        """Yields ``(call, (data ref, info))`` for each :class:`Call` as its info arrives (a crashed actor's call
        re-sent: :meth:`wait`). Callers place each result by its call's index, so what they combine does not depend
        on the order of arrival.

        One completion callback per call, registered once (``ObjectRef.future``: it fetches the small info), the
        arrivals taken from one queue: the driver's cost is linear in the number of calls. A ``ray.wait`` per
        arrival over the calls still out costs N + (N − 1) + ... + 1 look-ups, quadratic
        (``benchmarks/driver_fanin.py``)."""
        futures = {call.refs[1].future(): call for call in calls}
        for done in concurrent.futures.as_completed(futures):
            call = futures[done]
            if done.exception() is None:
                yield call, (call.refs[0], self.received(done.result()))
            else:  # a crashed actor's call is re-sent (a task's own error is raised)
                yield call, self.wait(call)

    def wait_all(self, calls: list) -> list:
        """``[(data ref, info)]`` of every :class:`Call`, in the order of ``calls``: one wait for all of them
        (:meth:`as_completed`)."""
        at = {id(call): k for k, call in enumerate(calls)}
        out: list = [None] * len(calls)
        for call, result in self.as_completed(calls):
            out[at[id(call)]] = result
        return out

    # -- stateless actors (workers, scorers) ------------------------------------------------------
    def wait(self, call: Call) -> tuple:
        """A :class:`Call`'s result: waits for its small info only (:meth:`get`: a crashed actor's call is re-sent,
        ``call.refs`` then the new call's); returns (data ref, info)."""

        def resend(j: int):
            call.worker = j
            call.refs = call.send(call.group.actors[j])
            return call.refs[1]

        info = self.received(self.get(call.group, call.actor_index, call.refs[1], resend))
        return call.refs[0], info

    def get(self, group, i: int, ref, resubmit, max_attempts: int = 6):
        """``ray.get(ref)``; if ``group``'s actor ``i`` died, wait for Ray to restart it, give it the group's
        current weights (``group.restore(actor)``) and ``resubmit(i)`` its work. An ``elastic`` group, which can hand a
        lost actor's work to another (``group.take_over``: the rollout workers), waits ``group.grace_s`` only: an
        actor not back by then is left out of the group and its work ``resubmit(j)`` to actor j; the others wait for
        Ray."""
        ray = self.ray
        kind = group.kind
        for _ in range(max_attempts):
            try:
                return ray.get(ref)
            except ray.exceptions.ObjectLostError:
                # the call's input is gone: the weights it carries lived on the learner's node (NodeLost if so)
                self.placement.check_learner(wait_s=20)
                raise
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                # a call on an actor Ray re-created whose constructor raised: it will not come back
                self.check_started(exc, f"{LABELS[kind]} {i}", group.first_bundle + i, again=True)
                named = self._check_node_loss(exc, group, i)
                self.restarts += 1
                log.warning("%s %d failed (%s); re-dispatching its work", kind, i, type(exc).__name__)
                actor = group.actors[i]
                who = (f"{LABELS[kind]} {i}", group.first_bundle + i)
                if group.elastic and not self._back_within(actor, group.grace_s, *who):
                    j = group.take_over(i, actor.pid.remote())
                    if j is not None:
                        i = j
                        ref = resubmit(j)
                        continue
                self._wait_alive(actor, *who)
                if not named:  # the GCS may mark the node dead after the actor's error reached us: by now it has
                    self._warn_node_lost(group, i, "Ray re-created it on a surviving node")
                group.restore(actor)
                ref = resubmit(i)
        raise RuntimeError(f"{kind} {i} failed {max_attempts} times in a row; giving up")

    def _back_within(self, actor, grace_s: float, member: str, bundle: int | None) -> bool:
        """Whether Ray has re-created ``actor`` within ``grace_s`` seconds; False at once if it is dead for good (its
        restarts spent)."""
        return self._poll_alive(actor, grace_s, True, member, bundle) is None

    def _poll_alive(self, actor, timeout: float, dead_is_final: bool, member: str, bundle: int | None):
        """Ask ``actor`` (``member``, in ``bundle``) for its pid every half second (a call to an actor being re-created
        fails at once) until it answers (None) or ``timeout`` seconds have passed (the last failure); with
        ``dead_is_final`` a dead actor's failure is returned at once. A re-created actor whose constructor raised
        will not answer: :class:`StartupFailed` at once."""
        ray = self.ray
        deadline = time.monotonic() + timeout
        while True:
            ping = actor.pid.remote()
            ready, _ = ray.wait([ping], timeout=max(0.0, min(10.0, deadline - time.monotonic())))
            if not ready:
                last = ray.exceptions.GetTimeoutError("no answer yet")
            else:
                try:
                    ray.get(ping)
                    return None
                except ray.exceptions.ActorUnavailableError as exc:  # being re-created
                    last = exc
                except ray.exceptions.RayActorError as exc:  # dead, not to be re-created
                    self.check_started(exc, member, bundle, again=True)
                    if dead_is_final:
                        return exc
                    last = exc
            if time.monotonic() >= deadline:
                return last
            time.sleep(0.5)

    def _check_node_loss(self, exc, group, i: int) -> bool:
        """After actor ``i``'s call failed: :class:`NodeLost` if the learner went with its node (the failure is the
        learner's own, or its weights' a worker waited for); a warning naming the node if the actor's node is
        lost (Ray re-creates the actor on a surviving node once its bundle is re-placed there). True if it warned."""
        learner_failed = self.learner_died(exc)
        self.placement.check_learner(wait_s=20 if learner_failed else 0)
        if learner_failed:
            raise exc
        return self._warn_node_lost(group, i, "waiting for Ray to re-create it on a surviving node")

    def _warn_node_lost(self, group, i: int, then: str) -> bool:
        """Warn (naming the node) if the node that held actor ``i``'s bundle is dead; True if so."""
        if node := self.placement.lost_node(group.first_bundle + i):
            log.warning("%s %d was on %s and is lost with it; %s", group.kind, i, self.placement.describe(node),
                        then)
            return True
        return False

    def _wait_alive(self, actor, member: str, bundle: int | None, timeout: float = 120.0) -> None:
        """Until Ray has restarted ``actor`` (a worker or scorer); after a node loss that waits for its bundle
        to be re-placed on a surviving node, which needs room there."""
        exc = self._poll_alive(actor, timeout, False, member, bundle)
        if exc is not None:
            raise RuntimeError(
                f"a failed actor was not back within {timeout:.0f} s ({type(exc).__name__}): if its node was "
                "lost, the surviving nodes have no room for its bundle (available: "
                f"{self.ray.available_resources()}); --resume continues the run once the cluster has room, or "
                "with fewer rollout.num_workers / scorer.num_scorers"
            ) from exc
