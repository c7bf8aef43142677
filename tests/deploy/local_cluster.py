"""A real multi-node Ray cluster on this one machine, for tests: a head and worker nodes, each one a
`ray start --block` process in its own process group (own ports, own temp dir, its own custom resource), joined
with `ray start --address` and token authentication on.

Teardown signals only these process groups (and what is left of them): `ray stop` would stop every Ray instance of
the user on the machine, other test sessions' included.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
# the ray CLI beside this Python (a virtualenv's), else the one on PATH (a machine whose Ray lives elsewhere)
RAY = str(Path(sys.executable).with_name("ray"))
if not Path(RAY).exists():
    RAY = shutil.which("ray") or RAY

# node loss is noticed in ~2 s instead of Ray's default ~15 s (5 missed health checks, 3 s apart)
FAST_HEALTH_CHECKS = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3",
                      "RAY_health_check_timeout_ms": "1000", "RAY_health_check_initial_delay_ms": "1000"}


def node_ports() -> list[str]:
    """Every port a node binds, free ones: another Ray on this machine holds the defaults."""
    return [f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
            "--min-worker-port=0", "--max-worker-port=0",  # 0: each worker binds a port the OS picks
            f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]


def node_local_prefix(path: str | os.PathLike) -> list[str] | None:
    """A command prefix that runs a command in a mount namespace of its own, where the folder ``path`` (it must exist)
    is an empty tmpfs that no other process sees: to the rest of the machine, the same path on a node's own disk.
    None where this machine does not allow it (no `unshare`, mount namespaces not permitted)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    prefix = [unshare, "--mount", "--propagation", "private", *([] if os.geteuid() == 0 else ["--map-root-user"]),
              "sh", "-c", 'mount -t tmpfs node-local "$0" && exec "$@"', str(path)]
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return prefix if ok else None


class LocalCluster:
    """``start()`` the head, ``add_node(name)`` worker nodes, ``kill_node(name)``, ``shutdown()``.

    Every node advertises the custom resource ``node_<name>: 1`` (the head ``node_head``), so a config can pin an
    actor to a node (``learner.resources={node_w1: 1}``)."""

    def __init__(self, num_cpus: int = 2, num_gpus: int | None = None):
        self.num_cpus, self.num_gpus = num_cpus, num_gpus  # num_gpus None: what Ray detects
        self.env = dict(os.environ, RAY_AUTH_MODE="token", **FAST_HEALTH_CHECKS)
        self.env.pop("RAY_ADDRESS", None)
        # rayseq as installed on a cluster: this checkout first
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [self.env.get("PYTHONPATH")])])
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self._args: dict[str, tuple] = {}
        self._old_groups: set[int] = set()
        self._resource: dict[str, str] = {}  # node name -> the custom resource that tells it apart
        self._temp: dict[str, str] = {}  # node name -> its temp dir (its Ray logs: session_latest/logs)
        self.temp_dirs: list[str] = []
        self.gcs = self.dashboard = None

    # -- nodes ------------------------------------------------------------------------------------------
    def _start(self, name: str, args: list[str], resources: dict | None = None,
               prefix: list[str] | None = None) -> None:
        self._args[name] = (args, resources, prefix)
        if name in self.procs:  # a node started again: its old process group is torn down with the cluster too
            self._old_groups.add(self.procs[name].pid)
        temp_dir = tempfile.mkdtemp(prefix=f"rsq{name}", dir="/tmp")  # short: Ray's socket paths live below it
        self.temp_dirs.append(temp_dir)
        self._temp[name] = temp_dir
        resources = json.dumps(resources or {f"node_{name}": 1})
        self.logs[name] = Path(temp_dir) / "ray-start.log"
        with open(self.logs[name], "wb") as log:
            self.procs[name] = subprocess.Popen(
                [*(prefix or []), RAY, "start", "--block", *args, *node_ports(), f"--num-cpus={self.num_cpus}",
                 *([f"--num-gpus={self.num_gpus}"] if self.num_gpus is not None else []), f"--resources={resources}",
                 "--disable-usage-stats", f"--temp-dir={temp_dir}"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def log_tail(self, name: str) -> str:
        """The end of node ``name``'s `ray start` output (why it did not come up)."""
        try:
            return self.logs[name].read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def ray_logs(self, name: str = "head", chars: int = 1500,
                 files: tuple[str, ...] = ("gcs_server.out", "raylet.out", "dashboard.log", "dashboard.err")) -> str:
        """The ends of node ``name``'s own Ray logs (its GCS, raylet, dashboard): why a node or its dashboard went
        away, for a failing test's message (the temp dirs are removed with the cluster)."""
        logs = Path(self._temp.get(name, "/nonexistent")) / "session_latest" / "logs"
        out = []
        for f in files:
            try:
                out.append(f"--- {name}: {f}\n" + (logs / f).read_text(errors="replace")[-chars:])
            except OSError:
                continue
        return "\n".join(out)

    def start(self, timeout: float = 120, *, same_ports: bool = False) -> LocalCluster:
        """The head (GCS, dashboard and job agent on free ports; ``same_ports``: the GCS and dashboard ports it had,
        so that the address callers hold stays valid); returns once it accepts `ray job` calls."""
        subprocess.run([RAY, "get-auth-token", "--generate"], env=self.env, check=True, capture_output=True,
                       timeout=60)
        if not (same_ports and self.gcs and self.dashboard):
            self.gcs, self.dashboard = free_port(), free_port()
        _HEADS[self.address] = self
        self._start("head", ["--head", f"--port={self.gcs}", f"--dashboard-port={self.dashboard}",
                             f"--ray-client-server-port={free_port()}", "--include-dashboard=true",
                             "--dashboard-host=127.0.0.1"])
        deadline = time.monotonic() + timeout
        while True:
            r = subprocess.run([RAY, "job", "list", "--address", self.address], env=self.env, capture_output=True,
                               text=True, timeout=60)
            if r.returncode == 0:
                return self
            if self.procs["head"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray head did not come up: {r.stderr[-2000:]}\n{self.log_tail('head')}")
            time.sleep(1)

    @property
    def address(self) -> str:
        """The dashboard's (job submission) address."""
        return f"http://127.0.0.1:{self.dashboard}"

    def alive(self) -> bool:
        """Whether the head runs and its dashboard takes connections (`ray start --block` ends when one of its
        processes does: a dashboard or job agent that went away ends it, a few seconds later)."""
        head = self.procs.get("head")
        for _ in range(3):  # a refused connection, three times 2 s apart: gone (a busy one answers late, not never)
            if head is None or head.poll() is not None:
                return False
            r = subprocess.run([RAY, "job", "list", "--address", self.address], env=self.env, capture_output=True,
                               text=True, timeout=60)
            if r.returncode == 0 or not any(s in r.stdout + r.stderr for s in _HEAD_GONE):
                return True
            time.sleep(2)
        return False

    def restart_if_gone(self, what: str) -> bool:
        """When the head went away (on a loaded machine its dashboard or job agent can): tear it down with whatever is
        left of it, start it again on the same ports, print its old logs (the test's captured output) after ``what``
        (what noticed it), and say so."""
        if self.alive():
            return False
        why = f"{self.log_tail('head')}\n{self.ray_logs('head', chars=3000)}"
        self.shutdown()
        self.procs, self.logs, self._temp, self.temp_dirs, self._old_groups = {}, {}, {}, [], set()
        self.start(same_ports=True)
        print(f"the Ray head at {self.address} went away ({what}); started again on its ports. Its logs:\n{why}",
              flush=True)
        return True

    def add_node(self, name: str, resources: dict | None = None, wait: bool = True, timeout: float = 120,
                 prefix: list[str] | None = None) -> None:
        """A worker node joining the head (advertising ``resources``, default ``{node_<name>: 1}``); with ``wait``,
        returns once the GCS lists it alive (else :meth:`wait_node`). ``prefix``: the command its `ray start` runs
        under (:func:`node_local_prefix`: a folder of its own)."""
        self._start(name, [f"--address=127.0.0.1:{self.gcs}"], resources, prefix)
        self._resource[name] = next(iter(resources or {f"node_{name}": 1}))
        if wait:
            self.wait_node(name, timeout)

    def wait_node(self, name: str, timeout: float = 120, retries: int = 1) -> None:
        """Until node ``name`` is alive in the GCS. `ray start` gives a raylet 30 s (fixed) to register, which a
        loaded machine can miss: a node whose `ray start` gave up is started once more (fresh ports)."""
        deadline = time.monotonic() + timeout
        while self._live_node(self._resource[name]) is None:
            if self.procs[name].poll() is not None and retries > 0:
                retries -= 1
                self._stop_group(self.procs[name].pid)
                self._start(name, *self._args[name])
            elif self.procs[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node {name} did not join the cluster: {self.log_tail(name)}\n"
                                   f"{self.ray_logs(name)}\n{self.ray_logs()}")
            time.sleep(1)

    def nodes(self) -> list[dict]:
        """The cluster's node table from Ray's state API (`ray list nodes --detail`): node_id, state,
        resources_total… (a subprocess: this test process keeps its own Ray settings, authentication included)."""
        r = subprocess.run([RAY, "list", "nodes", "--address", self.address, "--detail", "--format", "json"],
                           env=self.env, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"ray list nodes failed: {r.stderr[-1500:]}\n{self.ray_logs()}")
        if r.stdout.startswith("No resource in the cluster"):  # what it prints for an empty table, not JSON
            return []
        return json.loads(r.stdout)

    def node_id(self, name: str) -> str | None:
        """Id of the live node advertising ``node_<name>`` (None until it has joined)."""
        return self._live_node(f"node_{name}")

    def _live_node(self, resource: str) -> str | None:
        for n in self.nodes():
            if n["state"] == "ALIVE" and resource in (n.get("resources_total") or {}):
                return n["node_id"]
        return None

    def kill_node(self, name: str) -> int:
        """Node ``name`` lost, as when its machine goes down: SIGKILL to its raylet, then to every other process of
        the node (the `ray start` process, agents, and the actors' worker processes, each of which the raylet puts
        in a process group of its own). Returns the raylet's pid. Only this cluster's node is signalled."""
        procs = self._descendants(name)
        (raylet,) = [p for p in procs if p.name() == "raylet"]
        raylet.kill()
        for p in [psutil.Process(self.procs[name].pid), *procs]:
            try:
                p.kill()
            except psutil.Error:
                pass
        return raylet.pid

    def _descendants(self, name: str) -> list[psutil.Process]:
        try:
            return psutil.Process(self.procs[name].pid).children(recursive=True)
        except psutil.Error:
            return []

    # -- teardown ---------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        # the actors' worker processes have process groups of their own: signalled one by one at the end
        workers = [p for name in self.procs for p in self._descendants(name)]
        groups = {p.pid for p in self.procs.values()} | self._old_groups  # each node's group (start_new_session)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pgid in groups:
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and self._left(groups):
                time.sleep(0.5)
            if not self._left(groups):
                break
        for p in workers:
            try:
                p.kill()
            except psutil.Error:
                pass
        for p in self.procs.values():
            p.poll()
        for d in self.temp_dirs:
            shutil.rmtree(d, ignore_errors=True)

    @staticmethod
    def _stop_group(pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    @staticmethod
    def _left(groups: set[int]) -> list[int]:
        """Live processes of these process groups (orphans of a node included)."""
        left = []
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) in groups and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p.pid)
            except (psutil.Error, ProcessLookupError):
                pass
        return left

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


_HEADS: dict[str, LocalCluster] = {}  # job-submission address -> the cluster whose head it is (submit_job restarts it)
_HEAD_GONE = ("Connection aborted", "Connection refused", "Failed to connect to Ray at address", "RemoteDisconnected")


def _restart_if_gone(address: str, out: str) -> bool:
    """After a `ray job` call to ``address`` failed: :meth:`LocalCluster.restart_if_gone` for a head of these tests."""
    cluster = _HEADS.get(address)
    return cluster is not None and cluster.restart_if_gone(out.strip().splitlines()[-1][:300] if out.strip() else "?")


def submit(cluster: LocalCluster, *cmd: str, **kwargs) -> subprocess.CompletedProcess:
    """:func:`submit_job` to this cluster's head."""
    return submit_job(cluster.address, cluster.env, *cmd, **kwargs)


def job_status(address: str, env: dict, job: str) -> str:
    """SUCCEEDED, FAILED, STOPPED, RUNNING or PENDING (`ray job status`: "Job 'x' succeeded", "Status for job 'x':
    RUNNING"); NONE for an id the head does not know; "?" when the call itself failed (its "Failed to connect to API
    server" is not the job's status)."""
    r = subprocess.run([RAY, "job", "status", "--address", address, job], env=env, capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        return "NONE" if "does not exist" in r.stdout + r.stderr else "?"
    out = r.stdout.upper()
    return next((s for s in ("SUCCEEDED", "FAILED", "STOPPED", "RUNNING", "PENDING") if s in out), "?")


def submit_job(address: str, env: dict, *cmd: str, wait_s: float = 120, timeout: float = 900,
               options: tuple | list = (), working_dir: Path = ROOT, cwd: Path | None = None
               ) -> subprocess.CompletedProcess:
    """`ray job submit --working-dir <working_dir> [options] -- cmd` (run from ``cwd``), answered as `ray job submit`
    answers: the job's output, then "Job 'id' succeeded" (exit status 0) or failed/stopped (1).

    The job is submitted with --no-wait under a submission id (the one in ``options``, else one of its own), its
    status polled every 2 s to its end (at most ``timeout`` s, then it is stopped) and its output read in one `ray
    job logs` call: no log stream over a websocket to lose on a loaded machine. Two refusals of the submission are
    about the head's connection to its job agent, not the job, and are retried for ``wait_s`` s: "No available
    agent" (the head answers before its agent has registered; no job is created) and "Server disconnected" (the
    head reused a keep-alive connection the agent had just closed; the job may have been created all the same, so
    the id is looked up first). A head of these tests (:class:`LocalCluster`) that went away meanwhile (its
    dashboard refuses or drops the connection, or stops answering while the job runs) is started again on its ports
    once, the job submitted again, and the old head's logs printed. With --no-wait in ``options`` it returns once the
    job exists."""
    options = list(options)
    follow = "--no-wait" not in options
    if "--submission-id" in options:
        sid = options[options.index("--submission-id") + 1]
    else:
        sid = f"rayseq-test-{uuid.uuid4().hex[:12]}"
        options += ["--submission-id", sid]
    if follow:
        options.append("--no-wait")

    def ray_job(*args: str, limit: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([RAY, "job", *args], env=env, capture_output=True, text=True, timeout=limit, cwd=cwd)

    restarts = 1  # a head that went away is started again once per submission
    while True:
        deadline = time.monotonic() + wait_s
        while True:
            r = ray_job("submit", "--address", address, "--working-dir", str(working_dir), *options, "--", *cmd)
            if r.returncode == 0:
                break
            out = r.stdout + r.stderr
            if restarts and _restart_if_gone(address, out):
                restarts -= 1
                continue
            if "No available agent" not in out and "Server disconnected" not in out or time.monotonic() > deadline:
                return r
            while (status := job_status(address, env, sid)) == "?" and time.monotonic() < deadline:
                time.sleep(2)
            if status not in ("NONE", "?"):  # created all the same
                break
            time.sleep(2)
        if not follow:
            return r
        end, unanswered, again = time.monotonic() + timeout, 0, False
        while (status := job_status(address, env, sid)) in ("RUNNING", "PENDING", "?"):
            unanswered = unanswered + 1 if status == "?" else 0
            if unanswered >= 5 and restarts and _restart_if_gone(address, "no answer to `ray job status`"):
                restarts, again = restarts - 1, True  # the job went with the head: submitted again to the new one
                break
            if time.monotonic() > end:
                ray_job("stop", "--address", address, sid, limit=120)
                status = f"still {status} after {timeout:.0f} s, stopped"
                break
            time.sleep(2)
        if not again:
            break
    logs = ray_job("logs", "--address", address, sid, limit=120)
    out = f"{r.stdout}{logs.stdout}\nJob '{sid}' {status.lower()}\n"
    return subprocess.CompletedProcess(r.args, 0 if status == "SUCCEEDED" else 1, out, r.stderr + logs.stderr)
