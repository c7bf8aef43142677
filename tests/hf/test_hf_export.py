"""python -m rayseq.export for model.arch=hf: a folder AutoModelForCausalLM.from_pretrained loads with the trained
policy's logits (full fine-tuning; LoRA with the adapters merged, or the adapters alone on the base model), the
tokenizer and its chat template beside it."""

from __future__ import annotations

import json

import pytest
import torch

from rayseq.checkpoint import load_checkpoint
from rayseq.distributed.driver import Trainer
from rayseq.export import main as export_main
from rayseq.export import policy_of
from tests.hf.test_hf_training import hf_config


def ids_batch(generator, vocab):
    """Prompt, separator and a reply as rayseq's policy reads them (one row)."""
    prompt = vocab.encode_text("hey, how are you?", 64).tolist()
    return torch.tensor([prompt + [vocab.specials.bos] + vocab.encode_text("fine, thanks", 64).tolist()])


@pytest.mark.parametrize("lora_r", [0, 4])
def test_exported_folder_has_the_trained_logits(corpus, hf_dir, tmp_path, lora_r):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "run"
    Trainer(hf_config(corpus, hf_dir, "algo.name=grpo", "algo.group_size=4", "train.pretrain_iters=0",
                      f"model.lora_r={lora_r}", "algo.lr=0.01", run_dir=run)).run()
    generator, vocab = policy_of(load_checkpoint(run))
    ids = ids_batch(generator, vocab)
    with torch.no_grad():
        want = generator.model(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(str(hf_dir), local_files_only=True)(input_ids=ids).logits
    assert not torch.allclose(want, base, atol=1e-4)  # training moved it
    assert export_main([str(run), "--out", str(tmp_path / "hf")]) == 0
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    with torch.no_grad():
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    assert tok("hey, how are you?")["input_ids"] == vocab.tokenizer("hey, how are you?")["input_ids"]
    meta = json.loads((tmp_path / "hf" / "rayseq_export.json").read_text())
    assert meta["separator_token_id"] == vocab.specials.bos and meta["lora"] == ("merged" if lora_r else None)
    if lora_r:  # the adapters alone, on the base model with peft
        from peft import PeftModel

        assert not any("lora" in k for k in model.state_dict())  # merged: a plain GPT-2
        assert export_main([str(run), "--out", str(tmp_path / "adapters"), "--lora", "adapters"]) == 0
        base_model = AutoModelForCausalLM.from_pretrained(str(hf_dir), local_files_only=True)
        with torch.no_grad():
            got = PeftModel.from_pretrained(base_model, str(tmp_path / "adapters"))(input_ids=ids).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
