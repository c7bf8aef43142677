"""A reward model served at POST /get_reward (OpenRLHF's shape) against a real Ray Serve on loopback, the remote
reward that reads it, a remote-reward RL run over HTTP end to end, and the LLM judge through the openai client
against rayseq's own served chat model.

One tiny HF reward model (~5 s) and one counting checkpoint (~5 s) are trained in the module; Serve deploys them
side by side at ``/rm`` and ``/judge`` (and the RM again, unbatched, at ``/rm1``)."""

from __future__ import annotations

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from rayseq.config import build_config
from rayseq.distributed.driver import Trainer
from rayseq.rewards.remote import judge_score, llm_judge, remote_reward
from rayseq.rewards.trained import load_scorer
from tests.reward_fixtures_prefs import preference_rows, words, write_jsonl
from tests.serving_helpers import start_serve, train_counting_checkpoint

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory, hf_dir):
    from tests.hf_fixtures import make_tiny_hf

    d = tmp_path_factory.mktemp("rm")
    model = make_tiny_hf(d / "tiny", extra_lines=words() * 5)
    data = write_jsonl(d / "prefs.jsonl", preference_rows(200))
    Trainer(build_config(None, [
        "task.name=preferences", f"task.data={data}", "algo.name=reward_model", "train.pretrain_iters=0",
        "rollout.num_workers=0", "progress=false", "train.batch_size=16", "algo.lr=0.001", "train.iters=30",
        "train.eval_every=30", "model.arch=hf", f"model.path={model}", f"run_dir={d / 'run'}"])).run()
    return d / "run"


@pytest.fixture(scope="module")
def base_url(ray_session, rm_run, tmp_path_factory):
    from ray import serve

    counting = train_counting_checkpoint(tmp_path_factory.mktemp("judge") / "run")
    url = start_serve({"/rm": {"checkpoint": str(rm_run)}, "/rm1": {"checkpoint": str(rm_run), "batching": False},
                       "/judge": {"checkpoint": str(counting)}})
    yield url
    serve.shutdown()


def test_get_reward_answers_as_the_model(base_url, rm_run):
    rows = preference_rows(8, seed=5)
    queries = [r["prompt"] + r["chosen"] for r in rows] + [r["prompt"] + r["rejected"] for r in rows]
    prompts = [r["prompt"] for r in rows] * 2
    want = load_scorer(rm_run).score(queries, prompts)
    for route in ("/rm", "/rm1"):
        r = httpx.post(f"{base_url}{route}/get_reward", json={"query": queries, "prompts": prompts}, timeout=60)
        assert r.status_code == 200, r.text
        got = r.json()["rewards"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        assert np.mean(np.array(got[:8]) > np.array(got[8:])) >= 0.75  # chosen above rejected
    # without prompts (OpenRLHF's plain request) the causal LM reads the same ids
    r = httpx.post(f"{base_url}/rm/get_reward", json={"query": queries[:2]}, timeout=60)
    assert r.status_code == 200 and len(r.json()["rewards"]) == 2
    assert remote_reward([r["prompt"] for r in rows], [r["chosen"] for r in rows], [[]] * 8,
                         url=f"{base_url}/rm/get_reward") == pytest.approx(want[:8], rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("body, status, match", [
    ({"query": "just text"}, 422, "query"),
    ({"query": []}, 422, "query"),
    ({"query": [1, 2]}, 422, "query.0"),
    ({"query": ["a"], "prompts": ["a", "b"]}, 422, "prompts: 2 items for 1"),
    ({"query": ["a"], "temperature": 1}, 422, "unknown field"),
    ({"query": [""]}, 422, "no tokens"),
    ({"query": ["x" * 20000]}, 422, "longer than"),
])
def test_bad_requests_get_a_json_error(base_url, body, status, match):
    r = httpx.post(f"{base_url}/rm/get_reward", json=body, timeout=30)
    assert r.status_code == status and match in r.json()["error"]["message"], r.text
    assert httpx.post(f"{base_url}/rm/get_reward", json={"query": ["how was it"]}, timeout=30).status_code == 200


def test_routes_that_do_not_fit_the_model(base_url):
    r = httpx.post(f"{base_url}/rm/get_reward", content=b"query", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    r = httpx.post(f"{base_url}/rm/v1/chat", json={"message": "hi"})
    assert r.status_code == 404 and "/get_reward" in r.json()["error"]["message"]
    r = httpx.post(f"{base_url}/judge/get_reward", json={"query": ["1 2"]})
    assert r.status_code == 404 and "chat model" in r.json()["error"]["message"]
    assert httpx.get(f"{base_url}/rm/healthz").json()["task"] == "preferences"


def test_remote_reward_errors(base_url):
    with pytest.raises(ValueError, match="answered 404"):
        remote_reward(["p"], ["r"], [[]], url=f"{base_url}/judge/get_reward", retries=0)
    with pytest.raises(ValueError, match="unreachable after 1 tries"):
        remote_reward(["p"], ["r"], [[]], url="http://127.0.0.1:9/get_reward", retries=0, timeout_s=2)


@pytest.mark.e2e
def test_remote_reward_run_over_http(base_url, corpus, hf_dir, tmp_path):
    """GRPO on a tiny HF policy whose only reward is the served reward model, over HTTP, through the train path."""
    cfg = build_config(None, [
        "task.name=pairs", f"task.data={corpus}", "task.test_size=100", "task.val_size=10", "model.arch=hf",
        f"model.path={hf_dir}", "algo.name=grpo", "algo.group_size=4", "train.pretrain_iters=0", "train.iters=2",
        "train.batch_size=8", "train.eval_every=2", "rollout.num_workers=0", "progress=false",
        "reward.fn=remote_reward", f"reward.kwargs={{url: '{base_url}/rm/get_reward'}}", f"run_dir={tmp_path}"])
    summary = Trainer(cfg).run()
    assert np.isfinite(summary["metrics"]["val/reward"])
    logged = pq.read_table(tmp_path / "metrics.parquet").to_pydict()
    rewards = [x for x in logged["rollout/reward_mean"] if x is not None]
    assert len(rewards) == 2 and all(np.isfinite(rewards)) and rewards[0] != 0.0  # the served model's scores


def test_llm_judge_through_the_openai_client(base_url):
    """rayseq's served counting model as the judge: it answers digits, the first of which is the score."""
    pytest.importorskip("openai")
    replies = ["3 1 2", "9 9", "1"]
    scores = llm_judge(["", "", ""], replies, [[], [], []], base_url=f"{base_url}/judge/v1", model="rayseq",
                       template="{reply}", max_score=9, normalize=False)
    assert len(scores) == 3 and all(s is not None and 0 <= s <= 9 and s == int(s) for s in scores)


def test_judge_score_parsing():
    assert judge_score("Score: 7/10", 0, 10, True) == pytest.approx(0.7)
    assert judge_score("12", 0, 10, False) == 10 and judge_score("-3.5", 0, 10, False) == 0
    assert judge_score("no idea", 0, 10, True) is None
    from rayseq import registry

    with pytest.raises(ValueError, match=r"\{reply\}"):
        registry.reward_function("llm_judge", {"base_url": "http://x", "model": "m", "template": "rate it"})
    with pytest.raises(ValueError, match="only"):
        registry.reward_function("llm_judge", {"base_url": "http://x", "model": "m", "template": "{reply} {x}"})
    with pytest.raises(ValueError, match="url must be"):
        registry.reward_function("remote_reward", {"url": "localhost:8000"})
