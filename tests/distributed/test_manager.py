"""ActorManager's waits on many calls at once (``as_completed``, ``wait_all``): every call's result once, whatever the
order the results arrive in, placed by call; a crashed actor's call re-sent to the restarted actor; a re-created actor
whose constructor raises ends the wait at once."""

from __future__ import annotations

import os
import time
from functools import partial

import numpy as np
import pytest

from rayseq.config import blame
from rayseq.distributed.groups.calls import Call
from rayseq.distributed.groups.manager import ActorManager
from rayseq.distributed.groups.startup import StartupFailed

pytestmark = pytest.mark.ray


class Answerer:
    """Answers call ``i`` after ``delay`` seconds with (data, info); with ``crash_marker`` it exits at its first
    such call (the marker file says it did), as a kill -9 would end it."""

    def pid(self) -> int:
        return os.getpid()

    def answer(self, i: int, delay: float, crash_marker: str | None = None) -> tuple:
        if crash_marker is not None and not os.path.exists(crash_marker):
            open(crash_marker, "w").close()
            os._exit(1)
        time.sleep(delay)
        return np.full(3, i), {"i": i, "pid": os.getpid()}


class Group:
    """What the manager asks of a group after a crash: its actors, its kind, its first bundle, whether another actor
    may take a lost one's work, restore."""

    kind = "worker"
    first_bundle = 1
    elastic = False

    def __init__(self, actors: list):
        self.actors = actors
        self.restored: list = []

    def restore(self, actor) -> None:
        self.restored.append(actor)


class NoPlacement:
    def check_learner(self, wait_s: float = 0) -> None:
        return None

    def lost_node(self, bundle: int):
        return None


def send_answer(i: int, delay: float, crash_marker, actor):
    return actor.answer.options(num_returns=2).remote(i, delay, crash_marker)


def test_many_calls_arriving_out_of_order_are_each_taken_once_and_placed_by_call(ray_session):
    ray = ray_session
    actors = [ray.remote(num_cpus=0, max_concurrency=64)(Answerer).remote() for _ in range(2)]
    group, manager = Group(actors), ActorManager(ray, NoPlacement())
    n = 60
    # call i waits longer the earlier it was sent (1.2 s down to 0 in steps of 20 ms): they arrive about in reverse
    calls = [Call(group, i % 2, send(actors[i % 2]), send)
             for i, send in enumerate(partial(send_answer, i, 0.02 * (n - i), None) for i in range(n))]
    arrived = [call.refs[1] for call, _ in manager.as_completed(calls)]
    order = [next(k for k, c in enumerate(calls) if c.refs[1] is ref) for ref in arrived]
    assert sorted(order) == list(range(n)) and order != list(range(n))
    assert order.index(n - 1) < order.index(0)  # the last sent, answered at once, came before the first
    # wait_all: the calls' order, whatever the arrivals'
    calls = [Call(group, i % 2, send(actors[i % 2]), send)
             for i, send in enumerate(partial(send_answer, i, 0.01 * (n - i), None) for i in range(n))]
    results = manager.wait_all(calls)
    assert [info["i"] for _, info in results] == list(range(n))
    assert [int(ray.get(data)[0]) for data, _ in results] == list(range(n))
    assert manager.restarts == 0 and manager.recv_bytes > 0


def test_a_crashed_actors_call_is_sent_again_among_many(ray_session, tmp_path):
    ray = ray_session
    steady = ray.remote(num_cpus=0, max_concurrency=64)(Answerer).remote()
    crashing = ray.remote(num_cpus=0, max_restarts=1)(Answerer).remote()
    group, manager = Group([steady, crashing]), ActorManager(ray, NoPlacement())
    marker = str(tmp_path / "crashed")
    first_pid = ray.get(crashing.pid.remote())
    sends = [partial(send_answer, i, 0.01 * (i % 7), marker if i == 17 else None) for i in range(30)]
    calls = [Call(group, 1 if i == 17 else 0, send(group.actors[1 if i == 17 else 0]), send)
             for i, send in enumerate(sends)]
    sent = calls[17].refs
    results = manager.wait_all(calls)
    assert os.path.exists(marker)  # it did crash
    assert [info["i"] for _, info in results] == list(range(30))
    assert [int(ray.get(data)[0]) for data, _ in results] == list(range(30))
    assert calls[17].refs != sent and results[17][0] is calls[17].refs[0]  # the re-sent call's result
    assert results[17][1]["pid"] != first_pid  # answered by the restarted actor, given the weights first
    assert manager.restarts == 1 and group.restored == [crashing]


class StartsOnce:
    """An actor whose constructor raises once ``marker`` exists (as a worker's whose model directory has gone from
    its node); ``crash`` writes the marker and exits, as a kill -9 would end it."""

    def __init__(self, marker: str):
        if os.path.exists(marker):
            raise blame("model.path", FileNotFoundError(f"model.path={marker}: no Hugging Face model there"))
        self.marker = marker

    def pid(self) -> int:
        return os.getpid()

    def crash(self) -> None:
        open(self.marker, "w").close()
        os._exit(1)


def test_an_actor_recreated_whose_constructor_raises_ends_the_wait_at_once(ray_session, tmp_path):
    """Ray re-creates a crashed actor; its constructor raises now: the call's wait ends at once with one line naming
    the actor, the error and the key to change (no wait for an actor that cannot come back, no node-loss message)."""
    ray = ray_session
    marker = str(tmp_path / "gone")
    actor = ray.remote(num_cpus=0, max_restarts=1)(StartsOnce).remote(marker)
    ray.get(actor.pid.remote())
    group, manager = Group([actor]), ActorManager(ray, NoPlacement())
    t0 = time.monotonic()
    with pytest.raises(StartupFailed, match=r"^rollout worker 0 on node \S+ was re-created after a failure and could "
                                            rf"not start: FileNotFoundError: model.path={marker}: no Hugging Face "
                                            r"model there \(the key to change: model.path\)$"):
        manager.get(group, 0, actor.crash.remote(), lambda j: actor.pid.remote())
    assert time.monotonic() - t0 < 30
    assert group.restored == []


def test_the_actors_still_starting_are_named_every_so_often(ray_session):
    """While actors start, the progress display names those not started yet every ``every`` seconds, counted from the
    start of the wait (an actor that started meanwhile does not put the next line off)."""
    ray = ray_session
    fast, slow = (ray.remote(num_cpus=0)(Answerer).remote() for _ in range(2))
    ray.get([fast.pid.remote(), slow.pid.remote()])
    notes: list = []
    manager = ActorManager(ray, NoPlacement(), note=lambda text: notes.append((time.monotonic(), text)))
    manager.starting("rollout worker 0", None, fast, fast.answer.remote(0, 0.6))
    manager.starting("rollout worker 1", None, slow, slow.answer.remote(1, 2.6))
    t0 = time.monotonic()
    manager.wait_started(every=1.0)
    assert [text for _, text in notes] == ["still starting after 1 s: rollout worker 1",
                                           "still starting after 2 s: rollout worker 1"]
    assert notes[0][0] - t0 < 1.4, notes  # not 1 s after the first actor answered (at 0.6 s)
