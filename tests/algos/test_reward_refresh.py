"""reward.refresh: a reward-model term retrained online from Bradley–Terry pairs of the policy's own replies
(rayseq/algos/reward_refresh.py). The pairs of a group by hand (ties dropped, Bradley–Terry sampling), one refresh
update by hand on a 2-pair batch (the loss, the accuracy and Adam's first step), the config's refusals, and runs:
in-process through the real train path (the reward model's accuracy on gold-labelled pairs of the policy's replies
rises; a resumed run continues with the refreshed weights) and on Ray actors (the scorers' weights equal the
learner's after each refresh)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayseq.algos.reward_refresh import RewardRefresh, preference_pairs
from rayseq.checkpoint import load_checkpoint
from rayseq.config import ConfigError, build_config
from rayseq.distributed.driver import Interrupted, Trainer
from rayseq.tasks import make_task
from rayseq.types import Rollout
from tests.reward_fixtures_prefs import policy_rows, preference_rows, write_jsonl

GOLD = "tests.reward_fixtures_prefs:gold"
RM = ["task.name=preferences", "algo.name=reward_model", "train.pretrain_iters=0", "rollout.num_workers=0",
      "progress=false", "model.emb_dim=16", "model.hidden_dim=32", "train.batch_size=32", "algo.lr=0.003"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(a reward model trained for one iteration only: far from the gold reward's ranking, the policy's data)."""
    from rayseq.data.preparation import PrepareOptions, prepare

    tmp = tmp_path_factory.mktemp("refresh")
    prefs = write_jsonl(tmp / "prefs.jsonl", preference_rows(300))
    Trainer(build_config(None, [*RM, f"task.data={prefs}", "train.iters=1", "train.eval_every=1",
                                f"run_dir={tmp / 'rm'}"])).run()
    data = tmp / "policy-data"
    prepare(f"jsonl:{write_jsonl(tmp / 'policy.jsonl', policy_rows(preference_rows(300, seed=1)))}", data,
            PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.1, seed=0))
    return tmp / "rm", data


def policy_config(runs, *overrides, refresh: str = "", run_dir=None):
    """REINFORCE on the reward model's reward (its term refreshed with ``refresh``'s keys), the gold reward logged."""
    rm, data = runs
    terms = (f"reward.terms=[{{fn: reward_model, kwargs: {{path: '{rm}'}}, name: rm, refresh: {{labeller: '{GOLD}'"
             f"{', ' + refresh if refresh else ''}}}}}, {{fn: '{GOLD}', weight: 0.0, name: gold}}]")
    return build_config(None, [
        "task.name=pairs", f"task.data={data}", "task.test_size=100", "task.val_size=50", "model.emb_dim=16",
        "model.hidden_dim=32", "algo.name=reinforce", "algo.lr=0.003", "train.pretrain_iters=60",
        "train.pretrain_batch_size=32", "train.pretrain_lr=0.01", "train.batch_size=32", "rollout.num_workers=0",
        "progress=false", terms, *overrides, *([f"run_dir={run_dir}"] if run_dir else [])])


def test_pairs_of_a_group_by_hand():
    # two groups of G = 3: scores (1, 0, 1) -> (0 ≻ 1), (0, 2) a tie dropped, (2 ≻ 1);
    #                       (−1, 2, 0.5) -> (4 ≻ 3), (5 ≻ 3), (4 ≻ 5)
    chosen, rejected = preference_pairs(np.array([1.0, 0.0, 1.0, -1.0, 2.0, 0.5]), 3)
    assert chosen.tolist() == [0, 2, 4, 5, 4] and rejected.tolist() == [1, 1, 3, 3, 5]
    assert [len(p) for p in preference_pairs(np.zeros(4), 2)] == [0, 0]  # every reply tied: no pairs
    with pytest.raises(ValueError, match="5 replies are not groups of 2"):
        preference_pairs(np.zeros(5), 2)


def test_bradley_terry_sampled_pairs_follow_sigmoid_of_the_score_gap():
    # s = (1, 0), τ = 0.5: y_0 is preferred with probability σ(1 / 0.5) = σ(2) = 0.8808
    rng = np.random.default_rng(0)
    firsts = [preference_pairs(np.array([1.0, 0.0]), 2, 0.5, rng)[0][0] == 0 for _ in range(20000)]
    assert np.mean(firsts) == pytest.approx(1 / (1 + np.exp(-2.0)), abs=0.01)
    ties = preference_pairs(np.array([3.0, 3.0]), 2, 0.5, rng)
    assert len(ties[0]) == 0  # a tie is dropped under sampling too


def _rollout(task, replies: list[str]) -> Rollout:
    """Two groups of two replies: rows 0-1 answer prompt 0, rows 2-3 prompt 1 (policy ids, <eos> ended)."""
    prompts = task.sample_prompts(np.random.default_rng(0), 2).repeat(2)
    eos, pad = task.specials.eos, task.specials.pad
    ids = [[*task.vocab.encode(r.split()).tolist(), eos] for r in replies]
    tokens = np.full((4, max(map(len, ids))), pad, dtype=np.int64)
    mask = np.zeros(tokens.shape, dtype=np.float32)
    for i, row in enumerate(ids):
        tokens[i, : len(row)], mask[i, : len(row)] = row, 1.0
    zeros = np.zeros(tokens.shape, dtype=np.float32)
    return Rollout(src=prompts.src, src_len=prompts.src_len, tokens=tokens, token_mask=mask, action_mask=mask,
                   logp=zeros, rewards=zeros, score=np.zeros(4, dtype=np.float32), key=prompts.key)


def test_one_refresh_update_by_hand_on_two_pairs(runs):
    from rayseq.rewards.trained import scorer_device, scorer_of

    lr = 0.01
    cfg = policy_config(runs, refresh=f"group_size: 2, prompts: 2, steps: 1, batch_size: 2, lr: {lr}")
    task = make_task(cfg.task, cfg.reward)
    refresh = RewardRefresh(cfg.reward.refreshed, task, torch.device("cpu"), cfg.seed)
    # gold: group 0 (+1, −1) -> pair (0 ≻ 1); group 1 (−1, +1) -> pair (3 ≻ 2)
    rollout = _rollout(task, ["it was great", "it was awful", "it was boring", "it was lovely"])
    prompts, replies = refresh.labeller.texts(rollout.src, rollout.src_len, rollout.tokens, rollout.token_mask,
                                              rollout.key)
    encoded = refresh.model.encode_pairs(prompts, replies)
    params = [*refresh.model.generator.parameters(), *refresh.model.head.parameters()]
    r = refresh.model.rewards(encoded).float()
    # L = −½ [log σ(r_0 − r_1) + log σ(r_3 − r_2)]
    loss = -0.5 * (torch.log(torch.sigmoid(r[0] - r[1])) + torch.log(torch.sigmoid(r[3] - r[2])))
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    before = [p.detach().clone() for p in params]
    accuracy = ((r[0] > r[1]).float() + (r[3] > r[2]).float()).item() / 2

    m = refresh.update(rollout)

    assert m["reward_model/pairs"] == 2 and m["reward_model/version"] == 1
    assert m["reward_model/refresh_loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert m["reward_model/refresh_accuracy"] == accuracy
    # Adam's first step: m̂ = g, v̂ = g², so θ ← θ − lr · g / (|g| + ε), ε = 1e-8 (0 where g = 0): a step of ±lr
    # wherever |g| ≫ ε (within 0.1 % of lr where |g| is near ε: there the step follows g's last bits, summed in
    # another order by the batched loss)
    for p, b, g in zip(params, before, grads):
        g = torch.zeros_like(b) if g is None else g
        torch.testing.assert_close(p.detach(), b - lr * g / (g.abs() + 1e-8), rtol=0, atol=1e-3 * lr)
        big = g.abs() > 1e-3  # the step is lr · (1 − 1e-5) or closer to lr
        torch.testing.assert_close((b - p.detach())[big], lr * g.sign()[big], rtol=1e-4, atol=0)
    assert any(not torch.equal(p.detach(), b) for p, b in zip(params, before))
    # this process scores with the refreshed weights (in-process runs: the scorers' copy)
    held = scorer_of(cfg.reward.refreshed.kwargs["path"], scorer_device()).weights()
    for part, state in refresh.weights().items():
        for k, v in state.items():
            torch.testing.assert_close(held[part][k], v, rtol=0, atol=0)


def test_a_fixed_preference_file_mixed_into_each_step(runs, tmp_path):
    rows = preference_rows(3, seed=5)
    prefs = write_jsonl(tmp_path / "fixed.jsonl", rows)
    rollout_replies = ["it was great", "it was awful", "it was boring", "it was lovely"]  # 2 fresh pairs
    # mix = 1: every pair of the step is the file's (its 3 rows): L = −(1/3) Σ_k log σ(r(x_k, y⁺_k) − r(x_k, y⁻_k))
    cfg = policy_config(runs, refresh=f"group_size: 2, prompts: 2, batch_size: 3, preferences: '{prefs}', mix: 1.0")
    task = make_task(cfg.task, cfg.reward)
    refresh = RewardRefresh(cfg.reward.refreshed, task, torch.device("cpu"), cfg.seed)
    prompts = [r["prompt"] for r in rows]
    with torch.no_grad():
        pos = refresh.model.rewards(refresh.model.encode_pairs(prompts, [r["chosen"] for r in rows]))
        neg = refresh.model.rewards(refresh.model.encode_pairs(prompts, [r["rejected"] for r in rows]))
    m = refresh.update(_rollout(task, rollout_replies))
    assert m["reward_model/fixed_pairs"] == 3 and m["reward_model/pairs"] == 2
    assert m["reward_model/refresh_loss"] == pytest.approx(-torch.log(torch.sigmoid(pos - neg)).mean().item(),
                                                           rel=1e-5)
    # the default mix (0.5) of 4 pairs a step: 2 of the file's, 2 fresh
    cfg = policy_config(runs, refresh=f"group_size: 2, prompts: 2, batch_size: 4, preferences: '{prefs}'")
    refresh = RewardRefresh(cfg.reward.refreshed, task, torch.device("cpu"), cfg.seed)
    assert refresh.update(_rollout(task, rollout_replies))["reward_model/fixed_pairs"] == 2


def test_config_refusals(runs):
    rm, data = runs
    pairs = ["task.name=pairs", f"task.data={data}", "algo.name=reinforce"]
    with pytest.raises(ConfigError, match=r"only a reward-model term \(fn: reward_model\) can be refreshed, not fn: "
                                          "bleu"):
        build_config(None, [*pairs, "reward.fn=bleu", f"reward.refresh={{labeller: '{GOLD}'}}"])
    with pytest.raises(ConfigError, match="labeller: .*no_such_fn"):
        build_config(None, [*pairs, "reward.fn=reward_model", f"reward.kwargs={{path: '{rm}'}}",
                            "reward.refresh={labeller: 'tests.reward_fixtures_prefs:no_such_fn'}"])
    with pytest.raises(ConfigError, match="group_size"):
        policy_config(runs, refresh="group_size: 1")
    with pytest.raises(ConfigError, match="evry"):
        policy_config(runs, refresh="evry: 2")
    with pytest.raises(ConfigError, match="mix: the fraction of pairs drawn from a fixed preference file; set "
                                          "preferences too"):
        policy_config(runs, refresh="mix: 0.3")
    with pytest.raises(ConfigError, match="preferences=nowhere.jsonl: no such file or folder"):
        policy_config(runs, refresh="preferences: nowhere.jsonl")
    with pytest.raises(ConfigError, match="rollout.max_staleness=0"):
        policy_config(runs, "algo.name=ppo", "rollout.max_staleness=1")
    with pytest.raises(ConfigError, match="scorer.num_scorers >= 1"):
        policy_config(runs, "rollout.num_workers=1", "scorer.num_scorers=0")
    with pytest.raises(ConfigError, match="algo.name=mle does not learn from the configured reward"):
        policy_config(runs, "algo.name=mle")
    # reward.fn with its own refresh resolves to one refreshed term
    cfg = build_config(None, [*pairs, "reward.fn=reward_model", f"reward.kwargs={{path: '{rm}'}}",
                              f"reward.refresh={{labeller: '{GOLD}', every: 3}}"])
    assert cfg.reward.refreshed.refresh.every == 3 and cfg.reward.refreshed.fn == "reward_model"


def _refresh_metrics(run_dir, name: str) -> list[float]:
    logged = pq.read_table(run_dir / "metrics.parquet").to_pydict()
    return [v for s, v in zip(logged["stage"], logged[name]) if s == "train" and v is not None]


@pytest.mark.e2e
def test_refreshed_reward_model_ranks_the_policys_replies_better(runs, tmp_path):
    """In-process through the real train path: the reward model (one iteration of training) ranks gold-labelled pairs
    of the policy's fresh replies better refresh after refresh, every second iteration; the last checkpoint holds
    the refreshed weights."""
    cfg = policy_config(runs, "train.iters=24", "train.eval_every=24",
                        refresh="every: 2, prompts: 16, group_size: 4, steps: 2, lr: 0.003", run_dir=tmp_path)
    summary = Trainer(cfg).run()
    accuracy = _refresh_metrics(tmp_path, "reward_model/refresh_accuracy")
    loss = _refresh_metrics(tmp_path, "reward_model/refresh_loss")
    assert len(accuracy) == 12 and _refresh_metrics(tmp_path, "reward_model/version") == list(range(1, 13))
    assert np.mean(accuracy[-4:]) > np.mean(accuracy[:4]) + 0.05
    assert np.mean(loss[-4:]) < np.mean(loss[:4]) - 0.1
    state = load_checkpoint(summary["checkpoint"])["learner"]["reward_refresh"]
    assert state["version"] == 12


@pytest.mark.e2e
def test_resumed_run_continues_with_the_refreshed_reward_model(runs, tmp_path):
    """Interrupted after a checkpoint, then resumed: the reward model's weights and every logged figure equal an
    uninterrupted run's (in-process, fixed seed)."""
    common = ("train.iters=6", "train.eval_every=6", "train.checkpoint_every=2")
    refresh = "prompts: 8, group_size: 4, steps: 2, lr: 0.003"
    full = Trainer(policy_config(runs, *common, refresh=refresh, run_dir=tmp_path / "full")).run()

    def stop_after_64(row, trainer):
        if row["iteration"] == 64:  # 60 MLE + 4 train iterations: 4 refreshes, checkpointed
            trainer._stop = True

    cfg = policy_config(runs, *common, refresh=refresh, run_dir=tmp_path / "cut")
    with pytest.raises(Interrupted):
        Trainer(cfg, report=stop_after_64).run()
    resumed = Trainer(cfg, resume=True).run()
    a, b = (load_checkpoint(s["checkpoint"])["learner"]["reward_refresh"] for s in (full, resumed))
    assert a["version"] == b["version"] == 6
    for part in ("generator", "head"):
        for k in a[part]:
            torch.testing.assert_close(a[part][k], b[part][k], rtol=0, atol=0, msg=f"{part}.{k}")
    for name in ("reward_model/refresh_accuracy", "reward_model/refresh_loss", "reward/rm", "reward/gold"):
        assert _refresh_metrics(tmp_path / "cut", name) == _refresh_metrics(tmp_path / "full", name), name


@pytest.mark.ray
@pytest.mark.slow
def test_on_ray_the_scorers_score_with_the_learners_refreshed_weights(runs, ray_session, tmp_path):
    """A rollout worker, a scorer actor and a learner actor, from a policy pretrained in-process: after each refresh
    the scorer's reward model equals the learner's (its version new to it), and the reward model's accuracy on the
    gold-labelled pairs of the policy's fresh replies rises over the refreshes."""
    from rayseq.algos import make_algo
    from rayseq.algos.iteration import Step
    from rayseq.algos.reward_refresh import refresh_step
    from rayseq.distributed.groups import ActorGroups

    refresh = "prompts: 16, group_size: 4, steps: 2, lr: 0.003"
    Trainer(policy_config(runs, "train.iters=0", refresh=refresh, run_dir=tmp_path / "pre")).run()
    cfg = policy_config(runs, "train.iters=10", "rollout.num_workers=1", "scorer.num_scorers=1", refresh=refresh,
                        run_dir=tmp_path / "ray")
    trainer = Trainer(cfg)
    groups = ActorGroups(cfg)
    try:
        groups.learner.init_from(str(tmp_path / "pre"))
        groups.learner.start_stage("train")
        algo = make_algo(cfg.algo, cfg.seed)
        accuracy = []
        for i in range(cfg.train.iters):
            step = Step(cfg=cfg, task=trainer.task, rng=trainer.rng, stage_iter=i, n_iters=cfg.train.iters,
                        iteration=i, batch_size=cfg.train.batch_size, carry=trainer.carry)
            m = algo.training_step(groups, step)
            assert np.isfinite(m["reward/rm"])  # the batch scored on the scorer by the reward model
            m = refresh_step(groups, step)
            accuracy.append(m["reward_model/refresh_accuracy"])
            learner = groups.learner.state_dict()["reward_refresh"]
            scorer = ray_session.get(groups.scorer.actors[0].reward_model_weights.remote())
            assert learner["version"] == i + 1 == ray_session.get(groups.scorer.actors[0].stats.remote())[
                "weights_version"]
            for part in ("generator", "head"):
                for k, v in learner[part].items():
                    torch.testing.assert_close(scorer[part][k], v.cpu(), rtol=0, atol=0, msg=f"{part}.{k}")
    finally:
        groups.shutdown()
    assert np.mean(accuracy[-3:]) > np.mean(accuracy[:3])
