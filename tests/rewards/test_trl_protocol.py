"""TRL's reward protocol beside rayseq's (rayseq/reward_protocol.py, rayseq/rewards/reward.py):
detection by signature, the dataset's columns per row, None = not judged (out of the sum and of the term's mean),
async functions awaited, weighted terms mixing both kinds, and the errors at the first batch. The Ray path trains
with them in tests/hf/test_hf_trl.py."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from rayseq import reward_protocol
from rayseq.config import ConfigError, build_config, task_config_model
from rayseq.data import PrepareOptions, prepare
from rayseq.rewards import library
from rayseq.rewards.reward import Reward, RewardError, Term
from rayseq.tasks import make_task
from tests import reward_fixtures as fx

# (prompt, solution, difficulty)
ROWS = [(f"what is {a} plus {b} ?", str(a + b), (a + b) % 3) for a in range(6) for b in range(5)]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("trl")
    (d / "m.jsonl").write_text("".join(json.dumps({"prompt": p, "solution": s, "difficulty": k}) + "\n"
                                       for p, s, k in ROWS), encoding="utf-8")
    prepare(f"jsonl:{d / 'm.jsonl'}", d / "data", PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.1))
    return make_task(task_config_model("pairs")(name="pairs", data=str(d / "data"), val_size=3, test_size=100))


def rows_with_difficulty(task, wanted: list[int]) -> np.ndarray:
    """Training rows (keys) whose difficulty column is ``wanted[i]``, distinct, in that order."""
    diff = task.column_values(np.arange(len(task.train)))["difficulty"]
    keys = []
    for d in wanted:
        keys.append(next(k for k in range(len(diff)) if diff[k] == d and k not in keys))
    return np.array(keys, dtype=np.int64)


def batch(task, replies: list[str], key=None):
    """Training rows ``key`` (default: the first ones) with these replies as a generator returns them (ids, EOS,
    padding)."""
    key = np.arange(len(replies), dtype=np.int64) if key is None else np.asarray(key)
    s = task.train
    T = task.max_tgt_len
    tokens = np.zeros((len(replies), T), dtype=np.int64)
    mask = np.zeros((len(replies), T), dtype=np.float32)
    for i, r in enumerate(replies):
        ids = task.vocab.encode(r.split()).tolist() + [task.specials.eos]
        tokens[i, : len(ids)], mask[i, : len(ids)] = ids, 1.0
    return s.src[key], s.src_len[key], tokens, mask, key


def test_protocol_is_told_by_signature():
    assert not reward_protocol.is_keyword(fx.short)  # (prompts, replies, references)
    assert not reward_protocol.is_keyword(library.length)  # (prompts, replies, references, *, target)
    for fn in (fx.trl_length, fx.trl_accuracy, fx.trl_async, fx.trl_none_for_easy, fx.trl_logged):
        assert reward_protocol.is_keyword(fn), fn.__name__

    def f(prompts, completions, completion_ids):  # binds three positionals, but names TRL's arguments
        return []

    def g(prompts, replies, references, **kw):  # rayseq's, with **kwargs
        return []

    assert reward_protocol.is_keyword(f) and not reward_protocol.is_keyword(g)
    assert reward_protocol.required_columns(fx.trl_accuracy) == ["solution"]
    assert reward_protocol.required_columns(fx.trl_logged, {"log": "x"}) == ["solution"]
    assert reward_protocol.accepted(f, ["prompts", "completions", "completion_ids", "solution"]) == [
        "prompts", "completions", "completion_ids"]


def test_columns_none_async_and_weights_by_hand(task):
    """Four training rows of difficulty [0, 1, 2, 0] (solutions s0..s3); replies s0, s1, a wrong digit, s3:
    accuracy [1, 1, 0, 1]; none_for_easy -> [None, 1, 1, None]; async: 1 token / 10 = [0.1] * 4; length (rayseq's
    positional, target 1): 1 token each -> [0] * 4.
    R = 1·acc + 0.5·easy + 2·async + 1·length, None adding 0: [1.2, 1.7, 0.7, 1.2]."""
    key = rows_with_difficulty(task, [0, 1, 2, 0])
    cols = task.column_values(key)
    assert cols["difficulty"] == [0, 1, 2, 0]
    for p, sol in zip(task.prompt_values(key), cols["solution"]):  # each row's own solution: a + b of its prompt
        assert int(sol) == int(p.split()[2]) + int(p.split()[4])
    sol = cols["solution"]
    replies = [sol[0], sol[1], str((int(sol[2]) + 1) % 10), sol[3]]
    terms = [Term("accuracy", fx.trl_accuracy, 1.0, label="acc"), Term("easy", fx.trl_none_for_easy, 0.5, label="e"),
             Term("async", fx.trl_async, 2.0, label="a"), Term("length", library.length, 1.0, {"target": 1}, "l")]
    reward = Reward(task, terms)
    score, term_scores = reward.scores(*batch(task, replies, key))
    assert score.tolist() == pytest.approx([1.2, 1.7, 0.7, 1.2])
    assert np.isnan(term_scores[[0, 3], 1]).all() and term_scores[[1, 2], 1].tolist() == [1.0, 1.0]
    m = reward.metrics(term_scores)
    assert m["reward/accuracy"] == 0.75 and m["reward/easy"] == 1.0  # the mean over the judged replies
    assert m["reward/async"] == pytest.approx(0.1) and m["reward/length"] == 0.0
    # a batch where a term judges nothing: NaN logged, the sum unaffected, no error
    only_easy = Reward(task, [Term("easy", fx.trl_none_for_easy, label="e")])
    s, ts = only_easy.scores(*[a[[0, 3]] for a in batch(task, replies, key)])
    assert s.tolist() == [0.0, 0.0] and np.isnan(only_easy.metrics(ts)["reward/easy"])

    async def inside_a_loop():  # an async actor's loop: the coroutine runs on a thread of its own
        return Reward(task, [Term("async", fx.trl_async, label="a")]).scores(*batch(task, ["1", "2"]))[0]

    assert asyncio.run(inside_a_loop()).tolist() == pytest.approx([0.1, 0.1])


def test_batches_and_what_a_function_receives(task, tmp_path):
    """reward.batch_size splits the calls; each call gets its rows' prompts as written, the replies' text and ids,
    and every column (a **kwargs function); replies are as the word tokenizer emits them."""
    log = tmp_path / "calls.jsonl"
    reward = Reward(task, [Term("acc", fx.trl_logged, kwargs={"log": str(log)}, label="acc")], batch_size=3)
    sol = task.column_values(np.arange(4))["solution"]
    replies = [sol[0], sol[1], sol[2], f"{sol[3]} ?"]
    src, src_len, tokens, mask, key = batch(task, replies)
    score, _ = reward.scores(src, src_len, tokens, mask, key)
    assert score.tolist() == [1.0, 1.0, 1.0, 1.0]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["prompt"] for c in calls] == task.prompt_values(key)
    assert [c["completion"] for c in calls] == [*replies[:3], f"{sol[3]}?"]  # detokenised: "1 ?" reads "1?"
    assert [c["solution"] for c in calls] == sol and calls[0]["columns"] == ["difficulty"]
    assert calls[3]["ids"] == task.vocab.encode([sol[3], "?"]).tolist()  # without the end token


def test_errors_at_the_first_batch(task):
    args = batch(task, ["0", "1", "5"])
    cases = [(fx.trl_short, "returned 2 values (list) for a batch of 3 replies"),
             (fx.trl_nan, "returned nan for reply 0 of a batch of 3"),
             (fx.trl_needs_missing, "needs the dataset column 'answer_key'; the dataset's columns: difficulty, "
                                    "solution")]
    for fn, msg in cases:
        with pytest.raises(RewardError, match=f"^reward.fn=x:{fn.__name__} " + msg.replace("(", r"\(").replace(")",
                                                                                                               r"\)")):
            Reward(task, [Term("t", fn, label=f"reward.fn=x:{fn.__name__}")]).scores(*args)


def test_config_accepts_trl_functions_and_names_bad_ones(corpus):
    base = ["task.name=pairs", f"task.data={corpus}", "task.test_size=100"]
    cfg = build_config(None, [*base, "reward.terms=[{fn: tests.reward_fixtures:trl_accuracy}, "
                                     "{fn: chrf, weight: 0.5}, {fn: tests.reward_fixtures:trl_async}]"])
    assert [t.metric_name for t in cfg.reward.resolved_terms] == ["trl_accuracy", "chrf", "trl_async"]
    build_config(None, [*base, "reward.fn=tests.reward_fixtures:trl_logged", "reward.kwargs={log: x}"])
    with pytest.raises(ConfigError, match=r"trl_positional_only cannot be called as trl_positional_only\(prompts="
                                          r"\.\.\., completions=\.\.\., completion_ids=\.\.\., \*\*columns\) "
                                          r"\(TRL's reward protocol\): 'completions' parameter is positional only"):
        build_config(None, [*base, "reward.fn=tests.reward_fixtures:trl_positional_only"])
