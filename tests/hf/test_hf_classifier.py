"""reward.fn=hf_classifier: a local Hugging Face sequence classifier's probability of a label, batched, as the
reward of a run (with model.arch=hf, and with rayseq's own RNN on words)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayseq.config import ConfigError, build_config
from rayseq.distributed.driver import Trainer
from rayseq.rewards.hf_classifier import hf_classifier
from tests.hf.test_hf_training import hf_config

REPLIES = ["i am fine , thanks", "good", "not bad at all , and you ?", ""]
PROMPTS = ["hi there", "hello !", "hey , how are you ?", "hi"]


def _direct(classifier_dir, texts, label, pair=None):
    """The classifier on one text at a time (no padding): what the batched reward must equal."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(classifier_dir), local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(str(classifier_dir), local_files_only=True).eval()
    out = []
    for i, t in enumerate(texts):
        enc = tok(*((pair[i], t) if pair else (t,)), return_tensors="pt")
        if enc["input_ids"].shape[1] == 0:  # an empty reply: one pad token, as padding gives it
            enc = {"input_ids": torch.tensor([[tok.pad_token_id]]), "attention_mask": torch.tensor([[1]])}
        with torch.no_grad():
            out.append(float(torch.softmax(model(**enc).logits, -1)[0, label]))
    return np.array(out)


def test_probability_of_the_label_batched(classifier_dir):
    refs = [[] for _ in REPLIES]
    got = hf_classifier(PROMPTS, REPLIES, refs, path=str(classifier_dir), label=1, batch_size=3)
    np.testing.assert_allclose(got, _direct(classifier_dir, REPLIES, 1), atol=1e-5)
    by_name = hf_classifier(PROMPTS, REPLIES, refs, path=str(classifier_dir), label="dull")
    np.testing.assert_allclose(by_name, 1 - got, atol=1e-6)
    pair = hf_classifier(PROMPTS, REPLIES, refs, path=str(classifier_dir), with_prompt=True, batch_size=2)
    np.testing.assert_allclose(pair, _direct(classifier_dir, REPLIES, 1, pair=PROMPTS), atol=1e-5)
    with pytest.raises(ValueError, match="label 'happy' is not one of"):
        hf_classifier(PROMPTS, REPLIES, refs, path=str(classifier_dir), label="happy")


def test_inputs_are_cut_to_the_classifiers_positions(classifier_dir):
    """A reply longer than the classifier's 128 positions is classified on its first 128 tokens by default (the
    model has no position beyond; 512, the old default, raised IndexError deep in the model), as max_length=128
    gives explicitly; a max_length above its positions is refused, naming the key."""
    long = " ".join(["thanks a lot , really"] * 80)  # several hundred tokens
    got = hf_classifier(["hi"], [long], [[]], path=str(classifier_dir))
    assert got == pytest.approx(hf_classifier(["hi"], [long], [[]], path=str(classifier_dir), max_length=128))
    assert 0 < got[0] < 1
    with pytest.raises(ConfigError, match=r"max_length=512: the classifier in .* reads 128 positions"):
        build_config(None, ["task.name=counting", "reward.fn=hf_classifier",
                            f"reward.kwargs={{path: '{classifier_dir}', max_length: 512}}"])


def test_config_checks_the_directory(corpus, classifier_dir, tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        build_config(None, ["task.name=pairs", "reward.fn=hf_classifier", f"reward.kwargs={{path: {tmp_path}/x}}"])
    with pytest.raises(ConfigError, match="path"):
        build_config(None, ["task.name=pairs", "reward.fn=hf_classifier"])
    cfg = build_config(None, ["task.name=pairs", "reward.fn=hf_classifier",
                              f"reward.kwargs={{path: '{classifier_dir}', label: lively}}"])
    assert cfg.uses_reward_config


@pytest.mark.parametrize("arch", ["hf", "rnn"])
def test_trains_on_the_classifier_reward(corpus, hf_dir, classifier_dir, tmp_path, arch):
    """PPO-dynamic on the classifier's probability of "lively": the rollouts' reward is that probability."""
    kwargs = f"reward.kwargs={{path: '{classifier_dir}', label: lively}}"
    common = ["algo.name=ppo_dynamic", "reward.fn=hf_classifier", kwargs]
    if arch == "hf":
        cfg = hf_config(corpus, hf_dir, *common, run_dir=tmp_path / arch)
    else:
        cfg = build_config(None, ["task.name=pairs", f"task.data={corpus}", "task.test_size=100", "task.val_size=10",
                                  "model.emb_dim=8", "model.hidden_dim=16", "train.pretrain_iters=2",
                                  "train.iters=2", "train.batch_size=8", "rollout.num_workers=0", "progress=false",
                                  *common, f"run_dir={tmp_path / arch}"])
    summary = Trainer(cfg).run()
    rows = [r for r in pq.read_table(tmp_path / arch / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert rows and all(0 < r["rollout/reward_mean"] < 1 for r in rows)
    assert 0 < summary["metrics"]["test/reward"] < 1
