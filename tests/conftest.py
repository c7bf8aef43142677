"""Shared fixtures: tiny configs and one Ray runtime per test session (started only if a test needs it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from rayseq.config import build_config

TINY = [
    "model.emb_dim=16",
    "model.hidden_dim=32",
    "task.test_size=200",
    "train.pretrain_iters=20",
    "train.pretrain_batch_size=32",
    "train.iters=6",
    "train.batch_size=32",
    "train.eval_every=3",
    "progress=false",
]


def tiny_config(*overrides: str, run_dir=None):
    extra = [f"run_dir={run_dir}"] if run_dir is not None else []
    return build_config(None, TINY + extra + list(overrides))


@pytest.fixture(scope="session")
def _job_head():
    """The local head of :func:`ray_head`, started once per test process and torn down by signalling its own process
    groups (`ray stop` would stop every Ray on the machine)."""
    from tests.deploy.local_cluster import RAY, LocalCluster

    if not Path(RAY).exists():
        pytest.skip(f"ray CLI not found next to {RAY}")
    cluster = LocalCluster(num_cpus=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture
def ray_head(_job_head):
    """A token-authenticated local head (tests/deploy/local_cluster.py: GCS, dashboard and job agent on free ports)
    for the `ray job submit` tests of tests/deploy and tests/hf, their jobs one at a time. A head that went away
    since the last test (its dashboard or job agent, on a loaded machine) is started again on its ports, its logs
    printed. Yields (address, env)."""
    _job_head.restart_if_gone("found before the test")
    yield _job_head.address, _job_head.env


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray with 4 logical CPUs, shared by the Ray tests (starting Ray costs seconds)."""
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


GREETINGS = ["hi there", "hello !", "hey , how are you ?"]
TOPICS = ["music", "movies", "books", "games", "food", "sports", "travel", "pets"]
REPLIES = ["i am fine , thanks", "good , and you ?", "not bad at all", "great to see you", "fine fine"]


def write_corpus(path: Path, n_conv: int = 60) -> Path:
    """JSONL pairs; each conversation asks a greeting and gets one of several replies (one-to-many)."""
    rng = np.random.default_rng(0)
    rows = []
    for c in range(n_conv):
        for _ in range(3):
            rows.append({"input": GREETINGS[rng.integers(3)], "reply": REPLIES[rng.integers(5)], "conv_id": f"c{c}"})
        # and one question no other conversation asks (c < 64): held out, the greetings are dropped (they
        # are training inputs) and this is what valid and test keep
        rows.append({"input": f"do you like {TOPICS[c % 8]} or {TOPICS[c // 8 % 8]} ?", "reply": REPLIES[c % 5],
                     "conv_id": f"c{c}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A tiny chit-chat corpus prepared once (read-only for the tests that use it)."""
    from rayseq.data.preparation import PrepareOptions, prepare

    d = tmp_path_factory.mktemp("cc")
    out = d / "prepared"
    prepare(f"jsonl:{write_corpus(d / 'pairs.jsonl')}", out,
            PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.2, seed=0))
    return out


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory):
    """A tiny local GPT-2 and its tokenizer (tests/hf_fixtures.py); needs the hf extra."""
    pytest.importorskip("transformers", reason="the hf extra: pip install -e .[hf]")
    from tests.hf_fixtures import make_tiny_hf

    # the test corpus's words too, so that its prompts and replies are a few tokens each
    return make_tiny_hf(tmp_path_factory.mktemp("hf") / "tiny-gpt2",
                        extra_lines=tuple(GREETINGS + REPLIES + TOPICS) * 5)


@pytest.fixture(scope="session")
def classifier_dir(hf_dir, tmp_path_factory):
    from tests.hf_fixtures import make_tiny_classifier

    return make_tiny_classifier(tmp_path_factory.mktemp("hf") / "tiny-classifier", hf_dir)


def signal_when_ready(proc, sig, ready, timeout_s: float = 240, what: str = "ready") -> tuple[dict[int, str], str]:
    """Wait for ``ready()`` while ``proc`` runs, note its descendants ({pid: name}: Ray's processes, for a command that
    starts Ray), send ``sig``; (those descendants, its stderr). Kills it if it does not end."""
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    try:
        while not ready():
            if proc.poll() is not None:
                pytest.fail(f"exited {proc.returncode} before {what}:\n{proc.stderr.read()[-4000:]}")
            assert time.monotonic() < deadline, f"not {what} in time"
            time.sleep(0.02)
        before = {c.pid: c.name() for c in psutil.Process(proc.pid).children(recursive=True)}
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return before, err
