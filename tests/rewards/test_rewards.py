"""The reward library (rayseq/rewards/library.py, rayseq/rewards/reward.py): the built-ins by hand and against
sacrebleu, weighted sums, the ``reward.*`` config and its errors before anything starts, the checks of what a
function returns at the first batch, and a user's reward on the scorer actors end to end."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayseq.config import ConfigError, build_config, config_to_dict
from rayseq.data.text import tokenize
from rayseq.rewards import library
from rayseq.rewards.reward import RewardError, make_reward
from rayseq.tasks import make_task
from tests.doc_examples import own_data_example

TINY = ["model.emb_dim=16", "model.hidden_dim=32", "task.test_size=100", "train.pretrain_iters=10",
        "train.pretrain_batch_size=32", "train.iters=3", "train.batch_size=32", "train.eval_every=0", "progress=false",
        "algo.name=reinforce"]


def pairs(corpus, *extra: str):
    return build_config(None, ["task.name=pairs", f"task.data={corpus}", *TINY, *extra])


def replies_batch(task, n: int = 12, seed: int = 0):
    """Training prompts and made-up replies as a generator returns them: ids, EOS, padding; row 0 is one of its
    references (BLEU 1), row 1 is empty (EOS only), the others random words of random lengths."""
    rng = np.random.default_rng(seed)
    b = task.sample_prompts(rng, n)
    T = task.max_tgt_len
    tokens = np.zeros((n, T), dtype=np.int64)
    lens = rng.integers(1, T - 1, size=n)
    lens[1] = 0
    for i in range(n):
        tokens[i, : lens[i]] = rng.integers(4, len(task.vocab), size=lens[i])
    ref = task.references(b.key[:1])[0][0]
    tokens[0, :] = 0
    tokens[0, : len(ref)], lens[0] = ref, len(ref)
    tokens[np.arange(n), lens] = task.specials.eos
    mask = (np.arange(T)[None] <= lens[:, None]).astype(np.float32)  # real tokens and the EOS
    return b, tokens, mask, lens


def texts(task, b, tokens, lens):
    """(prompts, replies, references) as a reward function receives them."""
    prompts = [task.reply_text(b.src[i, : b.src_len[i]]) for i in range(len(b))]
    replies = [task.reply_text(tokens[i, : lens[i]]) for i in range(len(b))]
    refs = [[task.reply_text(r) for r in group] for group in task.references(b.key)]
    return prompts, replies, refs


# ------------------------------------------------------------------------------------------- built-ins


def test_length_by_hand():
    # word-tokenizer tokens: "a b c" 3, "" 0, "hi, you!" 4 (hi , you !), six words 6; −|n − 4| / 4
    out = library.length(["p"] * 4, ["a b c", "", "hi, you!", "w w w w w w"], [[]] * 4, target=4)
    assert out.tolist() == [-0.25, -1.0, 0.0, -0.5]


def test_novelty_by_hand_and_against_sacrebleu():
    """1 − BLEU-2 of a reply against the other replies of the batch: a template scores 0, a reply unlike the others
    1, an empty reply 0 (two empty replies are the same reply)."""
    from sacrebleu.metrics import BLEU

    out = library.novelty(["p"] * 4, ["i am not sure", "i am not sure", "pizza with cheese", ""], [[]] * 4)
    assert out.tolist() == [0.0, 0.0, 1.0, 0.0]
    replies = ["i am fine , thanks", "i am good", "great to see you", "not bad at all"]
    bleu = BLEU(max_ngram_order=2, tokenize="none", effective_order=True)
    want = [1 - bleu.sentence_score(h, [r for r in replies if r is not h]).score / 100 for h in replies]
    assert library.novelty(["p"] * 4, replies, [[]] * 4) == pytest.approx(want, abs=1e-9)
    assert library.novelty(["p"], ["alone"], [[]]).tolist() == [1.0]


def test_bleu_and_chrf_equal_sacrebleu():
    from sacrebleu.metrics import BLEU, CHRF

    replies = ["i am fine, thanks", "good", "", "not bad at all", "great to see you!"]
    refs = [["i am fine , thanks", "fine fine"], ["good , and you ?"], ["great to see you"], ["not bad", "bad at all"],
            ["great to see you !", "hi"]]
    prompts = ["how are you ?"] * len(replies)
    for order in (1, 2, 3):
        bleu = BLEU(max_ngram_order=order, tokenize="none", effective_order=True)
        want = [bleu.sentence_score(" ".join(tokenize(h)), [" ".join(tokenize(r)) for r in rs]).score / 100
                for h, rs in zip(replies, refs)]
        assert library.bleu(prompts, replies, refs, max_order=order) == pytest.approx(want, abs=1e-9)
    assert library.bleu(prompts, replies, refs)[0] == pytest.approx(1.0)  # tokens equal one reference
    for kw in ({}, {"word_order": 2, "beta": 3}):
        chrf = CHRF(**kw)
        want = [chrf.sentence_score(h, rs).score / 100 for h, rs in zip(replies, refs)]
        assert library.chrf(prompts, replies, refs, **kw) == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="reply 1 has no reference"):
        library.chrf(prompts[:2], replies[:2], [["x"], []])


def test_bleu_term_is_the_task_reward_on_ids(corpus):
    """The built-in ``bleu`` (vectorised, on ids) equals the pairs task's own reward (BLEU-2 against all references
    of the prompt) and the text ``bleu`` on what a user function would receive."""
    task = make_task(pairs(corpus).task)
    b, tokens, mask, lens = replies_batch(task)
    _, own = task.rewards(b.src, b.src_len, tokens, mask, key=b.key)
    reward = make_reward(task, pairs(corpus, "reward.fn=bleu").reward)
    score, terms = reward.scores(b.src, b.src_len, tokens, mask, key=b.key)
    assert np.array_equal(score, own) and np.array_equal(terms[:, 0], own) and own[0] == 1.0 and own[1] == 0.0
    assert library.bleu(*texts(task, b, tokens, lens)) == pytest.approx(own, abs=1e-6)
    three = make_reward(task, pairs(corpus, "reward.fn=bleu", "reward.kwargs={max_order: 3}").reward)
    assert three.scores(b.src, b.src_len, tokens, mask, key=b.key)[0] == pytest.approx(
        library.bleu(*texts(task, b, tokens, lens), max_order=3), abs=1e-6)


def test_weighted_terms_by_hand(corpus, tmp_path):
    """R = chrF + 0.5·length(target 3) − 2·logged (a user function), each term logged unweighted; the reward goes
    on each reply's last token (its EOS)."""
    log = tmp_path / "calls.txt"
    terms = (f"reward.terms=[{{fn: chrf}}, {{fn: length, weight: 0.5, kwargs: {{target: 3}}}}, "
             f"{{fn: 'tests.reward_fixtures:logged', weight: -2, kwargs: {{log: '{log}'}}, name: greeting}}]")
    cfg = pairs(corpus, terms, "reward.batch_size=5")
    task = make_task(cfg.task, cfg.reward)
    assert task.reward.names == ["chrf", "length", "greeting"]
    b, tokens, mask, lens = replies_batch(task)
    rewards, score = task.rewards(b.src, b.src_len, tokens, mask, key=b.key)  # the installed reward
    prompts, replies, refs = texts(task, b, tokens, lens)
    parts = [library.chrf(prompts, replies, refs), library.length(prompts, replies, refs, target=3),
             np.array([float(any(w in r for w in ("fine", "good", "great"))) for r in replies])]
    want = parts[0] + 0.5 * parts[1] - 2 * parts[2]
    assert score == pytest.approx(want, abs=1e-6)
    assert rewards[np.arange(len(b)), lens] == pytest.approx(want, abs=1e-6) and rewards.sum() == pytest.approx(
        want.sum(), abs=1e-4)  # only the EOS position is rewarded
    _, term_scores = task.reward.scores(b.src, b.src_len, tokens, mask, key=b.key)
    assert term_scores == pytest.approx(np.stack(parts, 1), abs=1e-6)
    assert task.reward.metrics(term_scores) == pytest.approx(
        {"reward/chrf": parts[0].mean(), "reward/length": parts[1].mean(), "reward/greeting": parts[2].mean()},
        abs=1e-6)
    # batch_size 5: the user function saw 12 replies as 5 + 5 + 2, twice (two scorings)
    assert [int(line.split()[1]) for line in log.read_text().splitlines()] == [5, 5, 2] * 2


def test_counting_val_reward_is_the_sampled_precision_or_the_configured_reward():
    from rayseq.models import make_generator

    base = ["task.min_len=2", "task.max_len=4", "task.test_size=100", "task.val_size=50", "model.emb_dim=8",
            "model.hidden_dim=8"]
    cfg = build_config(None, base)
    task = make_task(cfg.task, cfg.reward)
    gen = make_generator(cfg, task)
    m, _ = task.evaluate(gen, split="val")
    assert m["val/reward"] == m["val/precision_sampled"]  # the task's own reward, of the same samples
    cfg = build_config(None, [*base, "reward.fn=length", "reward.kwargs={target: 3}"])
    task = make_task(cfg.task, cfg.reward)
    m, _ = task.evaluate(gen, split="test")
    # an untrained model's 3 tokens are digits or specials: detokenised, the specials vanish (fewer than 3 tokens)
    assert -1.0 <= m["test/reward"] <= 0.0 and m["test/reward"] != m["test/precision_sampled"]


# --------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("overrides, message", [
    (["reward.fn=no_such_module:f"],
     "reward.fn: no_such_module:f: module 'no_such_module' not found (run from the folder that holds"),
    (["reward.fn=tests.reward_fixtures:missing"],
     "reward.fn: tests.reward_fixtures:missing: module 'tests.reward_fixtures' has no attribute 'missing'"),
    (["reward.fn=tests.reward_fixtures:two_args"],
     "reward.fn: tests.reward_fixtures:two_args: two_args(prompts, replies) cannot be called as "
     "two_args(prompts, replies, references): too many positional arguments"),
    (["reward.fn=tests.reward_fixtures:NOT_A_FUNCTION"], "NOT_A_FUNCTION is not a function"),
    (["reward.fn=length"], "reward.kwargs: length: length(prompts, replies, references, *, target) cannot be called "
                           "as length(prompts, replies, references): missing a required argument: 'target'"),
    (["reward.fn=length", "reward.kwargs={target: 0}"], "reward.kwargs: length: target must be an integer >= 1"),
    (["reward.fn=bleu", "reward.kwargs={max_orde: 3}"], "got an unexpected keyword argument 'max_orde'"),
    (["reward.terms=[{fn: chrf}, {fn: 'tests.reward_fixtures:nope'}]"],
     "reward.terms.1.fn: tests.reward_fixtures:nope: module 'tests.reward_fixtures' has no attribute 'nope'"),
    (["reward.terms=[{fn: chrf}, {fn: chrf, weight: 2}]"], "more than one term is named 'chrf'"),
    (["reward.fn=chrf", "reward.terms=[{fn: bleu}]"], "a weighted sum replaces reward.fn and reward.kwargs"),
    (["reward.fn=nonsense"], "unknown reward function 'nonsense'; built-in: task, bleu, chrf, length"),
])
def test_reward_errors_at_config_time(overrides, message):
    with pytest.raises(ConfigError) as err:
        build_config(None, ["task.name=pairs", "task.data=unused", *overrides])
    assert message in str(err.value)


def test_reward_applies_to_tasks_with_a_reward_and_non_adversarial_algorithms():
    with pytest.raises(ConfigError, match="reward.fn: task.name=oracle has no reward"):
        build_config(None, ["task.name=oracle", "algo.name=mle", "reward.fn=length", "reward.kwargs={target: 3}"])
    with pytest.raises(ConfigError, match="reward.fn: algo.name=seqgan learns from a reward model of its own"):
        build_config(None, ["algo.name=seqgan", "reward.fn=length", "reward.kwargs={target: 3}"])
    with pytest.raises(ConfigError, match="reward: chrf compares replies with reference replies; the counting task "
                                          "has none"):
        build_config(None, ["reward.fn=chrf"])


def test_reward_config_written_and_read_back_and_where_it_runs():
    counting = build_config(None, [])
    assert counting.num_scorers == 0 and not counting.uses_reward_config  # the task's cheap reward: on the workers
    cfg = build_config(None, ["reward.terms=[{fn: length, kwargs: {target: 3}, weight: 2}]"])
    assert cfg.uses_reward_config and cfg.rollouts_scored_remotely and cfg.num_scorers == 1  # on a scorer actor
    d = config_to_dict(cfg)
    assert d["reward"] == {"terms": [{"fn": "length", "weight": 2.0, "kwargs": {"target": 3}, "name": None}],
                           "batch_size": None}
    assert build_config(d) == cfg
    assert config_to_dict(counting)["reward"] == {"fn": "task", "kwargs": {}, "batch_size": None}
    assert "reward" not in config_to_dict(build_config(None, ["task.name=oracle", "algo.name=mle"]))
    assert "reward" not in config_to_dict(build_config(None, ["algo.name=seqgan"]))
    assert build_config(None, ["rollout.num_workers=0", "reward.fn=length",
                               "reward.kwargs={target: 3}"]).num_scorers == 0  # in-process: no actors at all


def test_chitchat_is_pairs_with_its_corpus_and_data_dir_is_still_read():
    cfg = build_config(None, ["task.name=chitchat"])
    assert (cfg.task.data, cfg.task.source) == ("data/chitchat", "chitchat")  # chitchat's defaults, resolved
    assert config_to_dict(cfg)["task"]["data"] == "data/chitchat"
    assert build_config(None, ["task.name=chitchat", "task.data=elsewhere"]).task.data == "elsewhere"
    assert build_config(None, ["task.name=pairs", "task.data_dir=mine"]).task.data == "mine"  # the old name
    with pytest.raises(ConfigError, match="task.data_dir is the old name of task.data; give one of them"):
        build_config(None, ["task.name=pairs", "task.data_dir=a", "task.data=b"])
    with pytest.raises(ConfigError, match="task.data_dir: task.name=counting does not read this key"):
        build_config(None, ["task.data_dir=a"])
    assert build_config(None, ["task.name=pairs"]).task.data is None


def test_cli_reward_error_stops_before_anything_starts(capsys):
    from rayseq.train import main

    assert main(["task.name=pairs", "task.data=unused", "reward.fn=no_such_module:f"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid config: reward.fn: no_such_module:f: module 'no_such_module' not found")
    assert "Traceback" not in err


# --------------------------------------------------------------------------------- at the first batch


@pytest.mark.parametrize("fn, message", [
    ("short", "reward.fn=tests.reward_fixtures:short returned 11 values (list) for a batch of 12 replies; a reward "
              "function returns one float per reply (12 here)"),
    ("nan_for_empty", "reward.fn=tests.reward_fixtures:nan_for_empty returned nan for reply 1 of a batch of 12 ('');"
                      " rewards must be finite (1 of 12 are NaN or infinite)"),
    ("raises", "reward.fn=tests.reward_fixtures:raises raised KeyError on a batch of 12 replies: 'no such model'"),
])
def test_a_bad_reward_is_named_at_the_first_batch(corpus, fn, message):
    cfg = pairs(corpus, f"reward.fn=tests.reward_fixtures:{fn}")
    task = make_task(cfg.task, cfg.reward)
    b, tokens, mask, _ = replies_batch(task)
    with pytest.raises(RewardError) as err:
        task.rewards(b.src, b.src_len, tokens, mask, key=b.key)
    assert str(err.value) == message


# ------------------------------------------------------------------------------------------ on Ray


@pytest.mark.ray
def test_a_user_reward_runs_on_the_scorer_actors(corpus, ray_session, tmp_path):
    """Pairs with a weighted sum of a user function and chrF: the rollouts are scored on the scorer actor, val/reward
    by the learner, never in the driver; every term is logged; val/reward and test/reward are in the summary before
    and after training."""
    from rayseq.distributed.driver import Trainer

    log = tmp_path / "calls.txt"
    cfg = pairs(corpus, "rollout.num_workers=2", "scorer.num_scorers=1", f"run_dir={tmp_path / 'run'}",
                f"reward.terms=[{{fn: 'tests.reward_fixtures:logged', kwargs: {{log: '{log}'}}}}, "
                "{fn: chrf, weight: 0.5}]")
    assert cfg.num_scorers == 1
    summary = Trainer(cfg).run()
    for part in ("pretrain_metrics", "metrics"):
        assert {"val/reward", "test/reward"} <= set(summary[part]), part
    rows = [r for r in pq.read_table(tmp_path / "run" / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 3
    for r in rows:
        assert r["rollout/reward_mean"] == pytest.approx(r["reward/logged"] + 0.5 * r["reward/chrf"], abs=1e-5)
        assert 0.0 <= r["reward/logged"] <= 1.0 and 0.0 <= r["reward/chrf"] <= 1.0
    calls = [line.split() for line in log.read_text().splitlines()]
    pids = {int(pid) for pid, _ in calls}
    assert os.getpid() not in pids and len(pids) == 2  # the learner (evaluation) and the scorer (rollouts)
    assert sum(int(n) == 16 for _, n in calls) == 2 * 3  # 3 batches of 32 in two shards of 16, on the scorer
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["metrics"] == summary["metrics"]


@pytest.mark.ray
def test_a_wrong_reward_stops_the_run_at_its_first_use_with_one_line(corpus, ray_session, tmp_path, capsys):
    """A reward returning one value too few stops the CLI the first time it scores: without pretraining, the start's
    evaluation in the learner actor (its 6 validation replies) before any rollout: exit code 2 and the error naming
    the function, not a traceback from inside the actor."""
    from rayseq.train import main

    code = main(["task.name=pairs", f"task.data={corpus}", *TINY, "train.pretrain_iters=0",
                 "reward.fn=tests.reward_fixtures:short", "scorer.num_scorers=1", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().splitlines()[-1] == (
        "error: reward.fn=tests.reward_fixtures:short returned 5 values (list) for a batch of 6 replies; a reward "
        "function returns one float per reply (6 here)")
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------- the own-data guide's example

TINY_CLI = ["model.emb_dim=16", "model.hidden_dim=32", "task.test_size=100", "train.pretrain_iters=20",
            "train.pretrain_batch_size=32", "train.iters=3", "train.batch_size=32", "train.eval_every=0",
            "progress=false"]


def check_own_data_run(run_dir) -> dict:
    """What the own-data guide promises of its example's run: summary.json with val/reward and test/reward before and
    after training, reward/polite and reward/chrf per iteration, the sum as rollout/reward_mean."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["task"] == "pairs"
    for part in ("pretrain_metrics", "metrics"):
        assert {"val/reward", "test/reward", "val/bleu2", "test/bleu2"} <= set(summary[part]), part
        for split in ("val", "test"):  # each term's mean of the same sampled replies: the reward is their sum
            m = summary[part]
            assert m[f"{split}/reward"] == pytest.approx(m[f"{split}/reward/polite"] + 0.5 * m[f"{split}/reward/chrf"],
                                                         abs=1e-5)
    rows = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 3
    for r in rows:
        assert r["rollout/reward_mean"] == pytest.approx(r["reward/polite"] + 0.5 * r["reward/chrf"], abs=1e-5)
    return summary


@pytest.mark.ray
def test_own_data_example_trains_locally_with_one_command(tmp_path):
    """The own-data guide's example, verbatim (files and command; a tiny budget appended): run from the folder that
    holds pairs.jsonl and my_reward.py, an embedded Ray, my_reward imported on the actors from that folder."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    example = own_data_example(root)
    for name, content in example["files"].items():
        (tmp_path / name).write_text(content)
    cmd = [sys.executable, *example["local"][1:], *TINY_CLI, f"run_dir={tmp_path / 'run'}"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])  # rayseq "installed"
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert (tmp_path / "data" / "pairs" / "manifest.json").is_file()  # task.prepare made it
    summary = check_own_data_run(tmp_path / "run")
    # the final table shows the reward and each term, before and after, on the test and the validation prompts
    table = {line.rsplit(None, 2)[0]: line.rsplit(None, 2)[1:] for line in r.stdout.splitlines()
             if line.startswith(("reward", "validation reward"))}
    for split, where in (("test", ""), ("val", "validation ")):
        for key, label in ((f"{split}/reward", f"{where}reward (sampled replies)"),
                           (f"{split}/reward/polite", f"{where}reward: polite"),
                           (f"{split}/reward/chrf", f"{where}reward: chrf")):
            assert table[label] == [f"{summary['pretrain_metrics'][key]:.4f}", f"{summary['metrics'][key]:.4f}"]
    manifest = json.loads((tmp_path / "data" / "pairs" / "manifest.json").read_text())["counts"]
    assert manifest["valid"]["groups"] >= 4 and manifest["test"]["groups"] >= 4  # enough prompts to show an effect
    assert manifest["valid"]["unk_rate"] == manifest["test"]["unk_rate"] == 0.0
