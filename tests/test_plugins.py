"""A user's own algorithm and task from a module outside the package: named by import path,
declaring their own keys, trained through the real Ray path (`python -m rayseq.train`, rollout workers on an
embedded Ray) without any change to rayseq; and what goes wrong is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from rayseq.config import ConfigError, build_config

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = textwrap.dedent('''
    """A toy task and a toy algorithm, outside rayseq."""
    import numpy as np
    import torch
    from pydantic import Field

    from rayseq.algos.reinforce import Reinforce
    from rayseq.rewards import terminal_rewards
    from rayseq.tasks.base import Task
    from rayseq.types import PromptBatch
    from rayseq.vocab import Vocab


    class Echo(Task):
        """Repeat the input's first digit: reward 1 if the reply starts with it."""

        name = "echo"  # reads the held-out sizes: Task.fields, the keys every built-in task reads

        def __init__(self, cfg):
            self.cfg = cfg
            self.vocab = Vocab([str(d) for d in range(10)])
            self.specials = self.vocab.specials
            self.max_src_len, self.max_tgt_len = 3, 2

        def _inputs(self, rng, n):
            src = rng.integers(4, 14, size=(n, 3))
            return src, np.full(n, 3)

        def sample_prompts(self, rng, n, *, with_targets=False):
            src, src_len = self._inputs(rng, n)
            batch = PromptBatch(src, src_len)
            if with_targets:
                batch.tgt, batch.tgt_len = np.stack([src[:, 0], np.full(n, 2)], 1), np.full(n, 2)
            return batch

        def rewards(self, src, src_len, tokens, token_mask, key=None):
            score = (tokens[:, 0] == src[:, 0]).astype(np.float32)
            return terminal_rewards(score, token_mask), score

        @classmethod
        def metric_names(cls, cfg, split):
            return [f"{split}/echo"]

        @torch.no_grad()
        def evaluate(self, generator, device="cpu", *, split="val"):
            n = self.cfg.val_size if split == "val" else self.cfg.test_size
            src, src_len = self._inputs(np.random.default_rng(1 if split == "val" else 2), n)
            out = generator.sample(torch.from_numpy(src), torch.from_numpy(src_len), 2, greedy=True)
            return {f"{split}/echo": float((out.tokens[:, 0].numpy() == src[:, 0]).mean())}, {}


    class ScaledReinforce(Reinforce):
        """REINFORCE whose rewards are multiplied by its own key, algo.reward_scale."""

        name = "scaled_reinforce"
        fields = {**Reinforce.fields,  # the keys the update it inherits reads, and one of its own
                  "reward_scale": (float, Field(1.0, gt=0, description="multiplies the reward"))}

        def update(self, state, rollout, iteration):
            rollout.rewards = rollout.rewards * self.cfg.reward_scale
            return {**super().update(state, rollout, iteration), "toy/reward_scale": self.cfg.reward_scale}


    class Forgetful(Reinforce):
        """Its fields leave out the keys of REINFORCE's update, which it inherits and which reads them."""

        fields = {"reward_scale": (float, Field(1.0, gt=0, description="multiplies the reward"))}


    class OldStyle(Reinforce):
        """Names its keys the way rayseq did before algorithms declared them (``params``)."""

        params = ("gamma",)
''')


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    (tmp_path / "myplugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_config_names_what_is_wrong_with_a_user_class(plugin_dir):
    cfg = build_config(None, ["task.name=myplugin:Echo", "algo.name=myplugin:ScaledReinforce", "algo.reward_scale=2",
                              "task.val_size=50"])
    assert cfg.algo.reward_scale == 2.0 and cfg.task.name == "myplugin:Echo"
    for overrides, named in [
        (["algo.name=nomodule:X"], "module 'nomodule' not found"),
        (["algo.name=myplugin:Missing"], "module 'myplugin' has no attribute 'Missing'"),
        (["algo.name=myplugin:Echo"], "Echo is not an algorithm class"),
        (["task.name=myplugin:ScaledReinforce"], "ScaledReinforce is not a task class"),
        (["algo.name=myplugin:ScaledReinforce", "algo.reward_scale=-1"], "algo.reward_scale: Input should be greater"),
        (["algo.name=ppo", "algo.reward_scale=2"], "algo.reward_scale: unknown key"),
        (["task.name=myplugin:Echo", "task.min_len=2"], "task.min_len: task.name=myplugin:Echo does not read"),
        (["algo.name=myplugin:Forgetful"], "fields leave out gamma, baseline_lr, use_baseline, normalize_advantages, "
                                           "which the code it inherits from Reinforce reads"),
        (["algo.name=myplugin:OldStyle"], "`params` ('gamma',) is no longer read; a class declares its keys in "
                                          "`fields`"),
    ]:
        with pytest.raises(ConfigError) as err:
            build_config(None, overrides)
        assert named in str(err.value), (overrides, str(err.value))


@pytest.mark.ray
def test_user_algorithm_and_task_train_on_ray_actors(plugin_dir):
    """The module sits in the folder the command runs from: the driver and every Ray actor import it."""
    run_dir = plugin_dir / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run(
        [sys.executable, "-m", "rayseq.train", "task.name=myplugin:Echo", "algo.name=myplugin:ScaledReinforce",
         "algo.reward_scale=3", "task.test_size=100", "task.val_size=100", "model.emb_dim=16", "model.hidden_dim=16",
         "train.pretrain_iters=5", "train.iters=4", "train.batch_size=32", "train.pretrain_batch_size=32",
         "train.eval_every=2", "rollout.num_workers=2", "learner.num_cpus=0.5", "progress=false",
         f"run_dir={run_dir}"],
        cwd=plugin_dir, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rollout_workers"] == 2 and {"val/echo", "test/echo"} <= set(summary["metrics"])
    rows = [x for x in pq.read_table(run_dir / "metrics.parquet").to_pylist() if x["stage"] == "train"]
    assert len(rows) == 4 and all(x["toy/reward_scale"] == 3.0 for x in rows)
    assert all(x["rollout/worker_restarts"] == 0 for x in rows)  # the actors imported the module
    assert "reward_scale: 3.0" in (run_dir / "config.yaml").read_text()


def guide_algorithm_example() -> str:
    """The ``# my_algo.py`` block of docs/guides/plugins.md."""
    from tests.doc_examples import code_blocks, page

    (code,) = [b for lang, b in code_blocks(page("docs/guides/plugins.md")) if b.startswith("# my_algo.py")]
    return code


def test_guide_algorithm_example_builds_its_own_module(tmp_path, monkeypatch):
    """The plug-in guide's own algorithm, through the import path: its training_step takes algo.policy_steps sample →
    update steps per iteration (the learner's version grows by that many); the value head it builds is trained by
    its own Adam at algo.head_lr, checkpointed under learner.algo and restored on --resume."""
    (tmp_path / "my_algo.py").write_text(guide_algorithm_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    from rayseq.checkpoint import load_checkpoint
    from rayseq.distributed.driver import Trainer
    from tests.conftest import tiny_config

    def config(iters, run):
        return tiny_config("algo.name=my_algo:HeadReinforce", "algo.head_lr=3e-2", "algo.policy_steps=3",
                           "rollout.num_workers=0", "train.pretrain_iters=2", f"train.iters={iters}",
                           "train.checkpoint_every=1", "train.keep_checkpoints=10", run_dir=tmp_path / run)

    full = Trainer(config(2, "full")).run()
    rows = [r for r in pq.read_table(tmp_path / "full" / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert [r["learner/version"] for r in rows] == [2 + 3, 2 + 6]  # 2 MLE updates, then 3 per iteration
    assert all(r[f"steps/reward_mean_{k}"] >= 0 for r in rows for k in range(3))
    assert all(r["rollout/worker_restarts"] == 0 and r["loss/head"] >= 0 for r in rows)
    algo = load_checkpoint(full["checkpoint"])["learner"]["algo"]
    start = load_checkpoint(str(tmp_path / "full" / "checkpoints" / f"ckpt_{2:08d}.pt"))["learner"]["algo"]
    assert set(algo) == {"head", "head_opt"} and not torch.equal(algo["head"]["weight"], start["head"]["weight"])
    assert algo["head_opt"]["param_groups"][0]["lr"] == 3e-2
    Trainer(config(1, "cut")).run()  # the same run, stopped after one iteration and resumed: the same head
    resumed = Trainer(config(2, "cut"), resume=True).run()
    again = load_checkpoint(resumed["checkpoint"])["learner"]["algo"]
    assert all(torch.equal(algo["head"][k], again["head"][k]) for k in algo["head"])


TASK_WITH_KEYS = textwrap.dedent('''
    from pydantic import Field

    from rayseq.tasks.counting import CountingTask


    class ShortCounting(CountingTask):
        """Counting with a key of its own (a plug-in task declares its task.* keys beside its code)."""

        fields = {**CountingTask.fields,
                  "max_digits": (int, Field(4, ge=1, le=10, description="longest input this task draws"))}
''')


def test_a_task_declares_its_own_keys(tmp_path, monkeypatch):
    """``fields`` on a task class: its task.* key is validated (a bad value named), defaulted, kept in the resolved
    config an actor rebuilds from and printed by --print-config with its value; refused for a task without it."""
    from rayseq.config import RunConfig, config_to_dict

    (tmp_path / "mytask.py").write_text(TASK_WITH_KEYS)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = build_config(None, ["task.name=mytask:ShortCounting", "task.max_digits=6"])
    assert cfg.task.max_digits == 6
    assert build_config(None, ["task.name=mytask:ShortCounting"]).task.max_digits == 4
    again = RunConfig.model_validate(config_to_dict(cfg))  # what every actor does with the driver's dict
    assert again.task.max_digits == 6 and config_to_dict(again) == config_to_dict(cfg)
    with pytest.raises(ConfigError, match="task.max_digits"):
        build_config(None, ["task.name=mytask:ShortCounting", "task.max_digits=0"])
    with pytest.raises(ConfigError, match="max_digits"):
        build_config(None, ["task.name=counting", "task.max_digits=6"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "rayseq.train", "--print-config", "task.name=mytask:ShortCounting",
                        "task.max_digits=7"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "max_digits: 7" in r.stdout
