"""SeqGAN (Yu et al. 2017) and its PPO variants: the generator objective by hand, the rollout policy's
moving average, d-steps, the oracle task, resume with the discriminator's state, init_from, and the
whole loop on Ray with scorer actors."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from rayseq.algos import make_algo
from rayseq.algos.seqgan import SEQGAN_DYNAMIC_BOUNDS, mc_continuations, score_continuations
from rayseq.checkpoint import load_checkpoint
from rayseq.config import ConfigError, RunConfig, build_config, config_to_dict
from rayseq.distributed.actors.learner import Learner
from rayseq.distributed.actors.worker import RolloutWorker
from rayseq.distributed.driver import Interrupted, Trainer
from rayseq.tasks.oracle import OFFSET, OracleLSTM, OracleTask
from rayseq.types import RolloutRequest
from tests.conftest import tiny_config

# SeqGAN's published oracle (shared/data beside the repository, or where RAYSEQ_SEQGAN_ORACLE says)
SEQGAN_ORACLE = Path(os.environ.get("RAYSEQ_SEQGAN_ORACLE",
                                    Path(__file__).resolve().parents[3] / "shared" / "data" / "seqgan_oracle.npz"))

# a small random oracle: vocabulary 60, length 6 (the paper's is 5000 and 20)
ORACLE = [
    "task.name=oracle", "task.vocab_size=60", "task.oracle_hidden=8", "task.seq_len=6", "task.num_train=300",
    "task.test_size=100", "task.eval_samples=200", "model.cell=lstm", "model.emb_dim=8", "model.hidden_dim=16",
    "train.pretrain_iters=10", "train.pretrain_batch_size=32", "train.pretrain_lr=1e-2", "train.iters=4",
    "train.batch_size=16", "train.eval_every=2", "progress=false", "algo.name=seqgan", "algo.lr=1e-2",
    "algo.mc_rollouts=3",
]
SMALL_D = ["disc.emb_dim=8", "disc.filter_sizes=[1,2,3]", "disc.num_filters=[4,4,4]", "disc.pretrain_steps=2",
           "disc.d_steps=1", "disc.epochs=1", "disc.num_negatives=64", "disc.batch_size=32"]


def oracle_config(*overrides: str, run_dir=None):
    extra = [f"run_dir={run_dir}"] if run_dir is not None else []
    return build_config(None, ORACLE + SMALL_D + extra + list(overrides))


def test_seqgan_objective_is_q_weighted_log_likelihood():
    # SeqGAN Eq. 8 without a baseline: loss = −Σ_t Q_t log G(y_t | Y_1:t−1) / (number of tokens)
    cfg = oracle_config("rollout.num_workers=0")
    learner = Learner(cfg)
    learner.start_stage("train")
    worker = RolloutWorker(cfg)
    worker.set_weights(learner.get_weights(), 0)
    prompts = learner.task.sample_prompts(np.random.default_rng(0), 4)
    rollout = worker.sample(prompts, RolloutRequest(max_len=6, seed=1))
    q = np.random.default_rng(2).random(rollout.tokens.shape).astype(np.float32)
    rollout.returns = q
    g = learner.state.generator
    with torch.no_grad():
        logp = g.logprobs(torch.zeros(4, 0, dtype=torch.long), torch.zeros(4, dtype=torch.long),
                          torch.from_numpy(rollout.tokens)).logp
    # fixed-length task: every one of the 4 × 6 tokens counts
    expected = -(torch.from_numpy(q) * logp).sum() / 24
    m = learner.update(rollout, 0)
    assert m["loss/policy"] == pytest.approx(float(expected), rel=1e-5)
    assert m["policy/advantage_mean"] == pytest.approx(float(q.mean()), rel=1e-5)  # A = Q, no baseline


def test_scorer_q_from_worker_continuations_equals_d_on_each_continuation():
    # the Ray path (mc_continuations on a worker -> score_continuations on a scorer, here in-process) scores with the
    # prefix-shared D: its Q equals Eq. 4 with D run on every materialised continuation
    from rayseq.distributed.actors.scorer import ScorerActor
    from rayseq.rewards.mc_search import q_values

    cfg = oracle_config("rollout.num_workers=0", "disc.filter_sizes=[1,2,3,5,8]", "disc.num_filters=[4,4,4,3,3]")
    learner = Learner(cfg)
    worker, scorer = RolloutWorker(cfg), ScorerActor(cfg)
    worker.set_weights(learner.get_weights(), 0)
    assert scorer.modules == {}  # nothing until the learner's D arrives
    scorer.set_weights(learner.get_scorer_weights(), learner.scorer_version())
    disc = learner.algo.modules["disc"]
    rollout = worker.sample(learner.task.sample_prompts(np.random.default_rng(0), 5), RolloutRequest(max_len=6, seed=1))
    batch, _ = worker.run_shard(mc_continuations, rollout, 3, 1.0, seed=2)
    q, info = scorer.run_shard(score_continuations, batch)
    B, Tm1, N, T = batch.cont.shape
    lengths = torch.from_numpy(batch.lengths)
    d_cont = disc.score(torch.from_numpy(batch.cont.reshape(-1, T).astype(np.int64)),
                        torch.from_numpy(batch.cont_len.reshape(-1)))
    expected = q_values(d_cont.view(B, Tm1, N), disc.score(torch.from_numpy(batch.tokens), lengths), lengths)
    np.testing.assert_allclose(q, expected.numpy(), atol=1e-6, rtol=1e-5)
    assert info["scored"] == B * Tm1 * N and q.std() > 0


def test_ppo_dynamic_bounds_default_to_supplement_c_for_seqgan():
    cfg = build_config(None, ["algo.name=seqgan_ppo_dynamic"])
    assert {k: getattr(cfg.algo, k) for k in SEQGAN_DYNAMIC_BOUNDS} == SEQGAN_DYNAMIC_BOUNDS == {
        "alpha1": 10.0, "beta1": 0.5, "alpha2": 0.2, "beta2": 0.2}
    # resolved once: the dict every actor rebuilds its config from holds the same values (before, the
    # rebuilt config marked every field as set and the SeqGAN defaults were lost: α1 = β1 = ∞, α2 = β2 = 1)
    again = RunConfig.model_validate(config_to_dict(cfg))
    assert {k: getattr(again.algo, k) for k in SEQGAN_DYNAMIC_BOUNDS} == SEQGAN_DYNAMIC_BOUNDS
    b = build_config(None, ["algo.name=seqgan_ppo_dynamic", "algo.alpha2=0.5"]).algo
    assert (b.alpha2, b.beta2, b.alpha1) == (0.5, 0.2, 10.0)
    assert build_config(None, ["algo.name=ppo_dynamic"]).algo.alpha2 == 1.0  # REINFORCE-style: Supplement C's 1
    assert not make_algo(cfg.algo).baseline_on
    assert make_algo(build_config(None, ["algo.name=seqgan", "algo.use_baseline=true"]).algo).baseline_on


@pytest.mark.ray
def test_seqgan_ppo_dynamic_bounds_reach_the_loss_on_ray_actors(ray_session, tmp_path):
    """Through the real path: the Learner actor rebuilds its config from the driver's dict and
    logs the bounds its loss received; config.yaml shows the same values."""
    changed = {**SEQGAN_DYNAMIC_BOUNDS, "alpha2": 0.5}
    for extra, expected in (([], SEQGAN_DYNAMIC_BOUNDS), (["algo.alpha2=0.5"], changed)):
        run_dir = tmp_path / f"run{len(extra)}"
        cfg = oracle_config("algo.name=seqgan_ppo_dynamic", "rollout.num_workers=1", "scorer.num_scorers=1",
                            "learner.num_cpus=0.5", "train.iters=2", "train.eval_every=0", *extra, run_dir=run_dir)
        Trainer(cfg).run()
        rows = [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == "train"]
        assert len(rows) == 2
        for r in rows:
            assert {k: r[f"ppo_dynamic/{k}"] for k in expected} == expected
        written = yaml.safe_load((run_dir / "config.yaml").read_text())["algo"]
        assert {k: written[k] for k in expected} == expected


def test_rollout_policy_is_a_moving_average_of_the_generator():
    cfg = oracle_config("rollout.num_workers=0", "algo.rollout_update_rate=0.8")
    learner = Learner(cfg)
    assert "rollout_policy" not in learner.get_weights()  # G_β is published once training starts
    learner.start_stage("train")
    beta = learner.algo.modules["rollout_policy"]
    beta0 = {k: v.clone() for k, v in beta.state_dict().items()}
    assert all(torch.equal(v, learner.state.generator.state_dict()[k]) for k, v in beta0.items())  # G_β ← G_θ
    worker = RolloutWorker(cfg)
    worker.set_weights(learner.get_weights(), 0)
    assert worker.modules["rollout_policy"] is not worker.generator  # the worker searches with its G_β copy
    rollout = worker.sample(learner.task.sample_prompts(np.random.default_rng(0), 8), RolloutRequest(6, seed=0))
    rollout.returns = np.ones(rollout.tokens.shape, np.float32)
    learner.update(rollout, 0)
    theta1 = learner.state.generator.state_dict()
    for k, b in beta.state_dict().items():
        torch.testing.assert_close(b, 0.8 * beta0[k] + 0.2 * theta1[k])
    assert not torch.equal(beta0["out.bias"], theta1["out.bias"])  # the update did move θ
    # r = 0: no copy, the workers search with G_θ itself
    learner0 = Learner(oracle_config("rollout.num_workers=0", "algo.rollout_update_rate=0"))
    learner0.start_stage("train")
    assert "rollout_policy" not in learner0.algo.modules and "rollout_policy" not in learner0.get_weights()


def test_d_steps_learn_to_tell_real_counting_outputs_from_random_ones():
    # conditional D on (input, output) pairs: correct counting outputs vs uniformly random digits
    cfg = tiny_config("algo.name=seqgan", "rollout.num_workers=0", *SMALL_D, "disc.epochs=3", "disc.lr=1e-2")
    learner = Learner(cfg)
    task = learner.task
    rng = np.random.default_rng(0)
    worker = RolloutWorker(cfg)
    worker.set_weights(learner.get_weights(), 0)  # an untrained generator: random outputs
    history = []
    for step in range(6):
        pos = task.sample_prompts(rng, 256, with_targets=True)
        neg = worker.sample(task.sample_prompts(rng, 256), RolloutRequest(3, seed=step))
        history.append(learner.aux_update(pos, neg, step))
    first, last = history[0], history[-1]
    # measured: accuracy 0.61 -> 0.83, D(real) − D(fake) 0.04 -> 0.50 (a 12-filter D over packed pairs)
    assert last["disc/accuracy"] > 0.75 and last["disc/accuracy"] > first["disc/accuracy"] + 0.1
    assert last["disc/d_real"] > last["disc/d_fake"] + 0.3 and last["disc/loss"] < first["disc/loss"] - 0.15
    assert learner.scorer_version() == 6 and history[-1]["disc/version"] == 6


def test_oracle_matches_the_published_figures():
    # shared/data/README.md: oracle samples score about 5.75, uniform tokens about 11.44
    if not SEQGAN_ORACLE.is_file():
        pytest.skip(f"SeqGAN's oracle file is not on this machine ({SEQGAN_ORACLE}; set RAYSEQ_SEQGAN_ORACLE)")
    oracle = OracleLSTM.load(SEQGAN_ORACLE)
    assert oracle.vocab_size == 5000 and oracle.hidden == 32
    assert oracle.nll(oracle.sample(500, 20, seed=0)).mean() == pytest.approx(5.75, abs=0.15)
    assert oracle.nll(torch.randint(0, 5000, (500, 20))).mean() == pytest.approx(11.44, abs=0.1)


def test_oracle_files_that_are_bad_are_rejected_and_the_task_needs_no_file(tmp_path):
    """The checks that need no published oracle file (they used to be skipped with it)."""
    bad = tmp_path / "bad.npz"
    np.savez(bad, embedding=np.zeros((5, 3), np.float32))
    with pytest.raises(ValueError, match="oracle arrays missing"):
        OracleLSTM.load(bad)
    with pytest.raises(FileNotFoundError, match="task.oracle_path"):
        OracleLSTM.load(tmp_path / "nope.npz")
    task = OracleTask(oracle_config().task)
    batch = task.sample_prompts(np.random.default_rng(0), 5, with_targets=True)
    assert batch.src.shape == (5, 0) and batch.tgt.shape == (5, 6) and (batch.tgt >= OFFSET).all()


def test_config_rejects_rl_without_a_reward_on_the_oracle():
    with pytest.raises(ConfigError, match="oracle task has no task reward"):
        build_config(None, ["task.name=oracle", "algo.name=ppo"])
    with pytest.raises(ConfigError, match="disc.filter_sizes has 2 entries"):
        build_config(None, ["algo.name=seqgan", "disc.filter_sizes=[1,2]"])


def test_seqgan_resume_restores_discriminator_and_rollout_policy(tmp_path):
    """Interrupted after a checkpoint, then --resume: the final generator AND discriminator equal an
    uninterrupted run's (in-process, fixed seed)."""
    common = ["rollout.num_workers=0", "train.checkpoint_every=3"]
    full = Trainer(oracle_config(*common, run_dir=tmp_path / "full")).run()

    def stop_at_14(row, trainer):
        if row["iteration"] == 14:  # 10 MLE + 2 D-pretraining + 2 adversarial
            trainer._stop = True

    cfg = oracle_config(*common, run_dir=tmp_path / "cut")
    with pytest.raises(Interrupted):
        Trainer(cfg, report=stop_at_14).run()
    resumed = Trainer(cfg, resume=True).run()
    rows = pq.read_table(tmp_path / "cut" / "metrics.parquet").to_pylist()
    assert [r["iteration"] for r in rows] == list(range(1, 17))
    assert [r["stage"] for r in rows] == ["mle"] * 10 + ["algo_pretrain"] * 2 + ["train"] * 4
    a, b = (load_checkpoint(s["checkpoint"])["learner"] for s in (full, resumed))
    a, b = ({**x, **x.pop("algo")} for x in (a, b))  # the algorithm's own: D, its optimizer and version, G_β
    for part in ("generator", "disc", "rollout_policy"):
        for k in a[part]:
            torch.testing.assert_close(a[part][k], b[part][k], rtol=0, atol=0, msg=f"{part}.{k}")
    assert resumed["metrics"] == full["metrics"]
    assert set(full["metrics"]) == {"val/nll_oracle", "val/nll_data", "test/nll_oracle", "test/nll_data"}
    assert full["pretrain_metrics"]["test/nll_oracle"] > 0


def test_init_from_starts_the_adversarial_stage_from_a_pretrained_run(tmp_path):
    pre = Trainer(oracle_config("rollout.num_workers=0", "train.iters=0", run_dir=tmp_path / "pre")).run()
    assert pre["iterations"] == 12  # 10 MLE + 2 D-pretraining
    cfg = oracle_config("rollout.num_workers=0", "algo.name=seqgan_ppo_dynamic", f"train.init_from={tmp_path / 'pre'}",
                        run_dir=tmp_path / "adv")
    adv = Trainer(cfg).run()
    assert adv["pretrain_metrics"] == pre["pretrain_metrics"]
    rows = pq.read_table(tmp_path / "adv" / "metrics.parquet").to_pylist()
    assert [r["iteration"] for r in rows] == [13, 14, 15, 16] and {r["stage"] for r in rows} == {"train"}
    other = oracle_config("rollout.num_workers=0", "model.hidden_dim=8", f"train.init_from={tmp_path / 'pre'}",
                          run_dir=tmp_path / "bad")
    with pytest.raises(ValueError, match="model.hidden_dim"):
        Trainer(other).run()


def test_init_from_an_mle_run_pretrains_the_discriminator_first(tmp_path):
    # an MLE-only checkpoint has no D: SeqGAN pretrains one from the loaded generator (its own stage), then trains;
    # so D configurations can be compared from one MLE model (before: "no discriminator in that checkpoint")
    mle_args = [a for a in ORACLE if not a.startswith("algo.")] + ["algo.name=mle", "train.iters=0"]
    pre = Trainer(build_config(None, [*mle_args, "rollout.num_workers=0", f"run_dir={tmp_path / 'pre'}"])).run()
    assert pre["iterations"] == 10
    adv = Trainer(oracle_config("rollout.num_workers=0", f"train.init_from={tmp_path / 'pre'}",
                                run_dir=tmp_path / "adv")).run()
    assert adv["pretrain_metrics"] == pre["pretrain_metrics"]
    rows = pq.read_table(tmp_path / "adv" / "metrics.parquet").to_pylist()
    assert [(r["iteration"], r["stage"]) for r in rows] == [(11, "algo_pretrain"), (12, "algo_pretrain")] + [
        (i, "train") for i in range(13, 17)]
    assert all(r["disc/accuracy"] is not None for r in rows[:2])
    g_pre, g_adv = (load_checkpoint(s["checkpoint"])["learner"]["generator"] for s in (pre, adv))
    assert any(not torch.equal(g_pre[k], g_adv[k]) for k in g_pre)  # the adversarial stage trained G


@pytest.mark.ray
# the oracle on Ray actors in the default run: tests/algos/test_transformer_algos.py (a decoder-only policy)
@pytest.mark.parametrize("task", [pytest.param("oracle", marks=pytest.mark.slow), "counting"])
def test_seqgan_on_ray_with_rollout_workers_and_scorers(tmp_path, task):
    """The distributed path: 2 rollout workers run the Monte-Carlo search, 1 scorer scores it; on the
    counting task D judges (input, output) pairs."""
    import subprocess
    import sys

    if task == "oracle":
        args = ORACLE + SMALL_D
    else:
        args = ["model.emb_dim=16", "model.hidden_dim=32", "task.test_size=200", "train.pretrain_iters=20",
                "train.pretrain_batch_size=32", "train.iters=3", "train.batch_size=16", "train.eval_every=0",
                "progress=false", "algo.name=seqgan_ppo", "algo.mc_rollouts=2"] + SMALL_D
    r = subprocess.run([sys.executable, "-m", "rayseq.train", *args, "algo.name=seqgan_ppo", "rollout.num_workers=2",
                        "scorer.num_scorers=1", f"run_dir={tmp_path / 'run'}"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = pq.read_table(tmp_path / "run" / "metrics.parquet").to_pylist()
    train = [x for x in rows if x["stage"] == "train"]
    assert len(train) == (4 if task == "oracle" else 3)
    assert all(x["time/mc_s"] > 0 and 0 <= x["rollout/q_mean"] <= 1 for x in train)
    assert all(x["disc/version"] >= 3 for x in train)  # 2 pretraining d-steps + 1 per iteration
    assert "NLL-oracle" in r.stdout if task == "oracle" else "precision" in r.stdout
