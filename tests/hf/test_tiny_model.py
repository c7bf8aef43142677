"""python -m rayseq.data tiny-model: a tiny GPT-2 and a tiny classifier from a prepared dataset, folders that
model.arch=hf and reward.fn=hf_classifier read as they read any save_pretrained folder."""

from __future__ import annotations

import pytest

from rayseq.data.__main__ import main as data_main
from rayseq.data.hf_text import HFVocab
from rayseq.rewards.hf_classifier import hf_classifier


def test_tiny_model_and_classifier_from_a_prepared_dataset(corpus, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    lm, clf = tmp_path / "my-gpt2", tmp_path / "my-sentiment"
    assert data_main(["tiny-model", str(corpus), "--out", str(lm), "--vocab-size", "300"]) == 0
    assert data_main(["tiny-model", str(corpus), "--out", str(clf), "--labels", "NEGATIVE,POSITIVE"]) == 0
    out = capsys.readouterr()
    assert "tiny GPT-2 causal LM, 128 positions" in out.out and "Writing model shards" not in out.err

    vocab = HFVocab(str(lm))  # a pad token other than the end token; <bos> the separator
    assert (vocab.specials.pad, vocab.specials.bos, vocab.specials.eos) == (0, 1, 2) and len(vocab) <= 300
    model = AutoModelForCausalLM.from_pretrained(str(lm), local_files_only=True)
    assert model.config.n_positions == 128 and model.config.vocab_size == len(vocab)
    assert vocab.decode_text(vocab.encode_text("how are you ?", 64)) == "how are you ?"  # learned on its text
    p = hf_classifier(["hi"], ["i am fine , thanks"], [[]], path=str(clf), label="POSITIVE")
    assert 0 < p[0] < 1

    assert data_main(["tiny-model", str(corpus), "--out", str(lm)]) == 2  # not over a folder without --overwrite
    assert "exists and is not empty" in capsys.readouterr().err
    assert data_main(["tiny-model", str(corpus), "--out", str(tmp_path / "x"), "--labels", "ONE"]) == 2
    with pytest.raises(SystemExit):
        data_main(["tiny-model", str(corpus)])  # --out is required
