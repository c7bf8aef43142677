"""serve/chatbot.yaml as README documents it: ``RAYSEQ_CHECKPOINT=runs/<run> serve run serve/chatbot.yaml``
with Ray's own CLI and a real checkpoint (a copy of the file differing only in its port, so that the test
does not need port 8000), and ``python -m rayseq.serve --config serve/chatbot.yaml``, which stops at once
with one readable line when no checkpoint is given."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from rayseq.serving.model import ChatModel, GenRequest
from tests.ports import free_port
from tests.serving_helpers import train_counting_checkpoint, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "serve" / "chatbot.yaml"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYSEQ_CHECKPOINT", "RAYSEQ_API_KEY")}
    return {**env, **extra}  # no RAY_ADDRESS: the command starts its own Ray, never this session's


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A directory holding a trained run ``run/`` (~5 s), from which commands are started."""
    d = tmp_path_factory.mktemp("serve_run")
    train_counting_checkpoint(d / "run")
    return d


@pytest.mark.ray
def test_serve_run_with_the_config_file_and_a_real_checkpoint(workdir):
    port = free_port()
    cfg = yaml.safe_load(CONFIG.read_text())
    assert cfg["applications"][0]["args"]["checkpoint"] == ""  # from $RAYSEQ_CHECKPOINT, as the header says
    cfg["http_options"]["port"] = port
    config = workdir / "chatbot.yaml"
    config.write_text(yaml.safe_dump(cfg))
    serve_exe = Path(sys.executable).with_name("serve")
    log = workdir / "serve_run.log"
    with open(log, "w") as out:  # RAYSEQ_CHECKPOINT relative to where the command runs, as in README
        proc = subprocess.Popen([str(serve_exe), "run", str(config)], cwd=workdir, env=_env(RAYSEQ_CHECKPOINT="run"),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            wait_healthy(f"http://127.0.0.1:{port}/healthz", timeout_s=150, proc=proc)
        except (RuntimeError, TimeoutError) as exc:
            pytest.fail(f"{exc}\n{log.read_text()[-3000:]}")
        model = ChatModel(workdir / "run")
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json()
        assert health["model"] == model.model_id and health["batching"] is True
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat", json={"message": "9 2 3"}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["reply"] == model.generate([GenRequest("9 2 3", max_tokens=model.max_tgt_len)])[0].replies[0]
        proc.send_signal(signal.SIGINT)  # Ctrl-C: serve run shuts Serve down and exits
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.mark.e2e
def test_config_file_without_a_checkpoint_stops_at_once_with_one_line(tmp_path):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "rayseq.serve", "--config", "serve/chatbot.yaml"], cwd=ROOT,
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no checkpoint:"), r.stderr
    assert "RAYSEQ_CHECKPOINT" in lines[0] and "serve/chatbot.yaml" in lines[0]
    assert time.monotonic() - t0 < 30  # before Ray starts

    r = subprocess.run([sys.executable, "-m", "rayseq.serve", "--config", "serve/chatbot.yaml"], cwd=ROOT,
                       env=_env(RAYSEQ_CHECKPOINT=str(tmp_path / "no_run")), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(tmp_path / "no_run") in r.stderr and "Traceback" not in r.stderr


def test_config_file_args_and_port_with_command_line_overrides(workdir, monkeypatch):
    """``--config``: the application's args and HTTP options come from the file, flags win; Serve itself
    is stubbed (no Ray), the deployment stops at serve.run."""
    import ray
    from ray import serve

    from rayseq import serve as cli

    seen = {}

    def fake_run(app, name, route_prefix):
        seen["run"] = (app, name, route_prefix)
        raise KeyboardInterrupt

    monkeypatch.delenv("RAYSEQ_CHECKPOINT", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(serve, "start", lambda http_options, **kw: seen.setdefault("http", http_options))
    monkeypatch.setattr(serve, "run", fake_run)
    monkeypatch.setattr(serve, "shutdown", lambda: None)
    args, http, name, prefix = cli.read_serve_config(str(CONFIG))
    assert (http, name, prefix) == ({"host": "127.0.0.1", "port": 8000}, "rayseq-chat", "/")
    assert args["max_ongoing_requests"] == 64
    assert cli.main(["--config", str(CONFIG), "--checkpoint", str(workdir / "run"), "--port", "8123",
                     "--no-batching"]) == 0
    assert seen["http"] == {"host": "127.0.0.1", "port": 8123} and seen["run"][1:] == ("rayseq-chat", "/")
    bound = seen["run"][0]._bound_deployment.init_kwargs  # what the replica is built with
    assert bound["batching"] is False and bound["max_batch_size"] == 32  # the flag, then the file
    assert bound["checkpoint"].startswith(str(workdir / "run"))
