"""The HTTP chat endpoint against a real Ray Serve on loopback.

One tiny counting checkpoint is trained in the module (~5 s), Serve is started once on a free port and
three applications of it are deployed side by side: ``/`` (batched, open), ``/secure`` (API key) and
``/unbatched`` (``batching=false``). Replies are checked against the model decoded in-process; every
class of bad input gets a 4xx with a JSON error and no stack trace, and the server keeps answering.
``python -m rayseq.serve`` is driven as a subprocess with its own embedded Ray.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from rayseq.serving.model import ChatModel, GenRequest
from rayseq.serving.schemas import MAX_BODY_BYTES, MAX_HISTORY_TURNS, MAX_MESSAGE_CHARS, MAX_TOKENS
from tests.ports import free_port
from tests.serving_helpers import (
    start_serve,
    train_chat_checkpoint,
    train_counting_checkpoint,
    wait_for_text,
    wait_healthy,
)

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
KEY = "s3cret-key"
DIGITS = set("0123456789")
GOOD = {"message": "9 2 3"}


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return str(train_counting_checkpoint(tmp_path_factory.mktemp("serving") / "run"))


@pytest.fixture(scope="module")
def model(checkpoint) -> ChatModel:
    """The same checkpoint decoded in this process: the reference for the server's replies."""
    return ChatModel(checkpoint)


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory) -> str:
    return str(train_chat_checkpoint(tmp_path_factory.mktemp("chat") / "run"))


@pytest.fixture(scope="module")
def base_url(ray_session, checkpoint, chat_checkpoint, cli_server):
    from ray import serve

    # cli_server: the CLI's own Ray starts up while this one deploys (saves ~10 s of the module's wall time).
    # A 50 ms batch window (5 ms by default) so that concurrent test requests share batches.
    url = start_serve({
        "/": {"checkpoint": checkpoint, "batch_wait_timeout_s": 0.05},
        "/secure": {"checkpoint": checkpoint, "api_key": KEY},
        "/unbatched": {"checkpoint": checkpoint, "batching": False},
        "/chat": {"checkpoint": chat_checkpoint},
    })
    yield url
    serve.shutdown()  # Serve is cluster-scoped: leave the session's Ray as the other modules expect it


@pytest.fixture(scope="module")
def client(base_url):
    with httpx.Client(base_url=base_url, timeout=30) as c:
        yield c


def chat(client, path="/v1/chat", **body) -> dict:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def words_of(reply: str) -> list[str]:
    return reply.split() if reply else []


# ---------------------------------------------------------------------------------------------- routes


def test_health_docs_page_and_models(client, model):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "model": model.model_id, "batching": True, "task": "counting",
                        "about": model.info["about"], "decoding": model.info["decoding"]}
    # counting's replies repeat digits by design: no repetition defaults
    assert model.info["decoding"] == {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "presence_penalty": 0.0,
                                      "frequency_penalty": 0.0, "top_p": 1.0}
    # named by what produced it: 150 MLE iterations (train.iters=0), not the configured RL algorithm
    assert model.model_id == "rayseq-counting-mle-it150"

    r = client.get("/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    assert {"/v1/chat", "/v1/chat/completions", "/v1/models", "/healthz"} <= set(paths)
    assert "ChatRequest" in json.dumps(r.json()["components"])
    r = client.get("/docs")
    assert r.status_code == 200 and "swagger" in r.text.lower()

    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "<title>rayseq chat</title>" in r.text and 'id="message"' in r.text and 'id="about"' in r.text

    r = client.get("/v1/models")
    assert r.status_code == 200
    data = r.json()["data"]
    assert [m["id"] for m in data] == [model.model_id]
    assert data[0]["details"]["task"] == "counting" and data[0]["details"]["vocab_size"] == len(model.vocab)


# ---------------------------------------------------------------------------------------------- /v1/chat


def test_chat_reply_is_digits_with_consistent_usage(client, model):
    j = chat(client, message="9 2 3", max_tokens=4)
    assert j["model"] == model.model_id and j["replies"] is None and j["unknown_words"] == []
    words = words_of(j["reply"])
    assert set(words) <= DIGITS, j["reply"]
    u = j["usage"]
    assert u["prompt_tokens"] == 3  # counting tokenises characters: 9, 2, 3
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    # completion_tokens counts the end token too when the reply stopped before the cap
    assert len(words) <= u["completion_tokens"] <= min(len(words) + 1, 4)

    j = chat(client, message="1 2 3 4 5", num_replies=3, max_tokens=2, temperature=1.0, seed=5)
    assert len(j["replies"]) == 3 and j["reply"] == j["replies"][0]
    assert all(len(words_of(r)) <= 2 for r in j["replies"])
    u = j["usage"]
    assert u["prompt_tokens"] == 5 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert sum(map(len, map(words_of, j["replies"]))) <= u["completion_tokens"] <= 3 * 2


def test_message_longer_than_the_model_input_is_refused_not_cut(client, model):
    r = client.post("/v1/chat", json={"message": "1" * MAX_MESSAGE_CHARS})  # the longest accepted message
    assert r.status_code == 422  # counting reads at most max_src_len digits: no silent cut to the last ones
    assert r.json()["error"]["message"].startswith(f"input of {MAX_MESSAGE_CHARS} tokens: the counting task reads 1 "
                                                   f"to {model.max_src_len} of 0 1 2")


def test_seeded_sampling_is_reproducible_and_reply_i_uses_seed_plus_i(client):
    body = {"message": "3 1 4 1 5", "temperature": 1.0, "seed": 1234, "num_replies": 3}
    first, second = chat(client, **body), chat(client, **body)
    assert first["replies"] == second["replies"]
    for i in range(3):  # GenRequest.seed: "reply i uses seed + i"
        assert chat(client, message="3 1 4 1 5", temperature=1.0, seed=1234 + i)["reply"] == first["replies"][i]
    samples = {chat(client, message="3 1 4 1 5", temperature=1.0, seed=s)["reply"] for s in range(8)}
    assert len(samples) > 1, "the seed has no effect on sampling"


def test_seeded_reply_does_not_depend_on_the_rest_of_the_batch(client, base_url):
    """16 concurrent requests (other messages, other seeds, greedy and sampled, n > 1) decoded in
    shared batches: the seeded one equals its answer when sent alone."""
    target = {"message": "7 7 1 0", "temperature": 1.0, "seed": 99, "num_replies": 2}
    alone = chat(client, **target)["replies"]

    others = [{"message": " ".join(str((i * 7 + j) % 10) for j in range(1 + i % 9)), "temperature": (i % 3) * 0.5,
               "seed": 1000 + i, "top_k": i % 4, "num_replies": 1 + i % 2} for i in range(15)]

    async def fire():
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as ac:
            bodies = others[:7] + [target] + others[7:]
            return await asyncio.gather(*(ac.post("/v1/chat", json=b) for b in bodies))

    responses = asyncio.run(fire())
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    assert responses[7].json()["replies"] == alone


def test_seeded_reply_does_not_depend_on_the_batch_in_process(model):
    """The same property without HTTP timing: one generate() call holding the request and 7 others."""
    target = GenRequest("7 7 1 0", temperature=1.0, max_tokens=5, n=2, seed=99)
    alone = model.generate([target])[0].replies
    others = [GenRequest("1 2 3 4 5 6 7"[: 1 + 2 * i], temperature=0.7, top_k=i, n=1 + i % 3, seed=i)
              for i in range(7)]
    batched = model.generate(others[:3] + [target] + others[3:])
    assert batched[3].replies == alone


def test_greedy_reply_equals_in_process_decoding(client, model):
    messages = ["9 2 3", "0", "5 5 5 5 5", "1 2 3 4 5 6 7 8 9", "4 0 4"]
    expected = [r.replies[0] for r in model.generate([GenRequest(m, max_tokens=model.max_tgt_len) for m in messages])]
    served = [chat(client, message=m)["reply"] for m in messages]  # temperature defaults to 0
    assert served == expected

    # ... and the generator's own greedy decode (Seq2SeqGRU.greedy, as used in evaluation)
    gen = model.generator
    for m, reply in zip(messages, served):
        ids, _, _ = model.encode(m)
        tokens = gen.greedy(torch.tensor([ids]), torch.tensor([len(ids)]), model.max_tgt_len)[0]
        assert " ".join(model.vocab.decode(tokens.tolist())) == reply, m
        assert set(words_of(reply)) <= DIGITS


def test_input_outside_the_counting_language_is_refused_naming_the_words(client, model):
    """Counting reads 1 to 10 digits: "hello there" used to get a 200 ("0 4 9"), 12 digits were cut to their last 10
    silently. Both are a 422 naming what is wrong, in one line; the model is never asked."""
    for message, named in [("hello there", "input outside the counting task's language: 'h', 'e', 'l', 'o', 't', "
                                           "'r' (it reads 1 to 10 of 0 1 2 3 4 5 6 7 8 9)"),
                           ("9 x 2 Ω 3", "input outside the counting task's language: 'x', 'ω' (it reads"),
                           ("1 2 3 4 5 6 7 8 9 0 1 2", "input of 12 tokens: the counting task reads 1 to 10 of 0 1 2"),
                           ("?!", "input outside the counting task's language: '?', '!' (it reads 1 to 10")]:
        for path, body in (("/v1/chat", {"message": message}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": message}]})):
            r = client.post(path, json=body)
            assert r.status_code == 422, (path, message, r.text)
            err = r.json()["error"]
            assert err["message"].startswith(named) and "\n" not in err["message"], err
    j = chat(client, message="1 2 3 4 5 6 7 8 9 0")  # the longest input it reads: answered, nothing left out
    assert j["unknown_words"] == [] and j["truncated_words"] == 0 and j["usage"]["prompt_tokens"] == 10


def test_an_open_task_reports_unknown_and_truncated_words(tmp_path, corpus):
    """A chat model reads any text: unknown words are reported, and words left out at the start are counted."""
    from rayseq.distributed.driver import Trainer
    from tests.tasks.test_chitchat import tiny

    run = Trainer(tiny(corpus, "rollout.num_workers=0", "train.pretrain_iters=2", "train.iters=0",
                       f"run_dir={tmp_path / 'chat'}")).run()
    chat_model = ChatModel(run["run_dir"])
    n = chat_model.max_src_len
    text = "zyzzyva " + " ".join(["music"] * n)
    r = chat_model.generate([GenRequest(text, max_tokens=3)])[0]
    assert r.truncated_words == 1 and r.prompt_tokens == n and r.unknown_words == []
    r = chat_model.generate([GenRequest("hello zyzzyva", max_tokens=3)])[0]
    assert r.truncated_words == 0 and r.unknown_words == ["zyzzyva"]


def test_history_is_accepted_up_to_its_limit(client):
    history = [{"role": "user", "content": "1 2"}, {"role": "assistant", "content": "2"}, "plain text turn"]
    history = (history * MAX_HISTORY_TURNS)[:MAX_HISTORY_TURNS]
    assert chat(client, message="9 2 3", history=history)["reply"] == chat(client, message="9 2 3")["reply"]


def test_unbatched_deployment_answers_the_same(client, model):
    assert client.get("/unbatched/healthz").json()["batching"] is False
    for m in ["9 2 3", "1 1 2"]:
        assert chat(client, "/unbatched/v1/chat", message=m)["reply"] == chat(client, message=m)["reply"]
    sampled = {"message": "3 1 4", "temperature": 1.0, "seed": 7, "num_replies": 2}
    assert chat(client, "/unbatched/v1/chat", **sampled)["replies"] == chat(client, **sampled)["replies"]


# ------------------------------------------------------------------------------- /v1/chat/completions


@pytest.fixture(scope="module")
def openai_client(base_url):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=30)


def test_openai_client_chat_completions(openai_client, model):
    assert [m.id for m in openai_client.models.list()] == [model.model_id]
    msgs = [{"role": "system", "content": "count"}, {"role": "user", "content": "9 2 3"}]
    out = openai_client.chat.completions.create(model=model.model_id, messages=msgs, n=2, max_tokens=3,
                                                temperature=0.7, seed=1)
    assert out.object == "chat.completion" and out.model == model.model_id
    assert [c.index for c in out.choices] == [0, 1]
    for c in out.choices:
        # a counting reply is complete at 3 digits (no end token): the model ended it, "stop"
        assert c.message.role == "assistant" and c.finish_reason == "stop" and c.logprobs is None
        words = words_of(c.message.content)
        assert set(words) <= DIGITS and len(words) <= 3
    # completion tokens = words + one end token per reply the model ended early
    n_words = sum(len(words_of(c.message.content)) for c in out.choices)
    n_early = sum(len(words_of(c.message.content)) < 3 for c in out.choices)
    assert out.usage.completion_tokens == n_words + n_early
    assert out.usage.prompt_tokens == 3
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens

    again = openai_client.chat.completions.create(model=model.model_id, messages=msgs, n=2, max_tokens=3,
                                                  temperature=0.7, seed=1)
    assert [c.message.content for c in again.choices] == [c.message.content for c in out.choices]

    # the same request through /v1/chat gives the same replies (one decoder behind both routes)
    same = model.generate([GenRequest("9 2 3", temperature=0.7, max_tokens=3, n=2, seed=1)])[0]
    assert [c.message.content for c in out.choices] == same.replies

    # only a cap below the reply's length cuts it: "length"
    cut = openai_client.chat.completions.create(model=model.model_id, messages=msgs, max_tokens=2, temperature=0)
    assert cut.choices[0].finish_reason == "length" and len(words_of(cut.choices[0].message.content)) == 2


def test_openai_streaming_concatenates_to_the_full_reply(openai_client, model):
    kw = {"model": model.model_id, "messages": [{"role": "user", "content": "5 0 5 0"}], "n": 2,
          "max_tokens": 6, "temperature": 1.0, "seed": 42}
    full = openai_client.chat.completions.create(**kw)
    texts, finish, n_chunks = ["", ""], [None, None], 0
    for chunk in openai_client.chat.completions.create(stream=True, **kw):
        assert chunk.object == "chat.completion.chunk" and chunk.model == model.model_id
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finish[c.index] = c.finish_reason or finish[c.index]
        n_chunks += 1
    assert texts == [c.message.content for c in full.choices]
    assert finish == [c.finish_reason for c in full.choices]
    assert n_chunks >= 2 * 2  # a role chunk and a finish chunk per choice, at least


def test_openai_stop_strings(openai_client, model):
    greedy = model.generate([GenRequest("9 2 3", max_tokens=3)])[0].replies[0]  # three digits, "a b c"
    msgs = [{"role": "user", "content": "9 2 3"}]
    for stop, text, tokens in ((" " + greedy.split()[1], greedy.split()[0], 2),  # ends before the 2nd digit
                               ([greedy[-1], "x"], greedy[:-1], 3),  # a list; the last digit's own text
                               ("no such text", greedy, 3)):  # never appears: the whole reply
        out = openai_client.chat.completions.create(model="m", messages=msgs, temperature=0, stop=stop)
        assert out.choices[0].message.content == text and out.choices[0].finish_reason == "stop"
        assert out.usage.completion_tokens == tokens  # what was decoded up to the stop string


def test_openai_top_p(openai_client, model):
    msgs = [{"role": "user", "content": "3 1 4 1 5"}]
    greedy = model.generate([GenRequest("3 1 4 1 5", max_tokens=3)])[0].replies[0]
    # a nucleus of 1e-6 holds only the most likely token: sampling at any seed gives the greedy reply ...
    for seed in range(4):
        out = openai_client.chat.completions.create(model="m", messages=msgs, temperature=1.0, top_p=1e-6, seed=seed)
        assert out.choices[0].message.content == greedy
    # ... and the server samples what the model samples in-process with the same top-p
    out = openai_client.chat.completions.create(model="m", messages=msgs, temperature=1.0, top_p=0.7, seed=9, n=3)
    local = model.generate([GenRequest("3 1 4 1 5", temperature=1.0, top_p=0.7, seed=9, n=3, max_tokens=3)])[0]
    assert [c.message.content for c in out.choices] == local.replies


def test_openai_logprobs(openai_client, model):
    msgs = [{"role": "user", "content": "9 2 3"}]
    kw = {"model": "m", "messages": msgs, "temperature": 1.0, "seed": 4, "n": 2, "logprobs": True, "top_logprobs": 3}
    out = openai_client.chat.completions.create(**kw)
    local = model.generate([GenRequest("9 2 3", temperature=1.0, seed=4, n=2, max_tokens=3, logprobs=3)])[0]
    for c, entries in zip(out.choices, local.logprobs):
        content = c.logprobs.content
        assert "".join(t.token for t in content) == c.message.content  # the pieces are the reply
        assert [t.logprob for t in content] == pytest.approx([e["logprob"] for e in entries])
        for t in content:
            assert t.logprob <= 0 and t.bytes == list(t.token.encode()) and len(t.top_logprobs) == 3
            assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    # greedy: each token is the most likely one; logprobs without top_logprobs lists no alternatives
    out = openai_client.chat.completions.create(model="m", messages=msgs, temperature=0, logprobs=True)
    assert all(t.top_logprobs == [] for t in out.choices[0].logprobs.content)
    top1 = openai_client.chat.completions.create(model="m", messages=msgs, temperature=0, logprobs=True,
                                                 top_logprobs=1)
    assert [t.top_logprobs[0].token for t in top1.choices[0].logprobs.content] == \
        [t.token for t in out.choices[0].logprobs.content]

    # streamed: one chunk per token, carrying that token's entry; usage at the end when asked for
    stream = openai_client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    texts, streamed, usage = ["", ""], [[], []], None
    for chunk in stream:
        for ch in chunk.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.logprobs is not None:
                streamed[ch.index] += ch.logprobs.content
        usage = chunk.usage or usage
    full = openai_client.chat.completions.create(**kw)
    assert texts == [c.message.content for c in full.choices]
    assert streamed == [c.logprobs.content for c in full.choices]
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens


def test_openai_no_op_parameters_are_accepted(openai_client, model):
    """OpenAI parameters at the values that change nothing (clients send them by default) are accepted."""
    out = openai_client.chat.completions.create(
        model="any-name", messages=[{"role": "user", "content": "9 2 3"}], temperature=0, top_p=1.0,
        user="someone", presence_penalty=0.0, frequency_penalty=0.0, response_format={"type": "text"},
        max_completion_tokens=20, extra_body={"top_k": 0},
    )
    assert out.choices[0].message.content == model.generate([GenRequest("9 2 3", max_tokens=20)])[0].replies[0]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"presence_penalty": 2.5}, "presence_penalty"),  # OpenAI's range is [-2, 2]
    ({"frequency_penalty": -3.0}, "frequency_penalty"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"extra_body": {"repetition_penalty": 0.9}}, "repetition_penalty"),  # < 1 would favour repeats
    ({"extra_body": {"no_repeat_ngram_size": -1}}, "no_repeat_ngram_size"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
])
def test_openai_parameters_it_cannot_honour_are_refused_by_name(openai_client, kwargs, field):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.UnprocessableEntityError) as info:
        openai_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}], **kwargs)
    err = info.value.body
    assert err["param"] == field and err["message"].startswith(f"{field}: "), err


def test_a_chatbot_decodes_with_chat_defaults_over_http(client, chat_checkpoint):
    """A chat checkpoint (BPE vocabulary) served: its decoding defaults (no 3-gram twice, CTRL penalty 1.2, top-p
    0.9) are in /healthz and the page, apply when a request gives none, and every option of both endpoints is
    honoured: each reply over HTTP is the one ChatModel decodes locally with those settings, and none has <unk>."""
    from rayseq.tasks.pairs import PairsTask

    local = ChatModel(chat_checkpoint)
    health = client.get("/chat/healthz").json()
    assert health["decoding"] == {**local.info["decoding"]} and health["task"] == "chitchat"
    assert {k: health["decoding"][k] for k in PairsTask.decoding} == PairsTask.decoding
    page = client.get("/chat/").text
    assert all(f'id="{k}"' in page for k in ("top_p", "repetition_penalty", "no_repeat_ngram_size"))
    cap = local.max_tgt_len
    for message in ("hi there", "do you like music or books ?", "hey , how are you ?"):
        served = chat(client, "/chat/v1/chat", message=message)["reply"]
        assert served == local.generate([GenRequest(message, max_tokens=cap)])[0].replies[0]
        assert "…" not in served
        off = dict(repetition_penalty=1.0, no_repeat_ngram_size=0)
        assert chat(client, "/chat/v1/chat", message=message, **off)["reply"] == local.generate(
            [GenRequest(message, max_tokens=cap, **off)])[0].replies[0]
        sampled = chat(client, "/chat/v1/chat", message=message, temperature=1.0, top_p=0.5, seed=3, num_replies=3,
                       repetition_penalty=2.0, no_repeat_ngram_size=2, stop=["zzz"])["replies"]
        assert sampled == local.generate([GenRequest(message, temperature=1.0, top_p=0.5, seed=3, n=3, max_tokens=cap,
                                                     repetition_penalty=2.0, no_repeat_ngram_size=2,
                                                     stop=("zzz",))])[0].replies
    # the OpenAI endpoint: OpenAI's penalties, and the two of other servers (an OpenAI client's extra_body)
    kw = dict(temperature=0.9, top_p=0.8, seed=5, n=2, max_tokens=cap, presence_penalty=1.5, frequency_penalty=0.5)
    r = client.post("/chat/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi there"}],
                                                        "no_repeat_ngram_size": 2, **kw})
    assert r.status_code == 200, r.text
    want = local.generate([GenRequest("hi there", temperature=0.9, top_p=0.8, seed=5, n=2, max_tokens=cap,
                                      presence_penalty=1.5, frequency_penalty=0.5, no_repeat_ngram_size=2)])[0]
    assert [c["message"]["content"] for c in r.json()["choices"]] == want.replies


# ---------------------------------------------------------------------------------------------- bad input


def _raw(content: bytes, ctype: str | None = "application/json") -> dict:
    return {"content": content, "headers": {"content-type": ctype} if ctype else {}}


def _chunked(total: int):
    """A body without Content-Length: httpx sends a generator with Transfer-Encoding: chunked."""
    def gen():
        yield b'{"message": "'
        for _ in range(total // 4096):
            yield b"1" * 4096
        yield b'"}'
    return {"content": gen(), "headers": {"content-type": "application/json"}}


OVER = MAX_BODY_BYTES + 1024

# (id, path, request kwargs for httpx, expected status, text expected in error.message)
BAD = [
    ("empty-message", "/v1/chat", {"json": {"message": ""}}, 422, "message"),
    ("blank-message", "/v1/chat", {"json": {"message": "   "}}, 422, "message"),
    ("message-int", "/v1/chat", {"json": {"message": 5}}, 422, "message"),
    ("message-null", "/v1/chat", {"json": {"message": None}}, 422, "message"),
    ("message-list", "/v1/chat", {"json": {"message": ["9"]}}, 422, "message"),
    ("temperature-str", "/v1/chat", {"json": {"message": "1", "temperature": "hot"}}, 422, "temperature"),
    ("temperature-numeric-str", "/v1/chat", {"json": {"message": "1", "temperature": "0.5"}}, 422, "temperature"),
    ("temperature-nan", "/v1/chat", _raw(b'{"message": "1", "temperature": NaN}'), 422, "temperature"),
    ("temperature-inf", "/v1/chat", _raw(b'{"message": "1", "temperature": Infinity}'), 422, "temperature"),
    ("history-not-list", "/v1/chat", {"json": {"message": "1", "history": "1 2"}}, 422, "history"),
    ("history-bad-role", "/v1/chat", {"json": {"message": "1", "history": [{"role": "bot", "content": "x"}]}},
     422, "history"),
    ("history-item-null", "/v1/chat", {"json": {"message": "1", "history": [None]}}, 422, "history"),
    ("num-replies-float", "/v1/chat", {"json": {"message": "1", "num_replies": 1.5}}, 422, "num_replies"),
    ("num-replies-bool", "/v1/chat", {"json": {"message": "1", "num_replies": True}}, 422, "num_replies"),
    ("top-k-bool", "/v1/chat", {"json": {"message": "1", "top_k": False}}, 422, "top_k"),
    ("max-tokens-str", "/v1/chat", {"json": {"message": "1", "max_tokens": "3"}}, 422, "max_tokens"),
    ("missing-message", "/v1/chat", {"json": {"temperature": 0.5}}, 422, "message: missing"),
    ("unknown-field", "/v1/chat", {"json": {"message": "1", "prompt": "1"}}, 422, "prompt: unknown field"),
    ("body-is-list", "/v1/chat", {"json": ["9 2 3"]}, 422, "body"),
    ("body-is-null", "/v1/chat", _raw(b"null"), 422, "body"),
    ("empty-body", "/v1/chat", _raw(b""), 422, "body"),
    ("invalid-json", "/v1/chat", _raw(b'{"message": "9 2 3"'), 400, "JSON"),
    ("invalid-json-single-quotes", "/v1/chat", _raw(b"{'message': '9'}"), 400, "JSON"),
    ("deeply-nested-json", "/v1/chat", _raw(b"[" * 20000 + b"]" * 20000), 400, "body"),
    ("non-utf8", "/v1/chat", _raw(b'{"message": "9 \xff\xfe 3"}'), 400, "UTF-8"),
    ("lone-surrogate", "/v1/chat", _raw(b'{"message": "9 \\ud800"}'), 422, "message"),
    ("text-plain", "/v1/chat", _raw(b'{"message": "9"}', "text/plain"), 415, "application/json"),
    ("no-content-type", "/v1/chat", _raw(b'{"message": "9"}', None), 415, "application/json"),
    ("form-encoded", "/v1/chat", {"data": {"message": "9"}}, 415, "application/json"),
    ("temperature-below-0", "/v1/chat", {"json": {"message": "1", "temperature": -0.1}}, 422, "temperature"),
    ("temperature-above-2", "/v1/chat", {"json": {"message": "1", "temperature": 2.01}}, 422, "temperature"),
    ("top-k-negative", "/v1/chat", {"json": {"message": "1", "top_k": -1}}, 422, "top_k"),
    ("top-k-too-big", "/v1/chat", {"json": {"message": "1", "top_k": 1001}}, 422, "top_k"),
    ("max-tokens-0", "/v1/chat", {"json": {"message": "1", "max_tokens": 0}}, 422, "max_tokens"),
    ("max-tokens-too-big", "/v1/chat", {"json": {"message": "1", "max_tokens": MAX_TOKENS + 1}}, 422, "max_tokens"),
    ("num-replies-0", "/v1/chat", {"json": {"message": "1", "num_replies": 0}}, 422, "num_replies"),
    ("num-replies-9", "/v1/chat", {"json": {"message": "1", "num_replies": 9}}, 422, "num_replies"),
    ("seed-negative", "/v1/chat", {"json": {"message": "1", "seed": -1}}, 422, "seed"),
    ("seed-too-big", "/v1/chat", {"json": {"message": "1", "seed": 2**62 + 1}}, 422, "seed"),
    ("seed-huge", "/v1/chat", {"json": {"message": "1", "seed": 10**40}}, 422, "seed"),
    ("oversized-content-length", "/v1/chat", _raw(b'{"message": "' + b"1" * OVER + b'"}'), 413, "larger"),
    ("oversized-chunked", "/v1/chat", _chunked(OVER), 413, "larger"),
    ("history-turn-of-1mb", "/v1/chat", {"json": {"message": "1", "history": ["1" * 2**20]}}, 413, "larger"),
    ("history-10000-turns", "/v1/chat", {"json": {"message": "1", "history": ["1"] * 10_000}}, 422, "history"),
    ("history-51-turns", "/v1/chat", {"json": {"message": "1", "history": ["1"] * (MAX_HISTORY_TURNS + 1)}},
     422, "history"),
    ("history-turn-too-long", "/v1/chat", {"json": {"message": "1", "history": ["1" * (MAX_MESSAGE_CHARS + 1)]}},
     422, "history"),
    ("message-too-long", "/v1/chat", {"json": {"message": "1" * (MAX_MESSAGE_CHARS + 1)}}, 422, "message"),
    ("get-on-post-route", "/v1/chat", {"method": "GET"}, 405, "Method Not Allowed"),
    ("unknown-route", "/v2/chat", {"json": GOOD}, 404, "Not Found"),
    ("openai-no-messages", "/v1/chat/completions", {"json": {"model": "m", "messages": []}}, 422, "messages"),
    ("openai-missing-messages", "/v1/chat/completions", {"json": {"model": "m"}}, 422, "messages"),
    ("openai-last-not-user", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]}},
     422, "last message"),
    ("openai-last-user-blank", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": " "}]}},
     422, "last message"),
    ("openai-bad-role", "/v1/chat/completions", {"json": {"messages": [{"role": "robot", "content": "1"}]}},
     422, "role"),
    ("openai-messages-not-list", "/v1/chat/completions", {"json": {"messages": "9 2 3"}}, 422, "messages"),
    ("openai-temperature-3", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": "1"}], "temperature": 3}}, 422, "temperature"),
    ("openai-n-9", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "1"}], "n": 9}},
     422, "n: "),
    ("openai-max-tokens-0", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": "1"}], "max_tokens": 0}}, 422, "max_tokens"),
    ("openai-text-plain", "/v1/chat/completions", _raw(b'{"messages": []}', "text/plain"), 415, "application/json"),
    ("openai-unknown-field", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": "1"}], "best_of": 2}}, 422, "best_of: unknown field"),
    ("openai-top-p-0", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": "1"}], "top_p": 0}}, 422, "top_p"),
    ("openai-top-p-above-1", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": "1"}], "top_p": 1.5}}, 422, "top_p"),
    ("openai-top-logprobs-21", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": "1"}], "logprobs": True, "top_logprobs": 21}},
     422, "top_logprobs"),
    ("openai-stop-empty", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": "1"}], "stop": [""]}}, 422, "stop"),
    ("openai-stop-int", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": "1"}], "stop": 5}}, 422, "stop"),
    ("openai-tools", "/v1/chat/completions",
     {"json": {"messages": [{"role": "user", "content": "1"}], "tools": []}}, 422, "tools: not supported"),
]


@pytest.mark.parametrize(("path", "kwargs", "status", "says"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_request_gets_a_json_4xx_and_the_server_keeps_serving(client, path, kwargs, status, says):
    kwargs = dict(kwargs)
    method = kwargs.pop("method", "POST")
    r = client.request(method, path, **kwargs)
    assert r.status_code == status, r.text[:500]
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"], r.text
    assert says in err["message"], err
    assert err["type"] == "invalid_request_error"
    assert "Traceback" not in r.text and 'File "' not in r.text
    # ... and a good request right after still succeeds
    assert set(words_of(chat(client, **GOOD)["reply"])) <= DIGITS


# ---------------------------------------------------------------------------------------------- API key


def test_api_key_is_required_where_configured(client, model):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "wrong"}, {"Authorization": KEY},
                    {"Authorization": f"Basic {KEY}"}, {"X-API-Key": KEY + "x"}):
        for method, path in (("POST", "/secure/v1/chat"), ("POST", "/secure/v1/chat/completions"),
                             ("GET", "/secure/v1/models")):
            body = {"messages": [{"role": "user", "content": "1"}]} if "completions" in path else GOOD
            r = client.request(method, path, json=body if method == "POST" else None, headers=headers)
            assert r.status_code == 401, (headers, path, r.text)
            err = r.json()["error"]
            assert err["type"] == "authentication_error" and "API key" in err["message"]
            assert KEY not in r.text

    expected = chat(client, **GOOD)["reply"]
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"authorization": f"bearer {KEY}"}, {"X-API-Key": KEY}):
        r = client.post("/secure/v1/chat", json=GOOD, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["reply"] == expected
    assert client.get("/secure/v1/models", headers={"X-API-Key": KEY}).json()["data"][0]["id"] == model.model_id

    # health checks, the page and the API docs stay open (load balancers, the browser before a key is typed)
    assert client.get("/secure/healthz").status_code == 200
    assert client.get("/secure/").status_code == 200
    assert "/secure/openapi.json" in client.get("/secure/docs").text  # the docs page finds its schema
    assert client.get("/secure/openapi.json").status_code == 200
    # a bad request with a good key is a 422, not a 401
    r = client.post("/secure/v1/chat", json={"message": ""}, headers={"X-API-Key": KEY})
    assert r.status_code == 422


def test_openai_client_with_api_key(base_url, model):
    openai = pytest.importorskip("openai")
    good = openai.OpenAI(base_url=f"{base_url}/secure/v1", api_key=KEY, max_retries=0, timeout=30)
    out = good.chat.completions.create(model=model.model_id, messages=[{"role": "user", "content": "9 2 3"}],
                                       temperature=0)
    greedy = model.generate([GenRequest("9 2 3", max_tokens=model.max_tgt_len)])[0].replies[0]
    assert out.choices[0].message.content == greedy
    bad = openai.OpenAI(base_url=f"{base_url}/secure/v1", api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=model.model_id, messages=[{"role": "user", "content": "9 2 3"}])


# ---------------------------------------------------------------------------------------------- build_app


def test_build_app_names_a_missing_checkpoint(tmp_path):
    from rayseq.serving.app import build_app

    missing = tmp_path / "no" / "such" / "run"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        build_app({"checkpoint": str(missing)})
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(FileNotFoundError, match="empty_run"):
        build_app({"checkpoint": str(tmp_path / "empty_run")})


def test_build_app_names_an_unknown_argument(checkpoint, monkeypatch):
    from rayseq.serving.app import build_app

    with pytest.raises(ValueError, match="replica"):
        build_app({"checkpoint": checkpoint, "replica": 2})
    monkeypatch.delenv("RAYSEQ_CHECKPOINT", raising=False)
    with pytest.raises(ValueError, match="checkpoint"):
        build_app({})
    monkeypatch.setenv("RAYSEQ_CHECKPOINT", checkpoint)
    assert build_app({}) is not None


def test_build_app_accepts_the_serve_config_args(checkpoint):
    import yaml

    from rayseq.serving.app import build_app

    (app,) = yaml.safe_load((ROOT / "serve" / "chatbot.yaml").read_text())["applications"]
    assert app["import_path"] == "rayseq.serving.app:build_app"
    assert build_app({**app["args"], "checkpoint": checkpoint}) is not None


# ---------------------------------------------------------------------------------------------- the CLI


def _serve_cli_env() -> dict:
    # The CLI embeds its own Ray (ray.init(address="local")); without RAY_ADDRESS it can never join this
    # session's Ray, whose Serve (cluster-scoped) it would otherwise take over.
    env = dict(os.environ, RAY_DEDUP_LOGS="0")
    env.pop("RAY_ADDRESS", None)
    env.pop("RAYSEQ_API_KEY", None)
    return env


@pytest.fixture(scope="module")
def cli_server(checkpoint, tmp_path_factory):
    """``python -m rayseq.serve`` started as soon as the checkpoint exists, so that its Ray and replica
    come up while this module's own Serve does (it is used by the last tests). Its own process group;
    SIGKILLed (that group only) if it is still running at the end."""
    port, log = free_port(), tmp_path_factory.mktemp("cli") / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rayseq.serve", "--checkpoint", checkpoint, "--port", str(port)],
            cwd=ROOT, env=_serve_cli_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    yield proc, port, log
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_cli_serves_until_sigint(cli_server, model):
    proc, port, log = cli_server
    try:
        wait_healthy(f"http://127.0.0.1:{port}/healthz", timeout_s=90, proc=proc)
        # /healthz answers as soon as the replica is up, a moment before serve.run returns and the CLI
        # prints its banner (Ctrl-C before the banner: test_cli_ctrl_c_during_startup_shuts_serve_down)
        wait_for_text(log, f"at http://127.0.0.1:{port}/", timeout_s=30, proc=proc)
    except (RuntimeError, TimeoutError) as exc:
        pytest.fail(f"{exc}\n{log.read_text()[-3000:]}")
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat", json=GOOD, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["reply"] == model.generate([GenRequest("9 2 3", max_tokens=model.max_tgt_len)])[0].replies[0]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)


def test_cli_ctrl_c_during_startup_shuts_serve_down(checkpoint, monkeypatch):
    """Deterministic stand-in for SIGINT during deployment (seen for real when the signal came right
    after /healthz first answered): serve.run raises KeyboardInterrupt."""
    import ray
    from ray import serve

    from rayseq import serve as cli

    calls = []

    def interrupted_run(*args, **kwargs):
        calls.append("run")
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # no Ray of its own for this check
    monkeypatch.setattr(serve, "start", lambda **kwargs: calls.append("start"))
    monkeypatch.setattr(serve, "run", interrupted_run)
    monkeypatch.setattr(serve, "shutdown", lambda: calls.append("shutdown"))
    try:
        returncode = cli.main(["--checkpoint", checkpoint, "--port", str(free_port())])
    except KeyboardInterrupt:
        returncode = "KeyboardInterrupt escaped main()"
    assert calls[:2] == ["start", "run"]
    assert returncode == 0 and calls[-1] == "shutdown", (returncode, calls)


def test_cli_missing_checkpoint_exits_2_naming_the_path():
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "rayseq.serve", "--checkpoint", "/nonexistent/run"], cwd=ROOT,
                       env=_serve_cli_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "/nonexistent/run" in r.stderr and "error" in r.stderr
    assert "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 60  # fails before starting Ray
