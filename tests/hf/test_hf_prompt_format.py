"""A policy's prompt format is its own: an exported Hugging Face policy, read the standard way by transformers alone
(``apply_chat_template(messages, add_generation_prompt=True)`` then ``generate``, no rayseq import), answers every
test prompt as rayseq's greedy decoding of the trained policy does: trained on conversations, the chat template's
generation prompt ends the prompt (no separator after it); trained on text prompts, the separator it was trained with
is written into the exported chat template."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from rayseq.checkpoint import load_checkpoint
from rayseq.data import PrepareOptions, prepare
from rayseq.distributed.driver import Trainer
from rayseq.export import main as export_main
from rayseq.export import policy_of
from rayseq.tasks import make_task
from tests.hf.test_hf_training import hf_config
from tests.hf.test_hf_trl import math_jsonl

# MLE only, long enough for the tiny GPT-2 to answer with the data's digits
MLE = ["task.name=pairs", "task.test_size=100", "task.val_size=4", "train.pretrain_iters=80",
       "train.pretrain_batch_size=16", "train.pretrain_lr=0.01", "train.iters=0", "train.eval_every=1000",
       "rollout.num_workers=0", "progress=false"]

# what a user of the exported folder runs: transformers only
STANDARD_WAY = r"""
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, max_new = sys.argv[1], int(sys.argv[2])
conversations = json.loads(sys.stdin.read())
tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
replies = []
for messages in conversations:
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=max_new, do_sample=False)
    replies.append(tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
assert not any(m.startswith("rayseq") for m in sys.modules)
print(json.dumps(replies))
"""


def standard_replies(folder, conversations: list, max_new: int) -> list[str]:
    out = subprocess.run([sys.executable, "-c", STANDARD_WAY, str(folder), str(max_new)],
                         input=json.dumps(conversations), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("conversational", [True, False], ids=["chat-template", "text-prompts"])
def test_exported_policy_answers_the_standard_way(tmp_path, hf_dir, chat_hf_dir, conversational):
    prepare(f"jsonl:{math_jsonl(tmp_path / 'qa.jsonl', conversational, size=(8, 6), replies=True)}", tmp_path / "data",
            PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.4, max_tgt_len=8, seed=0))
    model_dir = chat_hf_dir if conversational else hf_dir
    cfg = hf_config(tmp_path / "data", model_dir, run_dir=tmp_path / "run", tiny=MLE)
    task = make_task(cfg.task)
    assert task.vocab.separator is not conversational
    Trainer(cfg).run()
    generator, vocab = policy_of(load_checkpoint(tmp_path / "run"))
    assert vocab.separator is not conversational and generator.separator is not conversational

    src, src_len, _ = task.split("test")
    with torch.no_grad():
        tokens = generator.greedy(torch.as_tensor(src), torch.as_tensor(src_len), task.max_tgt_len)
    trained = [vocab.decode_text(row) for row in tokens.tolist()]
    conversations = task.prompt_values(task.split_keys("test")) if conversational else \
        [[{"role": "user", "content": vocab.decode_text(src[i, : src_len[i]])}] for i in range(len(src))]
    assert len(conversations) >= 16
    if conversational:  # the template's rendering is the policy's input, generation prompt included
        text = vocab.tokenizer.apply_chat_template(conversations[0], tokenize=False, add_generation_prompt=True)
        assert vocab.encode_text(text, 1 << 30).tolist() == src[0, : src_len[0]].tolist()
        assert text.endswith("<|assistant|> ")

    assert export_main([str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    meta = json.loads((tmp_path / "hf" / "rayseq_export.json").read_text())
    assert (meta["separator_token"] is None) is conversational
    got = standard_replies(tmp_path / "hf", conversations, task.max_tgt_len)
    assert sum(bool(r.strip()) for r in trained) >= 0.9 * len(trained), trained  # training taught it to answer
    assert got == trained


def test_separator_template_renders_the_training_input(hf_dir):
    """The exported template of a separator policy: the last message's text, then the separator token."""
    from transformers import AutoTokenizer

    from rayseq.data.hf_text import HFVocab, separator_chat_template

    vocab = HFVocab(str(hf_dir))
    tok = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    tok.chat_template = separator_chat_template("<bos>")
    ids = tok.apply_chat_template([{"role": "user", "content": "hey, how are you?"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids == vocab.encode_text("hey, how are you?", 64).tolist() + [vocab.specials.bos]
    assert HFVocab.from_spec(vocab.to_spec()).separator and vocab.to_spec() == {"hf_tokenizer": str(hf_dir)}
    assert HFVocab.from_spec({"hf_tokenizer": str(hf_dir), "separator": False}).separator is False
