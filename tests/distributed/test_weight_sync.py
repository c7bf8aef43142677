"""rollout.weight_sync=collective (rayseq.distributed.weights): the learner broadcasts the generator's weights
over a gloo group; after every sync each worker holds the learner's weights (checksums), and the run is the
object-store run's bit for bit with the same driver traffic."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import torch

from rayseq.config import ConfigError, RolloutConfig
from rayseq.distributed.driver import Trainer
from rayseq.distributed.weights.collective import buckets, checksum, unpack
from tests.conftest import tiny_config


def test_buckets_carry_the_bytes_in_the_model_dtype():
    state = {"a": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16), "c": torch.arange(4),
             "d": torch.randn(2, 2, 2, dtype=torch.float64)}
    nbytes = sum(-(-t.numel() * t.element_size() // 64) * 64 for t in state.values())  # each padded to 64 bytes
    for bucket in (1, 30, 1 << 20):
        bufs = buckets(state, bucket)
        assert all(b.dtype == torch.uint8 for b in bufs) and sum(b.numel() for b in bufs) == nbytes
        assert len(bufs) == (1 if bucket > nbytes else len(bufs))
        out = unpack(state, [b.clone() for b in bufs])
        for name, t in state.items():
            assert out[name].dtype == t.dtype and torch.equal(out[name], t)
    assert len(buckets(state, 1)) == 4  # one tensor a bucket when each fills one
    assert torch.equal(checksum(state), checksum(unpack(state, buckets(state, 30))))
    with pytest.raises(ValueError, match="bytes received"):
        unpack(state, [torch.zeros(nbytes + 1, dtype=torch.uint8)])


def test_the_checksum_sums_in_chunks_as_one_sum_does(monkeypatch):
    """:func:`checksum` sums each tensor SUM_CHUNK elements at a time (a float64 copy of a chunk, not of the tensor):
    the plain sums in float64, to its rounding, and the tensors unchanged (a float64 one too)."""
    from rayseq.distributed.weights import collective as weight_sync

    monkeypatch.setattr(weight_sync, "SUM_CHUNK", 7)
    torch.manual_seed(0)
    state = {"a": torch.randn(10, 5), "b": torch.randn(33).to(torch.bfloat16), "c": torch.randn(3, 3).double()}
    before = {k: v.clone() for k, v in state.items()}
    plain = sum(torch.stack([v.double().sum(), v.double().abs().sum()]) for v in state.values())
    assert torch.allclose(checksum(state), plain, rtol=1e-12, atol=0)
    assert all(torch.equal(state[k], before[k]) for k in state)


def test_config():
    with pytest.raises(ConfigError, match="rollout.weight_sync=collective: the workers are Ray actors"):
        tiny_config("rollout.num_workers=0", "rollout.weight_sync=collective")
    tiny_config("rollout.weight_sync=collective", "rollout.max_staleness=1", "algo.name=ppo")  # composes
    for staleness in ("rollout.max_staleness=2", "rollout.max_staleness=3"):
        with pytest.raises(ConfigError, match=r"rollout.weight_sync=collective with rollout.max_staleness=[23]: .*"
                                              r"set rollout.max_staleness=1 \(or 0\), or rollout.weight_sync="
                                              r"object_store"):
            tiny_config("rollout.weight_sync=collective", staleness, "algo.name=ppo")
    tiny_config("rollout.weight_sync=collective", "learner.num_learners=2", "learner.strategy=fsdp",
                "algo.name=ppo")  # every rank takes part in each tensor's gather, rank 0 sends


def learner_sum(trainer) -> float:
    return sum(float(v.double().sum()) for v in trainer.groups.learner.get_weights()["generator"].values())


COMMON = ("rollout.num_workers=2", "rollout.num_cpus_per_worker=0.5", "learner.num_cpus=1", "algo.name=ppo_dynamic",
          "algo.minibatch_size=16", "train.pretrain_iters=4", "train.iters=4", "train.eval_every=0")
SHARDED = ("learner.num_learners=2", "learner.strategy=fsdp", "learner.num_cpus=0.5")  # two FSDP learners


@pytest.mark.ray
def test_collective_sync_is_the_object_store_sync(ray_session, tmp_path):
    checked = []

    def report(row, trainer):  # after every update: each worker holds the learner's version, received over gloo
        if row["stage"] == "train":
            trainer.groups.rollout.sync_weights()
            trainer.groups.rollout.transport.wait()
            stats = trainer.groups.rollout.stats()
            assert {s["version"] for s in stats} == {trainer.groups.learner.version()}
            for s in stats:
                assert s["checksum"] == pytest.approx(learner_sum(trainer), rel=1e-12)
                assert s["collective_loads"] == s["loads"] >= 2  # every version over the group
            checked.append(row["iteration"])

    Trainer(tiny_config(*COMMON, "rollout.weight_sync=collective", "rollout.weight_bucket_mb=0.01",
                        run_dir=tmp_path / "c"), report=report).run()
    Trainer(tiny_config(*COMMON, run_dir=tmp_path / "o")).run()
    assert len(checked) == 4
    c = pq.read_table(tmp_path / "c" / "metrics.parquet").to_pandas()
    o = pq.read_table(tmp_path / "o" / "metrics.parquet").to_pandas()
    same = [k for k in o.columns if not k.startswith("time/") and k in c.columns]
    assert len(same) > 10
    for k in same:  # the same bytes: the same run
        assert c[k].fillna(-1).tolist() == o[k].fillna(-1).tolist(), k
    assert (c["driver/recv_bytes"].dropna() == o["driver/recv_bytes"].dropna()).all()


@pytest.mark.ray
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])  # 80-100 s each
def test_two_sharded_learners_broadcast_the_whole_weights(ray_session, tmp_path, dtype):
    """Two FSDP learners (learner.strategy=fsdp): every rank takes part in gathering each tensor, rank 0 broadcasts
    the buckets as they fill. After every update each worker holds the learners' whole weights (in the model dtype)
    bit for bit, received over the group, and the run is the object-store run of the same learners bit for bit."""
    sharded = (*COMMON, *SHARDED, f"model.dtype={dtype}")
    checked = []

    def report(row, trainer):
        if row["stage"] == "train":
            rollout = trainer.groups.rollout
            rollout.sync_weights()
            rollout.transport.wait()
            whole = trainer.groups.learner.get_weights()["generator"]
            assert {s["collective_loads"] == s["loads"] >= 1 for s in rollout.stats()} == {True}
            for actor in rollout.live_actors:
                held = ray_session.get(actor.__ray_call__.remote(lambda w: w.policy.state_dict()))
                assert list(held) == list(whole)
                for k, v in whole.items():
                    assert v.dtype == held[k].dtype == getattr(torch, dtype) and torch.equal(held[k], v), k
            checked.append(row["iteration"])

    Trainer(tiny_config(*sharded, "rollout.weight_sync=collective", "rollout.weight_bucket_mb=0.01",
                        run_dir=tmp_path / "c"), report=report).run()
    Trainer(tiny_config(*sharded, run_dir=tmp_path / "o")).run()
    assert len(checked) == 4
    c = pq.read_table(tmp_path / "c" / "metrics.parquet").to_pandas()
    o = pq.read_table(tmp_path / "o" / "metrics.parquet").to_pandas()
    same = [k for k in o.columns if not k.startswith("time/") and k in c.columns]
    assert len(same) > 10
    for k in same:
        assert c[k].fillna(-1).tolist() == o[k].fillna(-1).tolist(), k


@pytest.mark.ray
def test_collective_sync_with_staleness_one_is_the_object_store_sync(ray_session, tmp_path):
    """rollout.max_staleness=1: each worker receives version v behind the batch it is sampling and ahead of the next
    one, which carries v too; the run is the object-store run's with the same staleness, bit for bit."""
    pipelined = (*COMMON, "rollout.max_staleness=1")
    loads = []

    def report(row, trainer):  # (loads, of them over the group) per worker, after the batch ahead is sampled
        if row["stage"] == "train":
            loads.append([(s["loads"], s["collective_loads"]) for s in trainer.groups.rollout.stats()])

    Trainer(tiny_config(*pipelined, "rollout.weight_sync=collective", run_dir=tmp_path / "c"), report=report).run()
    Trainer(tiny_config(*pipelined, run_dir=tmp_path / "o")).run()
    c = pq.read_table(tmp_path / "c" / "metrics.parquet").to_pandas()
    o = pq.read_table(tmp_path / "o" / "metrics.parquet").to_pandas()
    assert c["rollout/staleness"].dropna().tolist() == [0.0, 1.0, 1.0, 1.0]
    same = [k for k in o.columns if not k.startswith("time/") and k in c.columns]
    assert len(same) > 10
    for k in same:
        assert c[k].fillna(-1).tolist() == o[k].fillna(-1).tolist(), k
    # one version more each iteration, every one over gloo; the last row comes after the stage's closing validation,
    # decoded on the workers: its decodes carried the last update's weights (never broadcast: no sampling follows it)
    # through the object store, and the stats call loaded the group's version back
    assert loads == [[(i, i)] * 2 for i in range(1, 4)] + [[(4 + 2, 4)] * 2]


@pytest.mark.ray
@pytest.mark.parametrize("learners", [(), SHARDED], ids=["one", "sharded"])
def test_a_worker_killed_before_a_broadcast_leaves_the_run_that_of_the_object_store(ray_session, tmp_path, learners):
    """kill -9 rollout worker 1 after an update, while the group still counts it: the learner's next broadcast cannot
    complete (its peer is gone: it fails within rollout.weight_sync_timeout_s), the worker's calls fail and are sent
    again to the worker Ray re-created, with the weights the calls carry by reference; the next version rebuilds the
    group with the new worker. The run equals the object-store run bit for bit, and afterwards every worker holds the
    learner's weights, received over the new group. Sharded learners: rank 0's failed broadcast still takes part in
    the rest of the gathers, so the ranks' collectives stay in step."""
    import os
    import signal

    killed, after = [], []

    def report(row, trainer):
        if row["stage"] != "train":
            return
        if row["iteration"] == 6 and not killed:  # the second update: version 2 goes out to a dead member
            pid = trainer.groups.rollout.stats()[1]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        elif killed and row["iteration"] == 8:
            trainer.groups.rollout.sync_weights()
            trainer.groups.rollout.transport.wait()
            after.extend(trainer.groups.rollout.stats())
            after.append(learner_sum(trainer))
            after.append(trainer.groups.rollout.transport.rebuilds)

    Trainer(tiny_config(*COMMON, *learners, "rollout.weight_sync=collective", "rollout.weight_sync_timeout_s=5",
                        run_dir=tmp_path / "c"), report=report).run()
    Trainer(tiny_config(*COMMON, *learners, run_dir=tmp_path / "o")).run()
    assert killed
    *stats, total, rebuilds = after
    assert rebuilds >= 1 and killed[0] not in {s["pid"] for s in stats}
    for s in stats:
        assert s["checksum"] == pytest.approx(total, rel=1e-12) and s["collective_loads"] >= 1
    c = pq.read_table(tmp_path / "c" / "metrics.parquet").to_pandas()
    o = pq.read_table(tmp_path / "o" / "metrics.parquet").to_pandas()
    assert c["rollout/worker_restarts"].max() >= 1
    same = [k for k in o.columns if not k.startswith("time/") and k in c.columns
            and k not in ("rollout/worker_restarts", "driver/recv_bytes")]
    for k in same:
        assert c[k].fillna(-1).tolist() == o[k].fillna(-1).tolist(), k


def test_a_group_of_its_own_broadcasts_and_refuses_a_wrong_checksum():
    """Two members of one standalone gloo group (threads of this process, each its own rank): the state arrives
    byte for byte; a broadcast whose checksum is not its bytes' is refused, naming the group; a member that has not
    joined a group it is asked to receive on at a later broadcast fails at once."""
    import threading

    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.weights import collective as weight_sync

    state = {"w": torch.randn(100, 7), "b": torch.randn(33).to(torch.bfloat16)}
    like = {k: torch.zeros_like(v) for k, v in state.items()}
    spec = weight_sync.GroupSpec("rayseq-test-weights", *Learner.rendezvous(), 2, 30.0)
    out: dict = {}

    def member(fn):
        try:
            out[fn.__name__] = fn()
        except Exception as e:  # noqa: BLE001 - the test reads it
            out[fn.__name__] = e

    def sender():
        weight_sync.send(state.items(), spec, 256)
        group = weight_sync.join(spec, 0)  # then a version whose checksum lies
        for buf in weight_sync.buckets(state, 256):
            weight_sync._broadcast(group, buf)
        weight_sync._broadcast(group, weight_sync.checksum(state) + 1.0)

    def receiver():
        first = weight_sync.receive(like, spec, 1, 256, first=True)
        try:
            weight_sync.receive(like, spec, 1, 256)
        except RuntimeError as e:
            return first, e

    threads = [threading.Thread(target=member, args=(f,)) for f in (sender, receiver)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    first, refused = out["receiver"]
    assert out["sender"] is None
    for k in state:
        assert torch.equal(first[k], state[k])
    assert "weights broadcast over rayseq-test-weights: checksum" in str(refused)
    weight_sync.leave(spec.name)
    with pytest.raises(RuntimeError, match="not a member of rayseq-test-weights"):
        weight_sync.receive(like, spec, 1, 256)


@pytest.mark.ray
def test_a_rebuilt_learner_broadcasts_to_workers_that_left_its_old_group(ray_session, tmp_path):
    """kill -9 the learner after an update: the learner group is rebuilt from its checkpoint and the next broadcast
    builds a new weights group; each worker has left the old one (a membership per rebuilt learner otherwise stays,
    with its gloo connections) and holds the learner's weights, received over the new group."""
    import os
    import signal

    import ray

    killed, after = [], []

    def report(row, trainer):
        if row["stage"] != "train":
            return
        if row["iteration"] == 6 and not killed:
            pid = ray.get(trainer.groups.learner.actors[0].placement.remote())["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        elif killed and row["iteration"] == 8 and not after:
            trainer.groups.rollout.sync_weights()
            trainer.groups.rollout.transport.wait()
            after.append((trainer.groups.rollout.stats(), trainer.groups.rollout.transport.group,
                          learner_sum(trainer)))

    Trainer(tiny_config(*COMMON, "rollout.weight_sync=collective", "train.checkpoint_every=4",
                        run_dir=tmp_path / "c"), report=report).run()
    assert killed and after
    stats, group, total = after[0]
    for s in stats:
        assert s["weight_groups"] == [group]
        assert s["checksum"] == pytest.approx(total, rel=1e-12)


class _Recorder:
    """A stand-in for the ``ray`` module and actor handles: every ``actor.method.remote(*args)`` is recorded, in
    order, as (actor, method, args) and answers a ref the stand-in ``ray`` resolves (``rendezvous``: an address)."""

    def __init__(self):
        self.calls: list = []

    def actor(self, name: str):
        recorder = self

        class Method:
            def __init__(self, method):
                self.method = method

            def remote(self, *args):
                recorder.calls.append((name, self.method, args))
                return ("10.0.0.1", 4242) if self.method == "rendezvous" else None

        class Actor:
            def __getattr__(self, method):
                return Method(method)

        return Actor()

    def get(self, ref):
        return ref

    def wait(self, refs, num_returns, timeout):
        return list(refs), []


def test_the_object_store_transport_sends_nothing_and_the_collective_one_queues_each_version():
    from rayseq.distributed.weights.transport import CollectiveTransport, ObjectStoreTransport, make_transport

    ray = _Recorder()
    learner, workers = ray.actor("learner"), [ray.actor("w0"), ray.actor("w1")]
    learners = SimpleNamespace(actor=learner, reading=[learner])  # the learner group: rank 0 is the group's root
    store = make_transport(RolloutConfig(), ray)
    assert isinstance(store, ObjectStoreTransport)
    store.broadcast(learners, workers, 1, (0, (0, 1)))
    store.forget()
    store.wait()
    assert ray.calls == []  # the calls carry the reference: nothing else goes out

    t = make_transport(RolloutConfig(weight_sync="collective", weight_bucket_mb=0.5, weight_sync_timeout_s=7.0), ray)
    assert isinstance(t, CollectiveTransport) and (t.bucket_bytes, t.timeout_s) == (1 << 19, 7.0)
    t.broadcast(learners, workers, 1, (0, (0, 1)))  # the first version: the group is built, its members join
    spec = t.spec
    assert (spec.address, spec.port, spec.world, spec.timeout_s) == ("10.0.0.1", 4242, 3, 7.0)
    assert ray.calls == [("learner", "rendezvous", ()), ("learner", "send_weights", (spec, 1 << 19)),
                         ("w0", "receive_weights", (spec, 1, 1, 1 << 19, True)),
                         ("w1", "receive_weights", (spec, 2, 1, 1 << 19, True))]
    ray.calls.clear()
    t.broadcast(learners, workers, 2, (0, (0, 1)))  # the same workers: the same group, joined already
    assert ray.calls == [("learner", "send_weights", (spec, 1 << 19)),
                         ("w0", "receive_weights", (spec, 1, 2, 1 << 19, False)),
                         ("w1", "receive_weights", (spec, 2, 2, 1 << 19, False))]
    ray.calls.clear()
    t.broadcast(learners, workers[1:], 3, (0, (1,)))  # worker 0 left out: every member leaves, a new group
    left = [(member, "leave_weight_group", (spec.name,)) for member in ("learner", "w0", "w1")]
    assert ray.calls[:4] == [*left, ("learner", "rendezvous", ())]
    assert t.spec.name != spec.name and t.spec.world == 2 and t.rebuilds == 1
    assert ray.calls[-1] == ("w1", "receive_weights", (t.spec, 1, 3, 1 << 19, True))
    ray.calls.clear()
    name = t.group
    t.forget()  # a rebuilt learner: the workers leave its group, the next version builds a new one
    assert ray.calls == [("w1", "leave_weight_group", (name,))] and t.group is None


def test_a_sharded_learners_ranks_all_take_part_and_rank_0_sends():
    """Sharded learners (learner.strategy=fsdp: every rank reads the model): each version's send goes to every rank,
    whose gathers it takes part in, ahead of the workers' receives; the group is rank 0's and the workers'."""
    from rayseq.distributed.weights.transport import CollectiveTransport

    ray = _Recorder()
    rank0, rank1, worker = ray.actor("learner"), ray.actor("learner1"), ray.actor("w0")
    t = CollectiveTransport(ray, 1 << 10)
    t.broadcast(SimpleNamespace(actor=rank0, reading=[rank0, rank1]), [worker], 1, (0, (0,)))
    spec = t.spec
    assert spec.world == 2  # rank 0 and the worker: the other learner ranks never join
    assert ray.calls == [("learner", "rendezvous", ()), ("learner", "send_weights", (spec, 1 << 10)),
                         ("learner1", "send_weights", (spec, 1 << 10)),
                         ("w0", "receive_weights", (spec, 1, 1, 1 << 10, True))]


def test_the_sender_streams_one_bucket_at_a_time(monkeypatch):
    """:func:`~rayseq.distributed.weights.collective.send` of a stream that makes each tensor when asked (as a
    sharded learner gathers them): when a tensor is made, the tensors still alive from before are those of the bucket
    being filled (under ``bucket_bytes``: the sent buckets and their tensors are gone), and the first bucket goes out
    before the last tensor is made; the buckets and checksum are :func:`buckets`' and :func:`checksum`'s of the whole
    state."""
    from torch.multiprocessing.reductions import StorageWeakRef

    from rayseq.distributed.weights import collective as weight_sync

    torch.manual_seed(0)
    state = {f"t{i}": torch.randn(n) for i, n in enumerate([100, 300, 50, 700, 20, 20, 400, 64, 64, 5])}
    bucket_bytes = 1024
    sent, alive_before, made = [], [], []
    refs: list = []

    def stream():
        for name, t in state.items():
            alive_before.append(sum(nbytes for ref, nbytes in refs if not ref.expired()))
            made.append(len(sent))  # buckets sent before this tensor was made
            copy = t.clone()  # a gathered tensor: the stream's own
            refs.append((StorageWeakRef(copy.untyped_storage()), copy.numel() * copy.element_size()))
            yield name, copy
            del copy

    monkeypatch.setattr(weight_sync, "join", lambda spec, rank: "group")
    monkeypatch.setattr(weight_sync, "_broadcast", lambda group, buf: sent.append(buf.clone()))
    weight_sync.send(stream(), weight_sync.GroupSpec("g", "127.0.0.1", 0, 2, 1.0), bucket_bytes)
    whole = weight_sync.buckets(state, bucket_bytes)
    assert len(sent) == len(whole) + 1 and len(whole) >= 3
    assert all(torch.equal(a, b) for a, b in zip(sent, whole))
    assert torch.equal(sent[-1], weight_sync.checksum(state))
    assert max(alive_before) < bucket_bytes  # the whole state is 9,692 bytes
    assert made[-1] >= len(whole) - 1  # every full bucket went out before the last tensor was made


def test_a_failed_broadcast_drains_the_stream():
    """A broadcast that fails (here its group cannot be joined: no other member comes) still takes the rest of the
    stream, so that a sharded learner's rank 0 takes part in every gather the other ranks wait in; then raises."""
    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.weights import collective as weight_sync

    made = []

    def stream():
        for i in range(4):
            made.append(i)
            yield f"t{i}", torch.zeros(8)

    spec = weight_sync.GroupSpec("rayseq-test-alone", *Learner.rendezvous(), 2, 1.0)
    with pytest.raises(Exception):  # noqa: B017 - gloo's timeout (its type varies by version)
        weight_sync.send(stream(), spec, 16)
    assert made == [0, 1, 2, 3]
    weight_sync.leave(spec.name)
    made.clear()
    weight_sync.send(stream(), spec, 16, root=False)  # a rank that takes part in the gathers alone
    assert made == [0, 1, 2, 3]


def _publish_from_two_sharded_ranks(rank: int, port: int, weights_port: int, out_dir: str, dtype: str) -> None:
    """Ranks 0 and 1: two FSDP learners (gloo) publishing over the weights group, as ``Learner.send_weights`` does;
    rank 2: a rollout worker receiving (member 1 of that group)."""
    import os

    import torch.distributed as dist

    from rayseq.distributed.actors.strategies import FSDP
    from rayseq.distributed.weights import collective as weight_sync

    spec = weight_sync.GroupSpec("rayseq-test-fsdp", "127.0.0.1", weights_port, 2, 60.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))  # odd sizes: uneven shards
    if rank == 2:
        like = {k: v.to(getattr(torch, dtype)) for k, v in model.state_dict().items()}
        torch.save(weight_sync.receive(like, spec, 1, 200, first=True), f"{out_dir}/worker.pt")
        return
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        strategy = FSDP(torch.device("cpu"), getattr(torch, dtype))
        strategy.wrap(rank, 2, {"m": model}, {"opt": torch.optim.Adam(model.parameters())})
        assert all(p.to_local().numel() < p.numel() for p in model.parameters())  # each rank holds a part
        weight_sync.send(strategy.whole_tensors(model.state_dict()), spec, 200, root=rank == 0)
        check = torch.ones(1) * (rank + 1)
        dist.all_reduce(check)  # the ranks' collectives still in step
        assert float(check) == 3.0
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # three spawned processes: 30-60 s on 2 loaded cores
@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_two_sharded_learners_publish_the_whole_weights_in_the_model_dtype(tmp_path, dtype):
    """Two FSDP learners (gloo) and a worker: rank 0 streams the weights, rank 1 takes part in each tensor's gather
    (of its shard cast to the model dtype); the worker holds the whole model, cast to the model dtype, bit for bit.
    (float32: the Ray test of two sharded learners.)"""
    import socket

    import torch.multiprocessing as mp

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    mp.start_processes(_publish_from_two_sharded_ranks, args=(*ports, str(tmp_path), dtype), nprocs=3,
                       start_method="spawn")
    torch.manual_seed(0)
    whole = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3)).state_dict()
    got = torch.load(tmp_path / "worker.pt")
    assert list(got) == list(whole)
    for k, v in whole.items():
        assert got[k].dtype == getattr(torch, dtype) and torch.equal(got[k], v.to(got[k].dtype)), k
