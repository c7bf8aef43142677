"""algo.name=reward_model on task.name=preferences through the real train path (rayseq.distributed.driver.Trainer,
what python -m rayseq.train runs): a built-in model with a scalar head learns the preferences to a held-out
accuracy above the trivial baseline's, keeps its best validated model, and two data-parallel learners make the
update of one."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayseq.config import ConfigError, build_config
from rayseq.distributed.driver import Trainer
from tests.reward_fixtures_prefs import preference_rows, write_jsonl

RM = ["task.name=preferences", "algo.name=reward_model", "train.pretrain_iters=0", "rollout.num_workers=0",
      "progress=false", "model.emb_dim=16", "model.hidden_dim=32", "train.batch_size=32", "algo.lr=0.003"]


@pytest.fixture(scope="module")
def prefs(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("prefs") / "prefs.jsonl", preference_rows(300))


@pytest.mark.e2e
@pytest.mark.parametrize("arch", ["rnn", "transformer"])
def test_builtin_reward_model_learns_and_keeps_its_best(prefs, tmp_path, arch):
    cfg = build_config(None, [*RM, f"task.data={prefs}", f"model.arch={arch}", "train.iters=40",
                              "train.eval_every=10", "train.best_metric=val/accuracy", f"run_dir={tmp_path}",
                              "algo.center_rewards_coefficient=0.01"])
    summary = Trainer(cfg).run()
    start, end = summary["pretrain_metrics"], summary["metrics"]
    assert end["test/accuracy"] >= 0.9 > start["test/accuracy"]  # learned, from an untrained head
    assert end["test/accuracy"] > end["test/accuracy_longer"] + 0.3  # far above the trivial baseline (~0.4 here)
    assert end["test/margin"] > start["test/margin"] and end["test/loss"] < start["test/loss"]
    best = json.loads((tmp_path / "best" / "best.json").read_text())
    assert best["metric"] == "val/accuracy" and best["value"] >= end["val/accuracy"] - 1e-9
    logged = pq.read_table(tmp_path / "metrics.parquet").to_pydict()
    losses = [x for x in logged["loss/preference"] if x is not None]
    assert len(losses) == 40 and np.mean(losses[-10:]) < np.mean(losses[:10])


def test_config_errors(prefs):
    with pytest.raises(ConfigError, match="set algo.name=reward_model"):
        build_config(None, ["task.name=preferences", f"task.data={prefs}", "train.pretrain_iters=0"])
    with pytest.raises(ConfigError, match="set task.name=preferences"):
        build_config(None, ["algo.name=reward_model", "train.pretrain_iters=0"])
    with pytest.raises(ConfigError, match="train.pretrain_iters=0"):
        build_config(None, ["task.name=preferences", f"task.data={prefs}", "algo.name=reward_model"])
    with pytest.raises(ConfigError, match="center_rewards_coefficient"):
        build_config(None, [*RM, f"task.data={prefs}", "algo.center_rewards_coefficient=-1"])


def test_task_encodes_pairs_with_eos_and_margins(tmp_path):
    from rayseq.tasks.preferences import PreferencesTask

    rows = [{"prompt": "how was it", "chosen": " it was great", "rejected": " awful", "margin": 1.5}] * 10
    cfg = build_config(None, [*RM, f"task.data={write_jsonl(tmp_path / 'p.jsonl', rows)}",
                              "task.valid_fraction=0.2", "task.test_fraction=0.2"]).task
    task = PreferencesTask(cfg)
    batch = task.sample_preferences(np.random.default_rng(0), 4)
    eos = task.specials.eos
    assert batch.src_len.tolist() == [3] * 4 and batch.chosen_len.tolist() == [3] * 4
    assert batch.rejected_len.tolist() == [1] * 4 and batch.margin.tolist() == [1.5] * 4
    assert (batch.chosen[:, 3] == eos).all() and (batch.rejected[:, 1] == eos).all()
    assert task.vocab.decode(batch.chosen[0]) == ["it", "was", "great"]
    assert len(task.split_batch("val")) == 2 and len(task.split_batch("test")) == 2


@pytest.mark.ray
@pytest.mark.parametrize("strategy", ["replicated", "fsdp", "replicated+micro"])
def test_two_learners_make_the_update_of_one(ray_session, prefs, strategy):
    """Replicated (each rank its half of the pairs, the gradients summed) or sharded (FSDP2: the model and the head
    sharded over the ranks): the update and the evaluation of one learner. ``+micro``: each rank's pairs in
    micro-batches of 6 rows = 3 pairs (8 = 3 + 3 + 2 and 7 = 3 + 3 + 1), against one learner in one pass."""
    strategy, _, micro = strategy.partition("+")
    from rayseq.config import RunConfig, config_to_dict
    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.groups import LearnerGroup
    from rayseq.distributed.groups.manager import ActorManager
    from tests.distributed.test_learner_group import assert_same_metrics, assert_same_tensors

    cfg = build_config(None, [*RM, f"task.data={prefs}", "learner.num_learners=2", "train.batch_size=15",
                              "rollout.num_workers=1", f"learner.strategy={strategy}",
                              "algo.center_rewards_coefficient=0.1", "algo.max_grad_norm=0.5",
                              *(["learner.micro_batch_size=6"] if micro else [])])
    group = LearnerGroup(cfg, manager=ActorManager(ray_session, None), actor_options=[{"num_cpus": 0.5}] * 2)
    d = config_to_dict(cfg)
    one = Learner(RunConfig.model_validate({**d, "learner": {**d["learner"], "num_learners": 1,
                                                             "strategy": "replicated", "micro_batch_size": None}}))
    for learner in (one, group):
        learner.start_stage("train")
    batch = one.task.sample_preferences(np.random.default_rng(0), 15)  # ranks 8 + 7 pairs
    for it in range(2):
        m1, m2 = one.update(batch, it), group.update_batch(batch, it)
        assert_same_metrics(m1, m2, ["loss/preference", "rm/accuracy", "rm/margin", "policy/grad_norm"])
    if strategy == "fsdp":  # the whole weights and Adam moments, gathered from the ranks' halves
        assert_same_tensors(one.whole_state(), group.whole_state(), "state")
    else:
        s1, s2 = one.state_dict(), group.state_dict()
        assert_same_tensors(s1["generator"], s2["generator"], "generator")
        assert_same_tensors(s1["algo"]["rm_head"], s2["algo"]["rm_head"], "rm_head")
    assert one.evaluate("val")[0] == pytest.approx(group.evaluate("val")[0], rel=1e-4)


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["in-process", pytest.param("scorer actors", marks=pytest.mark.ray)])
def test_reward_model_as_a_reward_term_raises_the_gold_reward(prefs, tmp_path, where, request):
    """A built-in reward model trained on the preferences, as reward.terms' first term (weight 1), beside the gold
    reward the preferences came from (weight 0: logged, not optimised): REINFORCE on the RM's reward moves a policy
    that said pleasant and unpleasant things alike to pleasant ones, as the gold reward measures. ``scorer actors``:
    the rewards computed on a ScorerActor, 8 replies a call (reward.batch_size)."""
    actors = ()
    if where == "scorer actors":
        request.getfixturevalue("ray_session")
        actors = ("rollout.num_workers=1", "scorer.num_scorers=1", "reward.batch_size=8")
    from rayseq.data.preparation import PrepareOptions, prepare
    from tests.reward_fixtures_prefs import policy_rows

    rm_run = tmp_path / "rm"
    Trainer(build_config(None, [*RM, f"task.data={prefs}", "train.iters=40", "train.eval_every=40",
                                f"run_dir={rm_run}"])).run()
    data = tmp_path / "policy-data"
    prepare(f"jsonl:{write_jsonl(tmp_path / 'policy.jsonl', policy_rows(preference_rows(300, seed=1)))}", data,
            PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.1, seed=0))
    terms = (f"reward.terms=[{{fn: reward_model, kwargs: {{path: '{rm_run}'}}, name: rm}}, "
             "{fn: 'tests.reward_fixtures_prefs:gold', weight: 0.0, name: gold}]")
    Trainer(build_config(None, [
        "task.name=pairs", f"task.data={data}", "task.test_size=100", "task.val_size=50", "model.emb_dim=16",
        "model.hidden_dim=32", "algo.name=reinforce", "algo.lr=0.003", "train.pretrain_iters=60",
        "train.pretrain_batch_size=32", "train.pretrain_lr=0.01", "train.iters=40", "train.batch_size=32",
        "train.eval_every=40", "rollout.num_workers=0", "progress=false", terms, *actors,
        f"run_dir={tmp_path / 'rl'}"])).run()
    logged = pq.read_table(tmp_path / "rl" / "metrics.parquet").to_pydict()
    gold = [g for s, g in zip(logged["stage"], logged["reward/gold"]) if s == "train" and g is not None]
    rm = [r for s, r in zip(logged["stage"], logged["reward/rm"]) if s == "train" and r is not None]
    assert len(gold) == 40
    assert np.mean(gold[-10:]) > np.mean(gold[:10]) + 0.5  # the gold reward rose (from about 0 to about 1)
    assert np.mean(rm[-10:]) > np.mean(rm[:10])
