"""benchmarks/chitchat.py's candidates (``--variant``): each starts from the seed's one pretrained model, and the
table has its row, on the test or the validation inputs (``--split``)."""

from __future__ import annotations

import json

import pytest

from benchmarks.chitchat import EVERYDAY, goal_table, main, parse_variants
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


def test_goal_table_marks_each_criterion_per_seed_and_on_the_mean():
    def run(bleu, d2, unk=0.0):
        return {"test/bleu2": bleu, "test/distinct2": d2, "test/unk_replies": unk}

    same, varied = ["I'm not sure."] * 20, [f"reply {i}" for i in range(20)]
    runs = {"pretrained-s0": run(3.0, 0.05), "pretrained-s1": run(4.0, 0.06),
            "pretrained-s0-everyday": same, "pretrained-s1-everyday": varied,
            # seed 0 meets every criterion (+1.5, 0.06 >= 0.05, 20 distinct); seed 1 none but <unk> (+0.2 ...)
            "a-s0": run(4.5, 0.06), "a-s0-everyday": varied,
            "a-s1": run(4.2, 0.04, unk=0.002), "a-s1-everyday": ["ok …"] * 20}
    table = goal_table(runs, ["a", "missing"], [0, 1])
    rows = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| a |")}
    assert rows["0"] == "| a | 0 | 3.00 → 4.50 (+1.50) ✓ | 0.0500 → 0.0600 ✓ | 0 ✓ | 1 → 20 ✓ | 20 → 0 |"
    # 2 held-out replies (0.002 of 1,000) and 20 everyday ones hold <unk>
    assert rows["1"] == "| a | 1 | 4.00 → 4.20 (+0.20) ✗ | 0.0600 → 0.0400 ✗ | 22 ✗ | 20 → 1 ✗ | 0 → 0 |"
    assert rows["mean"] == ("| a | mean | 3.50 → 4.35 (+0.85) ✗ | 0.0550 → 0.0500 ✗ | 22 ✗ | 10.5 → 10.5 ✗ | "
                            "10.0 → 0.0 |")
    assert "| missing |" not in table and len(EVERYDAY) == 20


def pre_iterations(runs) -> int:
    return json.loads((runs / "pretrain-s0" / "summary.json").read_text())["iterations"]


@pytest.mark.slow
def test_a_variant_starts_from_the_seeds_pretrained_model_and_has_its_row(corpus, tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("task:\n  name: chitchat\n")
    args = [a for a in tiny_args(corpus) if not a.startswith("algo.name")]
    rc = main(["--config", str(cfg), "--seeds", "0", "--jobs", "1", "--out", str(tmp_path), *args,
               "train.iters=2", "--algos", "grpo", "--variant", "g4", "algo.name=grpo", "algo.group_size=4",
               "train.eval_every=1", "train.best_metric=val/bleu2"])  # g4's row: each run's best evaluation
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
    assert "| g4 |" in table and "| grpo |" in table and ("`g4`: `algo.name=grpo algo.group_size=4 train.eval_every=1 "
                                                          "train.best_metric=val/bleu2`") in table
    best = json.loads((runs / "g4-s0" / "summary.json").read_text())["best"]
    assert f"`g4`: each run's best evaluation on the validation inputs (`train.best_metric`), at RL iteration " \
           f"{best['iteration'] - pre_iterations(runs)} (seed 0)" in table
    # BLEU-2's factors, recomputed from the checkpoint each row reports (g4: its best), multiply back to its test BLEU-2
    report = json.loads((tmp_path / "chitchat.json").read_text())["runs"]
    assert report["g4-s0"]["test/bleu2"] == best["metrics"]["test/bleu2"]
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
