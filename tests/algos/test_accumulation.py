"""Gradient accumulation in the updates that take a whole batch in one step (REINFORCE, MIXER, SCST, RLOO, MLE, the
reward model, the actor-critic): with ``learner.micro_batch_size`` below the batch the learner's update goes through the
policy a few rows at a time, each micro-batch's loss scaled by its share of the batch's denominator, and makes the
one-pass update: its loss and metrics, the gradients of every trained module (within 1e-6) and the parameters after
the step. The micro-batches are uneven (16 rows in 3 + 3 + 3 + 3 + 3 + 1) and their token counts differ, so a
micro-batch mean not weighed by its tokens (or by 1 / the number of micro-batches) would fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayseq.algos.common import grad_micro_batches
from rayseq.config import build_config
from rayseq.distributed.actors.learner import Learner
from tests.algos.test_no_grad_passes import _learner_and_rollout
from tests.algos.test_reward_model import RM
from tests.conftest import tiny_config
from tests.reward_fixtures_prefs import preference_rows, write_jsonl

TOL = {"rtol": 1e-5, "atol": 1e-6}  # the same sums in another order
# Adam's first step moves each weight by lr · g / (|g| + 1e-8) ≈ lr · sign(g): an element whose gradient is rounding
# noise (the attention keys' bias, whose exact gradient is 0) moves by ±lr at random; the weights are compared where
# the gradient is above that noise
NOISE = 1e-6


def _trained(learner: Learner, modules: tuple[str, ...]) -> dict:
    return {"generator": learner.state.generator, **{k: learner.algo.modules[k] for k in modules}}


def assert_same_update(runs: list, modules: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> None:
    """Two (learner, metrics) after one update each: the same metrics, gradients left in ``.grad`` (the step's,
    after clipping) and parameters, of the generator and the algorithm's ``modules``."""
    (a, ma), (b, mb) = runs
    for name, module in _trained(a, modules).items():
        other = dict(_trained(b, modules)[name].named_parameters())
        for k, p in module.named_parameters():
            q = other[k]
            assert (p.grad is None) == (q.grad is None), f"{name}.{k}"
            moved = torch.ones_like(p, dtype=torch.bool)
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m, k=k, n=name: f"grad {n}.{k}: {m}")
                moved = p.grad.abs() > NOISE
            torch.testing.assert_close(p.detach()[moved], q.detach()[moved], **TOL,
                                       msg=lambda m, k=k, n=name: f"{n}.{k}: {m}")
    assert ma.keys() == mb.keys()
    for k in ma:
        if not k.startswith("time/") and k not in skip:
            assert mb[k] == pytest.approx(ma[k], rel=1e-5, abs=1e-6), k


ROLLOUT = {
    # the baseline's values whitened over the whole batch, the entropy bonus, the gradient clipped
    "reinforce": ("algo.name=reinforce", "algo.normalize_advantages=true", "algo.entropy_coef=0.05",
                  "algo.max_grad_norm=0.05"),
    "reinforce_transformer": ("algo.name=reinforce", "model.arch=transformer", "algo.entropy_coef=0.05"),
    # MIXER: cross-entropy on the forced prefix and REINFORCE on the sampled tokens, divided by all the tokens
    "mixer": ("algo.name=mixer", "algo.mixer_delta_start=2"),
    # SeqGAN's policy update is REINFORCE's on its Q values
    "seqgan": ("algo.name=seqgan", "disc.emb_dim=8", "disc.filter_sizes=[1,2]", "disc.num_filters=[4,4]"),
    # SCST: the greedy decode's reward as the baseline, no value model
    "scst": ("algo.name=scst", "algo.entropy_coef=0.05", "algo.max_grad_norm=0.05"),
    # RLOO: leave-one-out advantages of groups of 4 consecutive rows (cut by the micro-batches); per token, and per
    # reply over the high-entropy half of the tokens (the quantile over the whole batch)
    "rloo": ("algo.name=rloo", "algo.group_size=4", "algo.entropy_coef=0.05"),
    "rloo_menu": ("algo.name=rloo", "algo.group_size=4", "algo.loss_type=grpo", "algo.top_entropy_quantile=0.5",
                  "algo.entropy_coef=0.01"),
}
NO_VALUE_MODEL = ("scst", "rloo", "rloo_menu")


@pytest.mark.parametrize("case", [*ROLLOUT, "reinforce_hf"])
def test_rollout_updates_accumulated_equal_one_pass(case, request):
    """``reinforce_hf``: a Hugging Face policy's micro-batches through its chunked head, with the KL penalty's
    reference log-probs from its passes without gradients."""
    overrides = ROLLOUT.get(case, ())
    if case == "reinforce_hf":
        corpus, hf_dir = request.getfixturevalue("corpus"), request.getfixturevalue("hf_dir")
        overrides = ("task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={hf_dir}",
                     "algo.name=reinforce", "algo.kl_coef=0.05", "algo.entropy_coef=0.01")
    runs = []
    for micro in ([], ["learner.micro_batch_size=3"]):
        learner, rollout = _learner_and_rollout(*overrides, *micro, n=16)
        if case == "mixer":  # each reply's first token forced (its reference's): cross-entropy there
            rollout.action_mask[:, 0] = 0.0
        if case == "scst":  # the greedy decodes' rewards, some above the samples' and some below
            rollout.extras["greedy_score"] = np.full(16, 0.3, np.float32)
        runs.append((learner, learner.update(rollout, 0)))
    state = runs[1][0].state
    assert state.micro_batch == 3 and runs[0][0].state.micro_batch is None
    assert [len(p) for p in grad_micro_batches(state, 16, 10)] == [3, 3, 3, 3, 3, 1]
    assert grad_micro_batches(runs[0][0].state, 16, 10) is None  # unset: the one pass (an HF policy's too, here)
    assert_same_update(runs, () if case in NO_VALUE_MODEL else ("baseline",))


@pytest.mark.parametrize("arch", ["rnn", "hf"])
def test_mle_accumulated_equals_one_pass(arch, request):
    """MLE pretraining's update (the learner's ``mle`` stage) on 16 targets of different lengths; an HF policy's
    micro-batches go through its chunked head (the log-probs of the reply's positions, recomputed in backward)."""
    hf = ()
    if arch == "hf":
        corpus, hf_dir = request.getfixturevalue("corpus"), request.getfixturevalue("hf_dir")
        hf = ("task.name=pairs", f"task.data={corpus}", "model.arch=hf", f"model.path={hf_dir}")
    runs = []
    for micro in ([], ["learner.micro_batch_size=3"]):
        learner = Learner(tiny_config(*hf, "algo.max_grad_norm=0.1", *micro))  # in its first stage, mle
        batch = learner.task.sample_prompts(np.random.default_rng(1), 16, with_targets=True)
        if arch == "rnn":
            batch.tgt_len = np.array([3, 1, 2, 3] * 4)  # the counting task's targets, cut short to uneven lengths
        assert len(set(batch.tgt_len.tolist())) > 1
        runs.append((learner, learner.update(batch, 0)))
    assert_same_update(runs)


@pytest.fixture(scope="module")
def prefs(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("prefs") / "prefs.jsonl", preference_rows(120))


def test_reward_model_accumulated_equals_one_pass(prefs):
    """15 pairs, micro-batches of 8 rows = 4 pairs (4 + 4 + 4 + 3), with the margin and the centring term: the
    generator's and the head's gradients and weights, the loss and the accuracy of one pass of 30 rows."""
    runs = []
    for micro in ([], ["learner.micro_batch_size=8"]):
        cfg = build_config(None, [*RM, f"task.data={prefs}", "algo.center_rewards_coefficient=0.1",
                                  "algo.max_grad_norm=0.5", *micro])
        learner = Learner(cfg)
        learner.start_stage("train")
        batch = learner.task.sample_preferences(np.random.default_rng(0), 15)
        runs.append((learner, learner.update(batch, 0)))
    assert [len(p) for p in grad_micro_batches(runs[1][0].state, 15, 10, row_cost=2)] == [4, 4, 4, 3]
    assert_same_update(runs, ("rm_head",))


@pytest.mark.parametrize("case", ["tokens", "warmup", "turns"])
def test_actor_critic_accumulated_equals_one_pass(case):
    """The actor's REINFORCE step on GAE advantages (whitened over the whole batch) and the critic's regression on its
    TD(λ) targets: per token; during the critic-only warm-up (no actor step); and over turns (``turn_gae``: V read at
    each turn's first sampled token) on episodes of guess_number, rewarded at the first turn and at the end."""
    extra = {"tokens": ("algo.normalize_advantages=true", "algo.entropy_coef=0.05", "algo.max_grad_norm=0.1"),
             "warmup": ("algo.critic_warmup=1",),
             "turns": ("algo.turn_credit=turn_gae", "algo.turn_gamma=0.9", "env.name=guess_number",
                       "env.kwargs.hi=15", "env.kwargs.max_guesses=4", "env.max_action_tokens=1",
                       "train.pretrain_iters=0")}[case]
    runs = []
    for micro in ([], ["learner.micro_batch_size=3"]):
        learner, rollout = _learner_and_rollout("algo.name=actor_critic", *extra, *micro, n=16)
        if case == "turns":
            rollout.rewards[:, 0] += 0.5  # the first turn's reward
        runs.append((learner, learner.update(rollout, 0)))
    (_, m), _ = runs
    assert ("policy/grad_norm" in m) == (case != "warmup") and ("credit/turns_per_row" in m) == (case == "turns")
    assert_same_update(runs, ("critic",))


DATA_PARALLEL = {  # algorithm -> its keys, and the metric of its value model (None: it has none)
    "reinforce": (("algo.normalize_advantages=true",), "loss/value"),
    "actor_critic": (("algo.normalize_advantages=true",), "loss/critic"),
    "scst": ((), None),
    "rloo": (("algo.group_size=4", "algo.loss_type=grpo", "algo.top_entropy_quantile=0.5"), None),
}


@pytest.mark.ray
@pytest.mark.parametrize("algo", DATA_PARALLEL)
def test_two_learners_in_micro_batches_make_the_update_of_one_pass(ray_session, algo):
    """Two replicated learners, each its 8 of the 16 rows in micro-batches of 3 (3 + 3 + 2), against one learner in
    one pass: the metrics, the weights and Adam's moments of the generator and the value model on both ranks (RLOO:
    its per-reply mean over the high-entropy half of the tokens, the quantile over both ranks' entropies)."""
    keys, value = DATA_PARALLEL[algo]
    from rayseq.config import RunConfig, config_to_dict
    from rayseq.distributed.actors.worker import RolloutWorker
    from rayseq.distributed.groups import LearnerGroup
    from rayseq.distributed.groups.manager import ActorManager
    from rayseq.types import RolloutRequest
    from tests.distributed.test_learner_group import assert_same_metrics, assert_same_tensors

    cfg = tiny_config("rollout.num_workers=1", "learner.num_learners=2", "learner.micro_batch_size=3",
                      f"algo.name={algo}", *keys, "algo.entropy_coef=0.05")
    group = LearnerGroup(cfg, manager=ActorManager(ray_session, None), actor_options=[{"num_cpus": 0.5}] * 2)
    d = config_to_dict(cfg)
    one = Learner(RunConfig.model_validate({**d, "learner": {**d["learner"], "num_learners": 1,
                                                             "micro_batch_size": None}}))
    assert grad_micro_batches(one.state, 16, 10) is None  # one pass
    for learner in (one, group):
        learner.start_stage("train")
    worker = RolloutWorker(cfg, 0)
    worker.set_weights(one.get_weights(), one.get_version())
    rollout = worker.sample(one.task.sample_prompts(np.random.default_rng(0), 16),
                            RolloutRequest(max_len=one.task.max_tgt_len, seed=3))
    assert len(np.unique(rollout.action_mask.sum(1))) > 1  # replies of several lengths: the shares differ
    rollout.score = np.linspace(-1, 1, 16).astype(np.float32)
    rollout.rewards = np.zeros_like(rollout.rewards)
    rollout.rewards[np.arange(16), np.maximum(rollout.token_mask.sum(1).astype(int) - 1, 0)] = rollout.score
    rollout.extras["greedy_score"] = np.full(16, 0.2, np.float32)  # SCST's baseline (the others read none)
    m1, m2 = one.update_rollout([rollout], 0), group.update([rollout], 0)
    assert_same_metrics(m1, m2, ["loss/policy", *([value] if value else []), "policy/grad_norm", "policy/entropy",
                                 "policy/advantage_mean"])
    state = group.state_dict()
    assert_same_tensors(one.state_dict(), state, "state")
    assert_same_tensors(state["generator"], ray_session.get(group.actors[1].state_dict.remote())["generator"],
                        "rank 1")
    for a in group.actors:
        ray_session.kill(a)


@pytest.mark.ray
def test_sharded_transformer_with_activation_checkpointing_makes_the_update_of_one(ray_session, corpus, hf_dir):
    """Two FSDP learners whose Transformer layers are checkpointed (each layer sharded, its recomputation in backward
    gathering its parameters again), in micro-batches of 3 rows: MLE then PPO with the KL penalty make the update of
    one replicated learner (the weights and Adam moments gathered from the ranks' halves)."""
    from tests.distributed.test_learner_group import assert_two_learners_make_the_update_of_one

    assert_two_learners_make_the_update_of_one(ray_session, corpus, hf_dir, "fsdp:transformer",
                                               overrides=("learner.activation_checkpointing=true",))
