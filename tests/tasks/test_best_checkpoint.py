"""train.best_metric / best_mode / best_keep_start: the algorithm stage's best validation evaluation kept in
run_dir/best, its test figures in summary.json, chosen by the rule on the validation figures only."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from rayseq.config import ConfigError, build_config
from rayseq.distributed.driver import Trainer
from rayseq.distributed.driver.best import is_best
from rayseq.tasks import make_task
from tests.tasks.test_chitchat import tiny, tiny_args


def _train(metric="val/bleu2", mode="max", keep=()):
    return SimpleNamespace(best_metric=metric, best_mode=mode, best_keep_start=list(keep))


def test_is_best_by_hand():
    start = {"val/bleu2": 3.0, "val/distinct2": 0.05}
    t = _train(keep=["val/distinct2"])
    assert is_best({"val/bleu2": 1.0, "val/distinct2": 0.05}, None, start, t)  # the first that keeps 0.05 (equal)
    assert not is_best({"val/bleu2": 9.0, "val/distinct2": 0.049}, None, start, t)  # a gain that cost diversity
    best = {"value": 4.0}
    assert is_best({"val/bleu2": 4.5, "val/distinct2": 0.06}, best, start, t)
    assert not is_best({"val/bleu2": 4.0, "val/distinct2": 0.06}, best, start, t)  # a tie keeps the earlier one
    assert not is_best({"val/bleu2": math.nan, "val/distinct2": 0.06}, None, start, t)
    lower = _train(metric="val/nll", mode="min")
    assert is_best({"val/nll": 1.0}, {"value": 2.0}, {}, lower)
    assert not is_best({"val/nll": 3.0}, {"value": 2.0}, {}, lower)
    with pytest.raises(ConfigError, match=r"val/blue2 is not among this task's validation figures \(val/bleu2, "):
        is_best({"val/bleu2": 1.0, "val/distinct2": 0.1}, None, start, _train(metric="val/blue2"))
    with pytest.raises(ConfigError, match="val/distinct3 is not among the start's validation figures"):
        is_best({"val/bleu2": 1.0, "val/distinct3": 0.1}, None, start, _train(keep=["val/distinct3"]))


@pytest.mark.parametrize("extra, message", [
    (["train.best_metric=test/bleu2"], "chosen on validation metrics (val/...), never on test/*"),
    (["train.best_keep_start=[val/distinct2]"], "train.best_keep_start is read only with train.best_metric"),
    (["train.best_metric=val/bleu2", "train.best_keep_start=[test/distinct2]"], "only validation metrics"),
])
def test_bad_best_settings_are_one_line_errors(corpus, extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        build_config(None, [*tiny_args(corpus), *extra])


def test_a_metric_the_task_lacks_stops_at_the_first_evaluation(corpus, tmp_path, capsys):
    """Named at the first evaluation (MLE's), not after the pretraining it would have wasted."""
    from rayseq.train import main

    code = main([*tiny_args(corpus), "rollout.num_workers=0", "train.pretrain_eval_every=5",
                 "train.best_metric=val/blue2", f"run_dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: train.best_metric / train.best_keep_start: val/blue2 is not "
                                            "among this task's validation figures (val/bleu2, "), err
    assert not list((tmp_path / "r").glob("checkpoints/*.pt"))  # stopped at iteration 5, before any checkpoint


@pytest.mark.ray
def test_best_evaluation_kept_on_ray_with_its_test_figures_and_resumed(corpus, tmp_path, ray_session):
    """RL on 2 Ray rollout workers from a pretrained run, evaluated every 2 iterations: run_dir/best holds the
    evaluation the rule picks from metrics.parquet's own validation rows (highest val/bleu2 among the start and the
    evaluations keeping the start's val/distinct2), its test figures are the best checkpoint's own, it serves; and
    a resumed, longer run keeps choosing over both parts."""
    from rayseq.serving.model import ChatModel
    from rayseq.train import main

    pre = Trainer(tiny(corpus, "rollout.num_workers=0", "train.pretrain_iters=5", "train.iters=0",
                       f"run_dir={tmp_path / 'pre'}")).run()
    rl = tmp_path / "rl"
    args = [*tiny_args(corpus), "rollout.num_workers=2", "train.iters=6", "train.eval_every=2", "algo.lr=1e-2",
            "train.best_metric=val/bleu2", "train.best_keep_start=[val/distinct2]",
            f"train.init_from={tmp_path / 'pre'}", f"run_dir={rl}"]
    assert main(args) == 0
    for iters in (6, 10):
        summary = json.loads((rl / "summary.json").read_text())
        start = summary["pretrain_metrics"]
        evals = [r for r in pq.read_table(rl / "metrics.parquet").to_pylist()
                 if r["stage"] == "train" and r.get("val/bleu2") is not None]
        assert len(evals) == iters // 2
        ok = [r for r in evals if r["val/distinct2"] >= start["val/distinct2"]]
        assert ok, "no evaluation kept the start's distinct-2: pick another seed for this test"
        first = {"iteration": pre["iterations"], **start}  # the start is the first candidate
        chosen = max([first, *ok], key=lambda r: (r["val/bleu2"], -r["iteration"]))  # a tie: the earlier
        assert chosen is not first, "the start stayed the best: pick another seed for this test"
        if iters == 6:  # the best's test figures come from reloading it, not from the final model
            assert chosen["iteration"] < summary["iterations"], "the final evaluation was the best: another seed"
        best = summary["best"]
        assert best["iteration"] == chosen["iteration"] and best["value"] == chosen["val/bleu2"]
        assert best["metrics"]["val/distinct2"] == chosen["val/distinct2"]
        assert json.loads((rl / "best" / "best.json").read_text()) == {k: v for k, v in best.items() if k != "details"}
        assert best["details"].keys() == summary["details"].keys()  # the best model's replies, as the final's
        model = ChatModel(rl / "best")  # what serve --checkpoint RUN/best loads
        assert model.checkpoint.endswith(f"ckpt_{best['iteration']:08d}.pt")
        cfg = tiny(corpus)  # the best checkpoint's own test figures, computed here
        test, _ = make_task(cfg.task, cfg.reward).evaluate(model.generator, split="test")
        assert test["test/bleu2"] == pytest.approx(best["metrics"]["test/bleu2"], abs=1e-9)
        if iters == 6:
            assert main([f"run_dir={rl}", "--resume", "train.iters=10", "rollout.num_workers=0"]) == 0


def test_the_start_stays_the_best_when_no_evaluation_beats_it(corpus, tmp_path):
    """An algorithm stage that does not move the model (a learning rate of 1e-12): every evaluation ties the start,
    so RUN/best is the start, the pretrained weights, with the pretrained model's own test figures."""
    import torch

    from rayseq.checkpoint import load_checkpoint

    pre = Trainer(tiny(corpus, "rollout.num_workers=0", "train.pretrain_iters=15", "train.iters=0",
                       f"run_dir={tmp_path / 'pre'}")).run()
    summary = Trainer(tiny(corpus, "rollout.num_workers=0", "train.iters=4", "train.eval_every=2", "algo.lr=1e-12",
                           "train.best_metric=val/bleu2", f"train.init_from={tmp_path / 'pre'}",
                           f"run_dir={tmp_path / 'rl'}")).run()
    best = summary["best"]
    assert best["iteration"] == pre["iterations"] and best["value"] == pre["pretrain_metrics"]["val/bleu2"]
    assert best["metrics"]["test/bleu2"] == pre["pretrain_metrics"]["test/bleu2"]
    ours, theirs = (load_checkpoint(p)["learner"]["generator"] for p in (tmp_path / "rl" / "best", tmp_path / "pre"))
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
