"""benchmarks/chitchat.py's candidates (``--variant``): each starts from the seed's one pretrained model, and the
table has its row, on the test or the validation inputs (``--split``)."""

from __future__ import annotations

import json

import pytest

from benchmarks.chitchat import main, parse_variants
from tests.tasks.test_chitchat import tiny_args


def test_parse_variants_and_its_one_line_errors():
    got = parse_variants([["g4", "algo.name=grpo", "algo.group_size=4"], ["nov", "reward.terms=[{fn: task}]"]],
                         ["grpo"])
    assert got == {"g4": ["algo.name=grpo", "algo.group_size=4"], "nov": ["reward.terms=[{fn: task}]"]}
    assert "a label is" in parse_variants([["grpo", "algo.kl_coef=0"]], ["grpo"])  # an algorithm's row already
    assert "a label is" in parse_variants([["pretrained", "algo.kl_coef=0"]], [])
    assert "a label is" in parse_variants([["a", "x=1"], ["a", "x=2"]], [])
    assert "a label is" in parse_variants([["a/b", "x=1"]], [])
    assert "KEY=VALUE" in parse_variants([["a"]], [])
    assert "KEY=VALUE" in parse_variants([["a", "algo.name"]], [])


@pytest.mark.slow
def test_a_variant_starts_from_the_seeds_pretrained_model_and_has_its_row(corpus, tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("task:\n  name: chitchat\n")
    args = [a for a in tiny_args(corpus) if not a.startswith("algo.name")]
    rc = main(["--config", str(cfg), "--seeds", "0", "--jobs", "1", "--out", str(tmp_path), *args,
               "train.iters=2", "--algos", "grpo", "--variant", "g4", "algo.name=grpo", "algo.group_size=4"])
    assert rc == 0
    runs = tmp_path / "runs" / "chitchat"
    assert sorted(p.name for p in runs.iterdir()) == ["g4-s0", "grpo-s0", "pretrain-s0"]  # one pretraining
    pre = json.loads((runs / "pretrain-s0" / "summary.json").read_text())["metrics"]
    for run, g in (("grpo-s0", 8), ("g4-s0", 4)):
        s = json.loads((runs / run / "summary.json").read_text())
        assert s["algo"] == "grpo" and s["iterations"] > 0
        assert s["pretrain_metrics"] == pre  # the same start: the pretrained model's figures, carried over
        assert f"group_size: {g}" in (runs / run / "config.yaml").read_text()
    table = (tmp_path / "chitchat.md").read_text()
    assert "| g4 |" in table and "| grpo |" in table and "`g4`: `algo.name=grpo algo.group_size=4`" in table
    # BLEU-2's factors, recomputed from each run's last checkpoint, multiply back to the run's own test BLEU-2
    report = json.loads((tmp_path / "chitchat.json").read_text())["runs"]
    for run in ("pretrained", "grpo", "g4"):
        parts, own = report[f"{run}-s0-bleu_parts"], report[f"{run}-s0"]["test/bleu2"]
        assert parts["bleu2"] == pytest.approx(own, abs=1e-9)
        assert parts["bleu2"] == pytest.approx(parts["bp"] * (parts["p1"] * parts["p2"]) ** 0.5, rel=1e-9)
        assert 0 < parts["bp"] <= 1 and parts["reply_words"] > 0
    assert "| grpo | " in table.split("Where the BLEU-2 comes from")[1]
    assert main(["--config", str(cfg), "--seeds", "0", "--out", str(tmp_path), *args, "--algos", "grpo",
                 "--variant", "g4", "algo.name=grpo", "algo.group_size=4", "--split", "val", "--report-only"]) == 0
    val = json.loads((tmp_path / "chitchat_val.json").read_text())
    assert val["split"] == "val" and set(val["runs"]["g4-s0"]) == {k.replace("test/", "val/") for k in
                                                                  json.loads((tmp_path / "chitchat.json").read_text())
                                                                  ["runs"]["g4-s0"]}
