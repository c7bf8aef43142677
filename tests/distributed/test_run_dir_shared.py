"""The check that a local run directory is shared by every learner's node (rayseq.distributed.run_dir), with real
processes and a real node-local folder: a learner's probe runs in another process, once in this machine's mount
namespace (the same filesystem: a shared folder), once in a mount namespace of its own where the run directory's
parent is an empty tmpfs (the same path on a node's own disk). The check on a real multi-node Ray cluster, through
``python -m rayseq.train``: tests/deploy/test_run_dir_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rayseq.distributed.run_dir import PROBE_DIR, RunDirNotShared, check_shared, probe
from rayseq.storage import RunStore
from tests.deploy.local_cluster import ROOT, node_local_prefix

DRIVER = {"node_id": "driver-node", "ip": "10.0.0.1"}
PROBE = ("import json, sys; from rayseq.distributed.run_dir import probe; "
         "print(json.dumps(probe(*sys.argv[1:4], int(sys.argv[4]), json.loads(sys.argv[5]))))")


def probe_elsewhere(prefix: list[str], location: str, rel: str, token: str, rank: int, node: str) -> dict:
    """:func:`probe` run in a process of its own (under ``prefix``: its own mount namespace)."""
    here = {"node_id": node, "ip": f"10.0.0.{rank + 2}"}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([*prefix, sys.executable, "-c", PROBE, location, rel, token, str(rank), json.dumps(here)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.fixture
def node_local(tmp_path):
    """A folder (``tmp_path/node``) and the prefix under which a process sees an empty folder of its own there."""
    folder = tmp_path / "node"
    folder.mkdir()
    prefix = node_local_prefix(folder)
    if prefix is None:
        pytest.skip("mount namespaces are not permitted here (unshare --mount): no node-local folder to test with")
    return folder, prefix


def test_a_learner_that_does_not_see_the_drivers_file_is_refused_naming_its_node(node_local):
    folder, prefix = node_local
    store = RunStore(folder / "run")

    def ask(location, rel, token):
        return [probe(location, rel, token, 0, {"node_id": "same-fs-node", "ip": "10.0.0.2"}),  # this process
                probe_elsewhere([], location, rel, token, 1, "other-process-node"),  # another process, same fs
                probe_elsewhere(prefix, location, rel, token, 2, "own-disk-node")]  # its own folder at that path

    with pytest.raises(RunDirNotShared) as err:
        check_shared(store, ask, DRIVER)
    msg = str(err.value)
    assert "learner rank 2 on node own-disk-node (10.0.0.4) does not see the file the driver wrote there" in msg
    assert "same-fs-node" not in msg and "other-process-node" not in msg  # only the one that does not share it
    assert f"run_dir {folder / 'run'} is a local directory" in msg and "driver-node (10.0.0.1)" in msg
    assert "mounted at the same path on every node" in msg and "run_dir=s3://" in msg
    assert not store.exists(PROBE_DIR)  # the probe's files are removed either way


def test_a_shared_run_dir_passes_and_leaves_nothing_behind(node_local):
    folder, prefix = node_local
    store = RunStore(folder / "run")
    seen = []

    def ask(location, rel, token):
        answers = [probe(location, rel, token, 0, {"node_id": "a", "ip": "10.0.0.2"}),
                   probe_elsewhere([], location, rel, token, 1, "b")]
        # each rank's answer is in the run directory, for the driver to read back
        seen.extend(store.read_text(f"{rel}/rank{a['rank']}") for a in answers)
        return answers

    check_shared(store, ask, DRIVER)
    assert seen == ["a", "b"]
    assert store.listdir() == []  # the run directory as it was (created by the check, empty)


def test_an_object_store_needs_no_check(monkeypatch):
    """An ``s3://`` run directory is one store for every node: no learner is asked (and nothing is written: the
    endpoint, an S3-compatible server's as MinIO users set it, is never contacted)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    asked = []
    check_shared(RunStore("s3://bucket/run"), lambda *a: asked.append(a) or [], DRIVER)
    assert asked == []
