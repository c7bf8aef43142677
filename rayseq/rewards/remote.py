"""Rewards computed by another server: a remote reward model speaking OpenRLHF's protocol, and an LLM judge behind
any OpenAI-compatible chat endpoint. Both are reward functions ``fn(prompts, replies, references, **kwargs)``
(:mod:`rayseq.rewards.reward`): they run where configured rewards run (the scorer actors), on ``reward.batch_size``
replies a call.

``reward.fn=remote_reward`` (kwargs ``url``): ``POST url`` with ``{"query": [prompt + reply, ...], "prompts":
[...]}`` (OpenRLHF's ``--remote_rm_url`` request; ``python -m rayseq.serve`` serves a reward model's run at
``/get_reward``) and reads ``{"rewards": [...]}``, one float per query. A connection error or a 5xx is retried
``retries`` times, ``backoff_s`` apart; anything else, or a wrong answer, is an error naming the URL.

``reward.fn=llm_judge`` (kwargs ``base_url``, ``model``, ``template``): for each reply, one chat completion of the
``template`` filled with ``{prompt}``, ``{reply}`` and ``{reference}`` (the first reference, "" without), through the
``openai`` client (``pip install openai``); the first number in the answer is the score, clipped to
[``min_score``, ``max_score``] and, with ``normalize``, mapped to [0, 1]. An answer without a number is "not
judged" (None: left out of the sum and of the term's mean). ``api_key`` defaults to ``$OPENAI_API_KEY``, else
"EMPTY" (a local server needs none). Greedy answers (temperature 0) unless ``temperature`` says otherwise.

Math layer: the standard library and numpy (and the ``openai`` client, imported when a judge is called).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request

import numpy as np

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _post(url: str, body: dict, timeout_s: float, retries: int, backoff_s: float, headers: dict) -> dict:
    data = json.dumps(body).encode("utf-8")
    for attempt in range(retries + 1):
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            if exc.code < 500 or attempt == retries:
                raise ValueError(f"remote_reward: {url} answered {exc.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            if attempt == retries:
                raise ValueError(f"remote_reward: {url} unreachable after {retries + 1} tries: {exc}") from None
        except json.JSONDecodeError:
            raise ValueError(f"remote_reward: {url} answered something that is not JSON") from None
        time.sleep(backoff_s * (attempt + 1))
    raise AssertionError("unreachable")


def remote_reward(prompts: list[str], replies: list[str], references: list[list[str]], *, url: str,
                  timeout_s: float = 60.0, retries: int = 2, backoff_s: float = 1.0,
                  api_key: str | None = None) -> np.ndarray:
    """The remote reward model's reward of each (prompt, reply) (module docstring)."""
    if not replies:
        return np.zeros(0)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    answer = _post(url, {"query": [p + r for p, r in zip(prompts, replies)], "prompts": list(prompts)},
                   timeout_s, retries, backoff_s, headers)
    rewards = answer.get("rewards") if isinstance(answer, dict) else None
    if not isinstance(rewards, list) or len(rewards) != len(replies):
        got = f"{len(rewards)} rewards" if isinstance(rewards, list) else f"{str(answer)[:200]!r}"
        raise ValueError(f"remote_reward: {url} answered {got} for {len(replies)} queries; a reward server answers "
                         '{"rewards": [one float per query]}')
    return np.asarray(rewards, dtype=np.float64)


def _check_remote(url: str, timeout_s: float = 60.0, retries: int = 2, backoff_s: float = 1.0,
                  api_key: str | None = None) -> None:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be an http:// or https:// address, got {url!r}")
    if not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
    for k, v in (("timeout_s", timeout_s), ("backoff_s", backoff_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"{k} must be a number >= 0, got {v!r}")


remote_reward.check_kwargs = _check_remote


def judge_score(answer: str, min_score: float, max_score: float, normalize: bool) -> float | None:
    """The first number in a judge's ``answer``, clipped to [min_score, max_score] (mapped to [0, 1] with
    ``normalize``); None when it has none."""
    m = NUMBER.search(answer or "")
    if m is None:
        return None
    x = min(max(float(m.group()), min_score), max_score)
    return (x - min_score) / (max_score - min_score) if normalize else x


def llm_judge(prompts: list[str], replies: list[str], references: list[list[str]], *, base_url: str, model: str,
              template: str, min_score: float = 0.0, max_score: float = 10.0, normalize: bool = True,
              api_key: str | None = None, max_tokens: int = 16, temperature: float = 0.0,
              timeout_s: float = 60.0) -> list[float | None]:
    """The judge's score of each reply (module docstring)."""
    try:
        from openai import OpenAI
    except ImportError:
        raise ValueError("llm_judge needs the openai client: pip install openai") from None
    client = OpenAI(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                    timeout=timeout_s)
    out = []
    for p, r, refs in zip(prompts, replies, references):
        content = template.format(prompt=p, reply=r, reference=refs[0] if refs else "")
        answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                                max_tokens=max_tokens, temperature=temperature)
        out.append(judge_score(answer.choices[0].message.content, min_score, max_score, normalize))
    return out


def _check_judge(base_url: str, model: str, template: str, min_score: float = 0.0, max_score: float = 10.0,
                 normalize: bool = True, api_key: str | None = None, max_tokens: int = 16,
                 temperature: float = 0.0, timeout_s: float = 60.0) -> None:
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must be an http:// or https:// address, got {base_url!r}")
    if not isinstance(template, str) or "{reply}" not in template:
        raise ValueError("template must be a string with a {reply} field (and optionally {prompt}, {reference})")
    try:
        template.format(prompt="", reply="", reference="")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"template: only {{prompt}}, {{reply}} and {{reference}} can be filled in ({exc!r}); "
                         "write a literal brace as {{ or }}") from None
    if not max_score > min_score:
        raise ValueError(f"max_score={max_score} must be above min_score={min_score}")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")


llm_judge.check_kwargs = _check_judge
