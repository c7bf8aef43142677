"""Shared by the serving tests: a tiny trained checkpoint, a free port, and Serve on loopback.

Serve's HTTP port is cluster-scoped, so each serving test module starts Serve once on its own port,
deploys its applications with :func:`deploy`, and calls ``serve.shutdown()`` when it is done so that
the other Ray test modules sharing the session's Ray see no Serve at all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from rayseq.distributed.driver import Trainer
from tests.conftest import tiny_config
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]


def train_counting_checkpoint(run_dir: Path) -> Path:
    """MLE only, 150 iterations at lr 1e-2 (~5 s on 2 cores): enough for replies made of digits."""
    cfg = tiny_config("rollout.num_workers=0", "train.pretrain_iters=150", "train.iters=0",
                      "train.pretrain_lr=1e-2", run_dir=run_dir)
    Trainer(cfg).run()
    return run_dir


def train_chat_checkpoint(run_dir: Path) -> Path:
    """A tiny chatbot on a BPE vocabulary (the conftest corpus prepared with --tokenizer bpe), 40 MLE iterations:
    replies of real pieces, with the chat decoding defaults in its task spec."""
    from rayseq.config import build_config
    from rayseq.data.preparation import PrepareOptions, prepare
    from tests.conftest import write_corpus

    data = run_dir.parent / "bpe-data"
    prepare(f"jsonl:{write_corpus(run_dir.parent / 'pairs.jsonl')}", data,
            PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.2, tokenizer="bpe", vocab_size=60))
    Trainer(build_config(None, [
        "task.name=chitchat", f"task.data={data}", "task.test_size=100", "model.emb_dim=16", "model.hidden_dim=32",
        "train.pretrain_iters=40", "train.pretrain_batch_size=32", "train.pretrain_lr=1e-2", "train.iters=0",
        "algo.name=reinforce", "rollout.num_workers=0", "progress=false", f"run_dir={run_dir}"])).run()
    return run_dir


def start_serve(apps: dict[str, dict], attempts: int = 3) -> str:
    """``serve.start`` on 127.0.0.1 at a free port and deploy ``{route_prefix: build_app args}`` side by side
    (``run_many`` starts the replicas in parallel). Returns the base URL. A port is free when it is picked, not
    necessarily when the proxy binds it seconds later (another process on the machine may take it first): a proxy
    that fails to bind is shut down with Serve and started again on another port."""
    from ray import serve
    from ray.serve.api import RunTarget

    from rayseq.serving.app import build_app

    for attempt in range(attempts):
        port = free_port()
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            break
        except Exception as exc:  # the proxy's RayTaskError(RuntimeError) "Failed to bind to address ..."
            if "Failed to bind" not in str(exc) or attempt == attempts - 1:
                raise
            serve.shutdown()
    serve.run_many([
        RunTarget(build_app(args), name=f"chat{i}", route_prefix=prefix)
        for i, (prefix, args) in enumerate(apps.items())
    ])
    url = f"http://127.0.0.1:{port}"
    for prefix in apps:  # run_many returns when the apps are RUNNING; the proxy may route a moment later
        wait_healthy(f"{url}{prefix.rstrip('/')}/healthz", timeout_s=60)
    return url


def wait_healthy(url: str, timeout_s: float, proc=None) -> None:
    """Poll ``url`` until it answers 200; fail early if ``proc`` (a Popen) has exited."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before {url} answered")
        try:
            r = httpx.get(url, timeout=5)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s} s (last: {last})")


def wait_for_text(path: Path, text: str, timeout_s: float, proc=None) -> None:
    """Poll the file ``path`` (a subprocess's log) until it contains ``text``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before printing {text!r}")
        time.sleep(0.2)
    raise TimeoutError(f"{path} did not show {text!r} within {timeout_s} s")


@contextmanager
def serve_cli(checkpoint, log: Path, *args: str, env: dict, timeout_s: float = 150, attempts: int = 3):
    """``python -m rayseq.serve --checkpoint CHECKPOINT --port P ARGS`` in its own process group, its output in
    ``log``; yields (base URL, process) once /healthz answers and the banner is printed (a test that fails before
    shows the log). A port is free when it is picked, not necessarily when the server binds it seconds later: a
    server that exits with "Failed to bind to address" is started again on another port. The group is SIGKILLed
    if the process still runs at the end."""
    import pytest

    def stop(proc) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    for attempt in range(attempts):
        port = free_port()
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "rayseq.serve", "--checkpoint", str(checkpoint), "--port",
                                     str(port), *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(f"{url}/healthz", timeout_s=timeout_s, proc=proc)
            wait_for_text(log, f"at {url}/", timeout_s=30, proc=proc)
            break
        except (RuntimeError, TimeoutError) as exc:
            text = log.read_text()
            stop(proc)
            if "Failed to bind to address" in text and attempt < attempts - 1:
                continue
            pytest.fail(f"{exc}\n{text[-3000:]}")
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            stop(proc)
