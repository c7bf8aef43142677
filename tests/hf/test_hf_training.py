"""model.arch=hf end to end in-process: the config, the pairs task re-tokenised by the model's tokenizer, PPO-dynamic
and GRPO with the KL to the frozen initial model, a user reward on detokenised text, checkpoints in safetensors,
--resume, and LoRA adapters with the adapters-disabled reference."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayseq.checkpoint import load_checkpoint
from rayseq.config import ConfigError, build_config
from rayseq.data.dataset import DialogueData
from rayseq.data.hf_text import HFVocab
from rayseq.distributed.driver import Interrupted, Trainer
from rayseq.tasks import make_task

TINY = ["task.name=pairs", "task.test_size=100", "task.val_size=10", "train.pretrain_iters=2",
        "train.pretrain_batch_size=8", "train.iters=3", "train.batch_size=8", "train.eval_every=2",
        "algo.minibatch_size=8", "rollout.num_workers=0", "progress=false"]


def hf_config(corpus, hf_dir, *extra, run_dir=None, tiny=TINY):
    where = [f"run_dir={run_dir}"] if run_dir is not None else []
    return build_config(None, [*tiny, f"task.data={corpus}", "model.arch=hf", f"model.path={hf_dir}", *where,
                               *extra])


def test_config(corpus, hf_dir, tmp_path):
    cfg = hf_config(corpus, hf_dir)
    assert cfg.task.hf_tokenizer == str(hf_dir)  # the model's tokenizer replaces the vocabulary
    with pytest.raises(ConfigError, match="set model.path"):
        build_config(None, ["task.name=pairs", "task.data=x", "model.arch=hf"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        build_config(None, ["task.name=pairs", "task.data=x", "model.arch=hf", f"model.path={tmp_path / 'empty'}"])
    with pytest.raises(ConfigError, match="no such directory"):
        build_config(None, ["task.name=pairs", "model.arch=hf", f"model.path={tmp_path / 'nowhere'}"])
    with pytest.raises(ConfigError, match="the counting task has its own"):
        build_config(None, ["task.name=counting", "model.arch=hf", f"model.path={hf_dir}"])
    with pytest.raises(ConfigError, match="SeqGAN family is not supported"):
        hf_config(corpus, hf_dir, "algo.name=seqgan_ppo_dynamic")
    with pytest.raises(ConfigError, match="model.path: read only by model.arch=hf"):
        build_config(None, [f"model.path={hf_dir}"])
    with pytest.raises(ConfigError, match="unknown model 'gpt'"):
        build_config(None, ["model.arch=gpt"])


def test_task_is_retokenised_by_the_model_tokenizer(corpus, hf_dir):
    """Every input and reply of the prepared data, in the tokenizer's ids: decoding gives the text as the dataset
    wrote it back (not the word tokenizer's lower-cased tokens); the references of an input are its replies; BLEU-2
    (the task reward) of a reference itself is 1."""
    task = make_task(hf_config(corpus, hf_dir).task)
    words = DialogueData.load(corpus)
    assert isinstance(task.vocab, HFVocab) and len(task.vocab) == 400
    tr = task.train
    for i in range(0, len(tr), 7):
        assert task.reply_text(tr.src[i, : tr.src_len[i]]) == words.splits["train"].prompts[i]
        assert task.reply_text(tr.tgt[i, : tr.tgt_len[i]]) == words.splits["train"].replies[i]
    assert task.max_src_len == int(max(s.src_len.max() for s in task.data.splits.values()))
    b = task.sample_prompts(np.random.default_rng(0), 4, with_targets=True)
    assert (b.tgt[np.arange(4), b.tgt_len - 1] == task.specials.eos).all()
    mask = (np.arange(b.tgt.shape[1]) < b.tgt_len[:, None]).astype(np.float32)
    _, score = task.rewards(b.src, b.src_len, b.tgt, mask, key=b.key)
    assert np.allclose(score, 1.0)
    spec = task.spec()
    assert spec["tokenizer"] == {"kind": "hf", "path": str(hf_dir)} and spec["vocab"] == {"hf_tokenizer": str(hf_dir)}


def _initial_weights(hf_dir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(hf_dir / "model.safetensors"))


@pytest.mark.parametrize("algo", ["ppo_dynamic", "grpo"])
def test_trains_with_kl_to_the_initial_model_and_a_user_reward(corpus, hf_dir, tmp_path, algo):
    """PPO-dynamic / GRPO on the tiny GPT-2 with a user reward on text and algo.kl_coef: the weights move from
    model.path's, the reward sees decoded text (the prompts of the data), the KL to the frozen initial model is 0 on
    the first update (the reference is the policy then) and the checkpoint's weights are a safetensors file."""
    log = tmp_path / "calls.jsonl"
    cfg = hf_config(corpus, hf_dir, f"algo.name={algo}", "algo.kl_coef=0.05", "train.pretrain_iters=0",
                    "reward.fn=tests.hf_fixtures:logged_text", f"reward.kwargs={{log: '{log}'}}",
                    run_dir=tmp_path / algo)
    summary = Trainer(cfg).run()
    rows = [r for r in pq.read_table(tmp_path / algo / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 3
    assert abs(rows[0]["kl/per_reply"]) < 1e-4 and all(r["kl/coef"] == 0.05 for r in rows)
    assert max(abs(r["kl/per_reply"]) for r in rows[1:]) > 1e-6  # the policy moved away from the reference
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    prompts = {p for s in DialogueData.load(corpus).splits.values() for p in s.prompts}
    assert calls and all(c["prompt"] in prompts and isinstance(c["reply"], str) for c in calls)
    assert not any("Ġ" in c["reply"] or "<eos>" in c["reply"] for c in calls)  # decoded, not token strings
    ck_dir = tmp_path / algo / "checkpoints"
    name = f"ckpt_{summary['iterations']:08d}"
    assert (ck_dir / f"{name}.safetensors").is_file()
    from safetensors.torch import load_file

    saved = load_file(str(ck_dir / f"{name}.safetensors"))
    initial = _initial_weights(hf_dir)
    assert set(saved) == {f"model.{k}" for k in initial if k != "lm_head.weight"}
    assert any(not torch.equal(saved[f"model.{k}"], initial[k]) for k in initial if k != "lm_head.weight")
    ck = load_checkpoint(ck_dir / f"{name}.pt")
    assert all(torch.equal(ck["learner"]["generator"][k], saved[k]) for k in saved)
    assert "test/reward" in summary["metrics"] and "test/bleu2" in summary["metrics"]


def test_resume_reproduces_the_uninterrupted_run(corpus, hf_dir, tmp_path):
    """Interrupted after a checkpoint (during PPO-dynamic), then --resume: the final weights and metrics equal an
    uninterrupted run's (in-process, fixed seed)."""
    common = ["algo.name=ppo_dynamic", "algo.kl_coef=0.05", "train.checkpoint_every=1"]
    full = Trainer(hf_config(corpus, hf_dir, *common, run_dir=tmp_path / "full")).run()

    def stop_at_3(row, trainer):
        if row["iteration"] == 3:  # 2 MLE + 1 PPO-dynamic
            trainer._stop = True

    cfg = hf_config(corpus, hf_dir, *common, run_dir=tmp_path / "cut")
    with pytest.raises(Interrupted):
        Trainer(cfg, report=stop_at_3).run()
    resumed = Trainer(cfg, resume=True).run()
    a, b = (load_checkpoint(s["checkpoint"])["learner"] for s in (full, resumed))
    for k in a["generator"]:
        torch.testing.assert_close(a["generator"][k], b["generator"][k], rtol=0, atol=0, msg=k)
    assert resumed["metrics"] == full["metrics"]


def test_lora_trains_adapters_only(corpus, hf_dir, tmp_path):
    """model.lora_r: the learner publishes and the checkpoint holds the adapters only (safetensors; the base weights
    are model.path's), and the KL reference is the base model (no copy of it in the checkpoint)."""
    cfg = hf_config(corpus, hf_dir, "algo.name=grpo", "algo.kl_coef=0.05", "model.lora_r=4",
                    "model.lora_target_modules=[c_attn]", "algo.lr=0.01", run_dir=tmp_path / "lora")
    from rayseq.distributed.actors.learner import Learner

    published = Learner(cfg).get_weights()["generator"]  # what goes to the rollout workers
    assert published and all("lora_" in k for k in published)
    summary = Trainer(cfg).run()
    ck = load_checkpoint(summary["checkpoint"])
    weights = ck["learner"]["generator"]
    assert weights and all("lora_" in k for k in weights)
    assert any(float(v.abs().sum()) > 0 for k, v in weights.items() if "lora_B" in k)  # B starts at 0: it trained
    assert ck["learner"]["algo"]["ref_policy"] == {}
    rows = [r for r in pq.read_table(tmp_path / "lora" / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert all(r["kl/per_reply"] is not None for r in rows)


def test_mle_pretraining_lowers_the_nll(corpus, hf_dir, tmp_path):
    """MLE on the re-tokenised pairs (teacher-forced log-probs of the references) fits the tiny corpus."""
    cfg = hf_config(corpus, hf_dir, "train.pretrain_iters=25", "train.pretrain_lr=1e-2", "train.iters=0",
                    run_dir=tmp_path / "mle")
    Trainer(cfg).run()
    nll = [r["loss/nll"] for r in pq.read_table(tmp_path / "mle" / "metrics.parquet").to_pylist()
           if r["stage"] == "mle"]
    assert len(nll) == 25 and np.mean(nll[-5:]) < 0.6 * np.mean(nll[:3])



ALGO_EXTRA = {"scheduled_sampling": ["algo.ss_k=2"], "raml": ["algo.raml_pool=8", "algo.raml_samples=2"],
              "erpo_interpolation": ["algo.interp_val_every=1"]}


def _non_adversarial() -> list[str]:
    from rayseq import registry

    return [n for n in registry.ALGORITHMS if n != "mle" and not registry.algorithm_class(n).own_reward
            and not registry.algorithm_class(n).own_task]  # the reward model: tests/hf/test_hf_reward_model.py


@pytest.mark.parametrize("algo", _non_adversarial())
def test_every_non_adversarial_algorithm_updates_the_hf_policy(corpus, hf_dir, tmp_path, algo):
    """No algorithm branches on the architecture: each of them (the SeqGAN family is refused) runs its update on the
    Hugging Face policy through the same phase methods and moves its weights."""
    cfg = hf_config(corpus, hf_dir, f"algo.name={algo}", "train.pretrain_iters=0", "train.iters=2",
                    "train.eval_every=0", "algo.lr=0.01", *ALGO_EXTRA.get(algo, []), run_dir=tmp_path / algo,
                    tiny=[a for a in TINY if not a.startswith("algo.minibatch_size")])
    summary = Trainer(cfg).run()
    final = load_checkpoint(summary["checkpoint"])["learner"]["generator"]
    initial = _initial_weights(hf_dir)
    assert any(not torch.equal(final[f"model.{k}"], initial[k]) for k in initial if k != "lm_head.weight")


def test_rnn_on_a_hugging_face_tokenizer(corpus, hf_dir, tmp_path):
    """The tokenizer replaces the vocabulary through the task (task.hf_tokenizer), not the architecture: rayseq's
    RNN trains on the tokenizer's ids and serves decoded replies."""
    from rayseq.serving.model import ChatModel, GenRequest

    cfg = build_config(None, [*TINY, f"task.data={corpus}", f"task.hf_tokenizer={hf_dir}", "model.emb_dim=8",
                              "model.hidden_dim=16", "algo.name=ppo_dynamic", f"run_dir={tmp_path / 'rnn'}"])
    summary = Trainer(cfg).run()
    assert summary["checkpoint"].endswith(".pt")
    ck = load_checkpoint(summary["checkpoint"])
    assert ck["learner"]["generator"]["embedding.weight"].shape[0] == 400  # the tokenizer's ids
    assert not list((tmp_path / "rnn" / "checkpoints").glob("*.safetensors"))
    model = ChatModel(tmp_path / "rnn")
    res = model.generate([GenRequest("hi there", max_tokens=6)])[0]
    assert "".join(res.pieces[0]) == res.replies[0] and res.unknown_words == []


def test_an_input_longer_than_the_models_positions_keeps_its_last_tokens_and_trains(hf_dir, tmp_path):
    """A prompt longer than the model's 128 positions (its config.json) beside the longest reply: the task keeps its
    last tokens, every sequence fits, and a run trains on it (it failed in the model's position embedding); a model
    too short for the replies themselves is an error naming the lengths."""
    import shutil

    from rayseq.data.preparation import DataError, PrepareOptions, prepare
    from tests.conftest import write_corpus

    src = write_corpus(tmp_path / "pairs.jsonl")
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    long_prompt = " ".join(["tell me about music and movies and books"] * 30)
    rows[0]["input"] = long_prompt
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = tmp_path / "data"
    prepare(f"jsonl:{src}", data, PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.2, seed=0))
    cfg = hf_config(data, hf_dir, "train.iters=2", "train.eval_every=0", run_dir=tmp_path / "run")
    task = make_task(cfg.task)
    assert task.max_src_len + 1 + task.max_tgt_len == 128  # input, separator, reply with its end token
    full = task.vocab.encode_text(long_prompt, 1 << 30)
    assert len(full) > task.max_src_len
    tr = task.train
    (row,) = np.flatnonzero(tr.src_len == task.max_src_len)
    assert np.array_equal(tr.src[row, : tr.src_len[row]], full[-task.max_src_len:])  # its last tokens
    short = tr.src_len < task.max_src_len  # the others as they were encoded
    words = DialogueData.load(data).splits["train"]
    for i in np.flatnonzero(short)[:10]:
        assert task.reply_text(tr.src[i, : tr.src_len[i]]) == words.prompts[i]
    summary = Trainer(cfg).run()
    assert np.isfinite(summary["metrics"]["test/bleu2"])

    small = tmp_path / "small"
    shutil.copytree(hf_dir, small)
    config = json.loads((small / "config.json").read_text())
    config["n_positions"] = 8
    (small / "config.json").write_text(json.dumps(config))
    with pytest.raises(DataError, match=r"reads 8 positions, leaving no room for a prompt.*--fit-model"):
        make_task(hf_config(data, small).task)
