"""Is the run directory one that every learner's node sees? A local ``run_dir`` on a multi-node cluster is correct only
when it is shared (the same filesystem mounted at the same path on every node: NFS, EFS, a shared volume): the
learners write their checkpoint files on their own nodes (a sharded learner every rank its shards), the driver the
checkpoint's head on its node. On a disk of one node the checkpoint ends up split across machines, and resume,
serving and export fail later, when the files are looked for.

The check (:func:`check_shared`, at the start of a run and after the learner actors are rebuilt, before anything is
restored) asks the filesystem itself rather than comparing node names or mount tables: the driver writes a file
with a fresh random token in ``run_dir/.rayseq-shared/<token>/``; each learner actor, on its own node, reads it back
(:func:`probe`), and when it reads the token, writes its own answer file beside it, which the driver reads back in
turn. A rank that cannot read the token (another directory at that path: the node's own disk) or whose answer the
driver cannot read (a one-way or lagging copy) fails the check, and the run is refused with a message that names
each such rank's node and the fix. An object store URI (``s3://``, ``gs://``) is one store for every node: nothing
to check.
"""

from __future__ import annotations

import uuid

from rayseq.config.base import ConfigError
from rayseq.storage import RunStore

PROBE_DIR = ".rayseq-shared"


class RunDirNotShared(ConfigError):
    """A local run directory that not every learner's node sees (the message names the nodes and the fix): a bad
    ``run_dir`` for this cluster."""


def node() -> dict:
    """This process's Ray node: its id and IP address."""
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address()}


def probe(location: str, rel: str, token: str, rank: int, here: dict) -> dict:
    """On a learner's node (``here``: its :func:`node`): whether ``<location>/<rel>/driver`` reads back as ``token``
    (``seen``); if so, this rank's answer ``<rel>/rank<rank>`` written beside it (its node id). Returns ``{"rank",
    "seen", "node_id", "ip"}``."""
    store = RunStore(location)
    try:
        seen = store.read_text(f"{rel}/driver") == token
    except OSError:  # (FileNotFoundError: not there; another error: not readable either)
        seen = False
    if seen:
        store.write_text(f"{rel}/rank{rank}", here["node_id"])
    return {"rank": rank, "seen": seen, **here}


def check_shared(store: RunStore, ask, driver: dict) -> None:
    """Raise :class:`RunDirNotShared` unless every learner sees the local run directory ``store`` as the driver does.
    ``ask(location, rel, token)``: every learner rank's :func:`probe` answer (run in its actor), as a list;
    ``driver``: the driver's :func:`node`."""
    if not store.is_local:
        return
    token = uuid.uuid4().hex
    rel = f"{PROBE_DIR}/{token}"
    store.write_text(f"{rel}/driver", token)
    try:
        answers = ask(store.display(), rel, token)
        missing = [a for a in answers if not a["seen"] or _answer(store, rel, a["rank"]) != a["node_id"]]
    finally:
        store.delete_dir(PROBE_DIR)
    if not missing:
        return
    ranks = "; ".join(f"learner rank {a['rank']} on node {a['node_id']} ({a['ip']}) "
                      + ("does not see the file the driver wrote there" if not a["seen"]
                         else "wrote a file there that the driver does not see") for a in missing)
    raise RunDirNotShared(
        f"run_dir {store.display()} is a local directory that not every learner's node shares with the driver's node "
        f"{driver['node_id']} ({driver['ip']}): {ranks}. The learners write their checkpoint files on their own "
        "nodes, so the checkpoints would be split across machines and resume, serving and export would fail. Use a "
        "directory mounted at the same path on every node (NFS, EFS, a shared volume) or an object store "
        "(run_dir=s3://bucket/runs/<name>); see docs/guides/cluster.md")


def _answer(store: RunStore, rel: str, rank: int) -> str | None:
    try:
        return store.read_text(f"{rel}/rank{rank}")
    except OSError:
        return None
