"""The chit-chat task: data from `rayseq.data prepare`, the BLEU-2 reward against all references of an
input (equal to sacrebleu), evaluation metrics by hand, training with rewards on ScorerActors, and
the checkpoint served by the chat model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayseq.config import build_config
from rayseq.distributed.driver import Trainer
from rayseq.tasks.chitchat import ChitchatTask, distinct_n, self_bleu
from tests.conftest import write_corpus


def tiny_args(corpus: Path) -> list[str]:
    return ["task.name=chitchat", f"task.data={corpus}", "task.test_size=100", "model.emb_dim=16",
            "model.hidden_dim=32", "train.pretrain_iters=30", "train.pretrain_batch_size=32", "train.pretrain_lr=1e-2",
            "train.iters=4", "train.batch_size=32", "train.eval_every=2", "progress=false", "algo.name=reinforce"]


def tiny(corpus: Path, *extra: str):
    return build_config(None, [*tiny_args(corpus), *extra])


def test_prompts_rewards_and_references(corpus):
    import sacrebleu

    task = ChitchatTask(tiny(corpus).task)
    b = task.sample_prompts(np.random.default_rng(0), 16, with_targets=True)
    rows = np.arange(16)
    assert (b.tgt[rows, b.tgt_len - 1] == task.specials.eos).all()  # MLE targets end in EOS
    # a key names the training row; its references are every reply given to its input in the training split
    for k, s, sl in zip(b.key, b.src, b.src_len):
        assert " ".join(task.vocab.decode(s[:sl])) == task.train.src_text[int(k)]
        assert task.references([k])[0] is task.train_refs[int(task.train.group[k])]
    # reward = sacrebleu sentence BLEU-2 (effective order) of the reply (EOS excluded) vs all references
    tokens = np.concatenate([b.tgt[:, :-1], np.zeros((16, 1), np.int64)], 1)  # the references themselves + pad
    tokens[0, :3] = [4, 5, task.specials.eos]  # and one made-up two-token reply
    mask = (np.arange(tokens.shape[1])[None] < np.where(rows == 0, 3, b.tgt_len - 1)[:, None]).astype(np.float32)
    rewards, score = task.rewards(b.src, b.src_len, tokens, mask, key=b.key)
    bleu = sacrebleu.metrics.BLEU(max_ngram_order=2, tokenize="none", effective_order=True)
    lens = task.reply_lengths(tokens, mask)
    for i in rows:
        hyp = " ".join(map(str, tokens[i, : lens[i]]))
        refs = [" ".join(map(str, r)) for r in task.train_refs[int(task.train.group[b.key[i]])]]
        assert score[i] == pytest.approx(bleu.sentence_score(hyp, refs).score / 100, abs=1e-6)
        assert rewards[i].sum() == pytest.approx(score[i]) and rewards[i, int(mask[i].sum()) - 1] == score[i]
    assert (score[1:] == 1.0).all()  # a reference scores 1 against a set that contains it


def test_a_keyed_batch_travels_as_its_keys_and_another_task_rebuilds_it_bit_for_bit(corpus):
    """What an actor is sent for rows of the task's data: their keys (PromptKeys), from which its own task (built
    from the same config in another process) rebuilds every array, after the groups' repeat and split too; a batch
    that is not the task's rows (targets replaced, a generated task's) travels as it is."""
    import pickle

    from rayseq.tasks.counting import CountingTask
    from rayseq.types import PromptKeys, prompt_arrays

    cfg = tiny(corpus).task
    task, other = ChitchatTask(cfg), ChitchatTask(cfg)
    for with_targets in (False, True):
        batch = task.sample_prompts(np.random.default_rng(3), 24, with_targets=with_targets)
        for part in (batch, batch.repeat(4), *batch.repeat(4).split(5)):
            sent = part.compact()
            assert isinstance(sent, PromptKeys) and sent.with_targets == with_targets and len(sent) == len(part)
            rebuilt = prompt_arrays(pickle.loads(pickle.dumps(sent)), other)
            for name in ("src", "src_len", "tgt", "tgt_len", "key"):
                a, b = getattr(part, name), getattr(rebuilt, name)
                assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), name
        sent, whole = len(pickle.dumps(batch.repeat(4).compact())), len(pickle.dumps(batch.repeat(4)))
        assert sent < whole / (2 if not with_targets else 4), (sent, whole)
    replaced = batch.repeat(2, tgt=np.repeat(batch.tgt, 2, axis=0))  # RAML's candidates replace the targets
    assert replaced.compact() is replaced and prompt_arrays(replaced, other) is replaced
    counting = CountingTask(build_config(None, ["task.name=counting"]).task).sample_prompts(np.random.default_rng(0), 8)
    assert counting.compact() is counting  # generated inputs: no data to read them from


@pytest.mark.ray
def test_rollout_workers_read_their_prompts_from_the_keys_the_driver_sends(ray_session, corpus):
    """Under Ray each worker is sent its shard's keys (not the token arrays) and samples the rows its own task reads:
    the sampled shards carry exactly the driver's inputs and targets, in shard order."""
    import pickle

    from rayseq.distributed.groups import ActorGroups
    from rayseq.types import PromptKeys, Rollout, RolloutRequest

    rt = ActorGroups(tiny(corpus, "rollout.num_workers=2", "scorer.num_scorers=0", "rollout.num_cpus_per_worker=0.5"))
    try:
        rt.rollout.sync_weights()
        task = ChitchatTask(tiny(corpus).task)
        prompts = task.sample_prompts(np.random.default_rng(5), 16, with_targets=True).repeat(3)
        request = RolloutRequest(max_len=task.max_tgt_len, seed=7)
        samples, _, _ = rt.rollout._calls(prompts, request)
        sent = [s.args[0] for s in samples]
        assert [type(p) for p in sent] == [PromptKeys, PromptKeys] and sum(map(len, sent)) == 48
        assert sum(len(pickle.dumps(p)) for p in sent) < len(pickle.dumps(prompts)) / 4
        shards = ray_session.get(rt.rollout.sample(prompts, request))
        rollout = Rollout.concat(shards)
        assert sorted({s.info["worker"] for s in shards}) == [0, 1]
        for name in ("src", "src_len", "tgt", "key"):
            assert np.array_equal(getattr(rollout, name), getattr(prompts, name)), name
    finally:
        rt.shutdown()


def test_distinct_and_self_bleu_by_hand():
    a, b, c = np.array([1, 2, 3]), np.array([1, 2, 4]), np.array([5])
    # unigrams 1 2 3 1 2 4 5: 5 distinct of 7; bigrams (1,2) (2,3) (1,2) (2,4): 3 distinct of 4
    assert distinct_n([a, b, c], 1) == pytest.approx(5 / 7)
    assert distinct_n([a, b, c], 2) == pytest.approx(3 / 4)
    assert distinct_n([c], 2) == 0.0
    assert self_bleu([a, a]) == pytest.approx(1.0) and self_bleu([a]) == 0.0


def test_missing_dataset_names_the_prepare_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m rayseq.data prepare chitchat --out"):
        ChitchatTask(build_config(None, ["task.name=chitchat", f"task.data={tmp_path / 'none'}"]).task)


def test_task_prepare_builds_the_dataset_once(tmp_path):
    src = write_corpus(tmp_path / "pairs.jsonl", 30)
    cfg = tiny(tmp_path / "auto", f"task.source=jsonl:{src}", "task.prepare=true", "rollout.num_workers=0",
               "train.pretrain_iters=2", "train.iters=0", f"run_dir={tmp_path / 'run'}")
    summary = Trainer(cfg).run()
    assert (tmp_path / "auto" / "manifest.json").is_file()
    names = ("bleu2", "distinct1", "distinct2", "self_bleu2", "reply_len", "sentence_bleu2", "reward",
             "distinct_replies", "unk_replies")
    assert set(summary["metrics"]) == {f"{split}/{k}" for split in ("val", "test") for k in names}
    assert [p["input"] for p in summary["details"]["paper_prompts"]][:2] == ["what can i do for you .",
                                                                              "go , go , go !"]


@pytest.mark.ray
def test_chatbot_trains_with_scorer_actors_and_serves(corpus, tmp_path):
    """BLEU rewards on a ScorerActor (2 rollout workers, 1 scorer); REINFORCE raises the training reward on this
    tiny one-to-many corpus; the checkpoint loads in the chat model and answers.

    The setting where the rise reliably holds: a briefly pretrained model (10 MLE iterations: its sampled
    replies score about 0.3-0.4) and 12 REINFORCE iterations of 64 replies at lr 1e-2. Measured in-process
    over seeds 0-5: mean reward of the first 3 iterations 0.33-0.42, of the last 3 0.54-0.70 (gain 0.19-0.34)."""
    from rayseq.serving.model import ChatModel, GenRequest

    cfg = tiny(corpus, "rollout.num_workers=2", "scorer.num_scorers=1", "train.pretrain_iters=10", "train.iters=12",
               "train.batch_size=64", "algo.lr=1e-2", "train.eval_every=0", f"run_dir={tmp_path / 'run'}")
    assert cfg.num_scorers == 1
    summary = Trainer(cfg).run()
    rows = [r for r in pq.read_table(tmp_path / "run" / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    reward = [r["rollout/reward_mean"] for r in rows]
    assert len(reward) == 12 and all(r["time/rollout_s"] > 0 for r in rows)
    assert np.mean(reward[-3:]) > np.mean(reward[:3]) + 0.1, reward
    assert {"val/bleu2", "test/bleu2"} <= set(summary["metrics"])
    model = ChatModel(summary["checkpoint"])
    assert model.info["task"] == "chitchat"
    out = model.generate([GenRequest(text="hi there", max_tokens=10, temperature=0.0, top_k=0, n=1, seed=0)])
    assert out[0].replies[0].strip()


def test_init_from_a_run_written_with_the_old_task_keys(corpus, tmp_path):
    """A chitchat run pretrained before task.data_dir became task.data (and before test_seed / val_seed were read):
    its checkpoint's config is read as this version reads it, so train.init_from accepts it."""
    from rayseq.checkpoint import load_checkpoint, save_checkpoint

    pre = Trainer(tiny(corpus, "rollout.num_workers=0", "train.pretrain_iters=2", "train.iters=0",
                       f"run_dir={tmp_path / 'pre'}")).run()
    ck = load_checkpoint(pre["checkpoint"])
    old = ck["config"]["task"]
    old["data_dir"] = old.pop("data")
    del old["test_seed"], old["val_seed"]
    save_checkpoint(tmp_path / "pre", pre["iterations"], ck)  # (with its SHA-256, as that version did not record)
    summary = Trainer(tiny(corpus, "rollout.num_workers=0", "train.iters=1", f"train.init_from={tmp_path / 'pre'}",
                           f"run_dir={tmp_path / 'rl'}")).run()
    assert summary["iterations"] == pre["iterations"] + 1


def test_init_from_compares_what_the_weights_depend_on_and_scores_with_this_runs_reward(corpus, tmp_path, capsys):
    """A newcomer's sequence: pretrain once, then start from it with a new reward and the data given another way
    (task.source / task.prepare differ, the prepared data is the same). Accepted; summary.json's "before" is the
    starting model scored with THIS run's reward (its terms are this run's), not the source run's figures."""
    from rayseq.train import main

    pre = Trainer(tiny(corpus, "rollout.num_workers=0", "train.pretrain_iters=20", "train.iters=0",
                       f"run_dir={tmp_path / 'pre'}")).run()
    assert "val/reward/fine" not in pre["pretrain_metrics"]
    rl = Trainer(tiny(corpus, "rollout.num_workers=0", "train.iters=1", "task.name=pairs",
                      f"task.source=jsonl:{corpus}", "task.prepare=false",
                      "reward.terms=[{fn: 'tests.reward_fixtures:fine'}, {fn: chrf, weight: 2}]",
                      f"train.init_from={tmp_path / 'pre'}", f"run_dir={tmp_path / 'rl'}")).run()
    before = rl["pretrain_metrics"]
    assert {"val/reward/fine", "val/reward/chrf", "test/reward/fine", "test/reward/chrf"} <= set(before)
    for split in ("val", "test"):  # the sum of this run's terms, weights 1 and 2
        assert before[f"{split}/reward"] == pytest.approx(before[f"{split}/reward/fine"]
                                                          + 2 * before[f"{split}/reward/chrf"], abs=1e-5)
    assert before["test/reward"] != pre["pretrain_metrics"]["test/reward"]  # the source scored with BLEU-2
    assert before["test/bleu2"] == pytest.approx(pre["pretrain_metrics"]["test/bleu2"])  # the same model, same data
    # what the weights depend on differs: one line before Ray starts, nothing written
    capsys.readouterr()
    code = main([*tiny_args(corpus), "model.hidden_dim=64", "train.iters=1", f"train.init_from={tmp_path / 'pre'}",
                 f"run_dir={tmp_path / 'bad'}", "rollout.num_workers=2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith(f"error: train.init_from={tmp_path / 'pre'}: its model cannot start this "
                                            "run: model.hidden_dim (32 there, 64 here)"), err
    assert not (tmp_path / "bad").exists()
