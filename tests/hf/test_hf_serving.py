"""Serving a model.arch=hf checkpoint: ChatModel decodes with the model's tokenizer (replies equal the policy's own
decoding, pieces concatenate to the reply, log-probs are the policy's), and ``python -m rayseq.serve --checkpoint
RUN`` answers over HTTP: /v1/chat, the OpenAI-compatible endpoint with streaming, and concurrent requests batched."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from rayseq.distributed.driver import Trainer
from rayseq.serving.model import ChatModel, GenRequest
from tests.hf.test_hf_training import hf_config
from tests.serving_helpers import serve_cli

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["hi there", "do you like music or movies ?", "hey , how are you ?"]


@pytest.fixture(scope="module")
def run_dir(corpus, hf_dir, tmp_path_factory) -> Path:
    """A GRPO run on the tiny GPT-2 (MLE first, so that replies are words of the corpus)."""
    out = tmp_path_factory.mktemp("hf_serve") / "run"
    Trainer(hf_config(corpus, hf_dir, "algo.name=grpo", "train.pretrain_iters=30", "train.pretrain_lr=1e-2",
                      "train.iters=2", run_dir=out)).run()
    return out


@pytest.fixture(scope="module")
def model(run_dir) -> ChatModel:
    return ChatModel(run_dir)


# the policy's own decoding: serving's chat defaults against repetition (the task's ``decoding``) off
PLAIN = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
         "top_p": 1.0}


def test_replies_are_the_policy_decoding(model):
    vocab, policy = model.vocab, model.generator
    results = model.generate([GenRequest(p, max_tokens=8, logprobs=2, **PLAIN) for p in PROMPTS])
    for p, res in zip(PROMPTS, results):
        ids = torch.from_numpy(vocab.encode_text(p, model.max_src_len)).unsqueeze(0)
        tokens = policy.greedy(ids, torch.tensor([ids.shape[1]]), 8)
        assert res.replies[0] == vocab.decode_text(tokens[0].tolist())
        assert "".join(res.pieces[0]) == res.replies[0] and res.unknown_words == []
        assert res.prompt_tokens == ids.shape[1]
        lp = policy.logprobs(ids, torch.tensor([ids.shape[1]]), tokens).logp[0]
        entries = res.logprobs[0]
        assert [e["logprob"] for e in entries] == pytest.approx(lp[: len(entries)].tolist(), abs=1e-4)
        assert all(e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-6 for e in entries)
    assert model.info["vocab_size"] == 400 and model.model_id.startswith("rayseq-pairs-grpo")
    # seeded sampling: reproducible and independent of the batch
    one = model.generate([GenRequest(PROMPTS[0], temperature=1.0, seed=3, max_tokens=8)])[0].replies
    two = model.generate([GenRequest(PROMPTS[1], temperature=1.0, seed=9, max_tokens=8),
                          GenRequest(PROMPTS[0], temperature=1.0, seed=3, max_tokens=8)])[1].replies
    assert one == two


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYSEQ_CHECKPOINT", "RAYSEQ_API_KEY")}


@pytest.mark.ray
def test_served_over_http(run_dir, model, tmp_path):
    openai = pytest.importorskip("openai")
    with serve_cli(run_dir, tmp_path / "serve.log", "--batch-wait-timeout-s", "0.05", env=_env()) as (url, proc):
        want = [r.replies[0] for r in model.generate([GenRequest(p, max_tokens=8) for p in PROMPTS])]
        with ThreadPoolExecutor(len(PROMPTS)) as pool:  # concurrent: decoded in shared batches
            answers = list(pool.map(lambda p: httpx.post(f"{url}/v1/chat", json={"message": p, "max_tokens": 8},
                                                         timeout=60), PROMPTS))
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
        got = [a.json()["reply"] for a in answers]
        assert got == want
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
        kw = {"model": model.model_id, "messages": [{"role": "user", "content": PROMPTS[1]}], "n": 2,
              "max_tokens": 8, "temperature": 1.0, "seed": 5}
        full = client.chat.completions.create(**kw)
        texts = ["", ""]
        for chunk in client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
        assert texts == [c.message.content for c in full.choices]
        assert texts == model.generate([GenRequest(PROMPTS[1], temperature=1.0, seed=5, n=2, max_tokens=8)])[0].replies
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, (tmp_path / "serve.log").read_text()[-3000:]
