"""A reward model on a Hugging Face policy (model.arch=hf, the tiny local GPT-2): trained from TRL-shaped data in
both formats through the real train path, exported as a folder AutoModelForSequenceClassification loads whose
logits are the trained model's rewards (chosen above rejected), and scored as reward.fn=reward_model with the same
numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rayseq.config import build_config
from rayseq.distributed.driver import Trainer
from rayseq.export import main as export_main
from rayseq.models.reward_head import InputError
from rayseq.rewards.hf_classifier import reward_model
from rayseq.rewards.trained import load_scorer
from tests.reward_fixtures_prefs import conversational, preference_rows, words, write_jsonl

RM = ["task.name=preferences", "algo.name=reward_model", "train.pretrain_iters=0", "rollout.num_workers=0",
      "progress=false", "train.batch_size=16", "algo.lr=0.001", "train.iters=30", "train.eval_every=10",
      "train.best_metric=val/accuracy", "model.arch=hf"]


@pytest.fixture(scope="module")
def rm_hf_dir(tmp_path_factory):
    """The tiny GPT-2 with the preference data's words in its tokenizer and a chat template."""
    from tests.hf.conftest import CHAT_TEMPLATE
    from tests.hf_fixtures import make_tiny_hf, with_chat_template

    d = tmp_path_factory.mktemp("rmhf")
    return with_chat_template(make_tiny_hf(d / "tiny", extra_lines=words() * 5), d / "tiny-chat", CHAT_TEMPLATE)


def train(data, model_dir, run, *extra):
    return Trainer(build_config(None, [*RM, f"task.data={data}", f"model.path={model_dir}", f"run_dir={run}",
                                       *extra])).run()


@pytest.mark.e2e
@pytest.mark.parametrize("fmt, lora", [("standard", 0), ("conversational", 4)])
def test_trains_exports_and_scores(rm_hf_dir, tmp_path, fmt, lora):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rows = preference_rows(200)
    data = write_jsonl(tmp_path / "prefs.jsonl", conversational(rows) if fmt == "conversational" else rows)
    summary = train(data, rm_hf_dir, tmp_path / "run", f"model.lora_r={lora}",
                    *(("algo.lr=0.01",) if lora else ()))
    end = summary["metrics"]
    assert end["test/accuracy"] >= 0.9 and end["test/accuracy"] > end["test/accuracy_longer"] + 0.3
    assert summary["pretrain_metrics"]["test/accuracy"] < end["test/accuracy"]

    out = tmp_path / "rm"
    assert export_main([str(tmp_path / "run" / "best"), "--out", str(out)]) == 0
    model = AutoModelForSequenceClassification.from_pretrained(str(out), local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert model.config.num_labels == 1
    assert json.loads((out / "rayseq_export.json").read_text())["format"] == "rayseq-hf-reward-model-v1"
    held_out = preference_rows(20, seed=7)
    render = (lambda p: tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                add_generation_prompt=True)) if fmt == "conversational" else str
    prompts = [render(r["prompt"]) for r in held_out]
    replies = [r["chosen"] if fmt == "standard" else r["chosen"].strip() for r in held_out] + \
              [r["rejected"] if fmt == "standard" else r["rejected"].strip() for r in held_out]

    def logit(p, r):
        ids = tok(p, add_special_tokens=False)["input_ids"] + tok(r, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            return float(model(input_ids=torch.tensor([ids])).logits[0, 0])

    got = np.array([logit(p, r) for p, r in zip(prompts * 2, replies)])
    assert (got[:20] > got[20:]).mean() >= 0.9  # transformers scores chosen above rejected
    # the run's own model (as /get_reward serves it) gives the same numbers, and so does reward.fn=reward_model,
    # batched with padding
    scorer = load_scorer(tmp_path / "run" / "best")
    torch.testing.assert_close(torch.tensor(scorer.score([p + r for p, r in zip(prompts * 2, replies)],
                                                         prompts * 2)), torch.tensor(got).float(),
                               atol=1e-4, rtol=1e-4)
    fn = reward_model(prompts * 2, replies, [[]] * 40, path=str(out), batch_size=16)
    np.testing.assert_allclose(fn, got, atol=1e-4, rtol=1e-4)


def test_reward_model_function_errors(classifier_dir, tmp_path):
    from rayseq import registry

    with pytest.raises(ValueError, match="2 outputs; a reward model has one"):
        reward_model(["a"], ["b"], [[]], path=str(classifier_dir))
    with pytest.raises(ValueError, match="no such directory"):
        registry.reward_function("reward_model", {"path": str(tmp_path / "nowhere")})


def test_scorer_refuses_what_it_cannot_score(rm_hf_dir, tmp_path):
    data = write_jsonl(tmp_path / "prefs.jsonl", preference_rows(40))
    train(data, rm_hf_dir, tmp_path / "run", "train.iters=1", "train.eval_every=1")
    scorer = load_scorer(tmp_path / "run")
    with pytest.raises(InputError, match="no tokens"):
        scorer.score([""])
    with pytest.raises(InputError, match="prompts has 1 items for 2"):
        scorer.score(["a", "b"], ["a"])
    a, b = scorer.score(["how was your day it was great"]), scorer.score(["how was your day", "x"],
                                                                            ["how was your", None])
    assert len(a) == 1 and len(b) == 2
