"""The loss menu on the algorithms' side (``rayseq.algos.loss_menu``): which algorithm reads which key, the
combinations refused naming both keys, GRPO's reward scalings by hand, truncated replies by hand, and every variant
through a learner's real update (minibatches, epochs, the decoupled objective with its micro-batched pass, vLLM's
importance weights), with Dr.GRPO's constant the task's longest reply and DAPO's overlong filtering equal to leaving
those replies out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayseq.algos.grpo import SCALE_REWARDS, batch_scaled_advantages, group_centred_advantages
from rayseq.algos.loss_menu import PolicyLoss, chosen, ended
from rayseq.config import ConfigError, build_config
from rayseq.config.declared import declared_algo_keys
from rayseq.losses import LOSS_TYPES
from rayseq.rewards import terminal_rewards
from rayseq.types import RolloutRequest
from tests.conftest import tiny_config

MENU = ("loss_type", "importance_sampling_level", "scale_rewards", "delta", "mask_truncated_completions",
        "top_entropy_quantile", "sapo_temperature_pos", "sapo_temperature_neg")
READS = {  # the menu keys each algorithm reads (rayseq.algos.loss_menu's table)
    "grpo": set(MENU),
    "grpo_dynamic": {"loss_type", "scale_rewards", "delta", "mask_truncated_completions", "top_entropy_quantile"},
    "rloo": {"loss_type", "mask_truncated_completions", "top_entropy_quantile"},
    "ppo": set(MENU) - {"importance_sampling_level", "scale_rewards"},
    "ppo_dynamic": {"loss_type", "delta", "mask_truncated_completions", "top_entropy_quantile"},
    "mixer_ppo": set(),
    "seqgan_ppo": set(),
}


@pytest.mark.parametrize("name", READS)
def test_each_algorithm_reads_the_menu_keys_that_mean_something_there(name):
    assert set(declared_algo_keys(name)) & set(MENU) == READS[name]
    cfg = build_config(None, [f"algo.name={name}", "algo.group_size=4"] if "grpo" in name or name == "rloo"
                       else [f"algo.name={name}"])
    if READS[name]:  # today's behaviour is the default: DAPO's token mean, every token, per-token ratios
        assert cfg.algo.loss_type == "dapo" and cfg.algo.top_entropy_quantile == 1.0
        assert not cfg.algo.mask_truncated_completions


REFUSED = [
    (["algo.name=ppo_dynamic", "algo.loss_type=sapo"], "algo.loss_type=sapo.*algo.name=ppo_dynamic"),
    (["algo.name=grpo_dynamic", "algo.loss_type=cispo"], "algo.loss_type=cispo.*grpo_dynamic"),
    (["algo.name=rloo", "algo.loss_type=gmpo"], "algo.loss_type=gmpo.*algo.name=rloo"),
    (["algo.name=ppo", "algo.loss_type=gmpo"], "algo.loss_type=gmpo.*algo.name=ppo"),
    (["algo.name=grpo", "algo.loss_type=sapo", "algo.delta=2"], "algo.delta=2.0.*algo.loss_type=sapo"),
    (["algo.name=grpo", "algo.loss_type=cispo"], "algo.loss_type=cispo.*algo.eps_high"),
    (["algo.name=grpo", "algo.loss_type=sapo", "algo.eps_high=0.28"], "algo.eps_high=0.28.*algo.loss_type=sapo"),
    (["algo.name=grpo", "algo.loss_type=gmpo", "algo.importance_sampling_level=sequence"],
     "algo.importance_sampling_level=sequence.*algo.loss_type=gmpo"),
    (["algo.name=grpo", "algo.mask_truncated_completions=true"],
     "algo.mask_truncated_completions=true.*task.name=counting"),
    (["algo.name=ppo", "algo.importance_sampling_level=sequence"], "algo.importance_sampling_level: algo.name=ppo"),
    (["algo.name=ppo", "algo.scale_rewards=none"], "algo.scale_rewards: algo.name=ppo"),
    (["algo.name=grpo", "algo.loss_type=token-sum"], "algo.loss_type"),
]


@pytest.mark.parametrize("overrides, match", REFUSED)
def test_combinations_that_mean_nothing_are_refused_naming_both_keys(overrides, match):
    with pytest.raises(ConfigError, match=match):
        build_config(None, ["algo.group_size=4", *overrides] if "grpo" in overrides[0] or "rloo" in overrides[0]
                     else overrides)


def test_verls_names_and_trls_booleans_are_accepted():
    for verl, trl in (("token-mean", "dapo"), ("seq-mean-token-mean", "grpo"), ("seq-mean-token-sum", "luspo"),
                      ("seq-mean-token-sum-norm", "dr_grpo")):
        cfg = build_config(None, ["algo.name=grpo", f"algo.loss_type={verl}"])
        assert chosen(cfg.algo.loss_type) is LOSS_TYPES[trl]
    assert build_config(None, ["algo.name=grpo", "algo.scale_rewards=false"]).algo.scale_rewards == "none"
    assert build_config(None, ["algo.name=grpo", "algo.scale_rewards=none"]).algo.scale_rewards == "none"
    assert build_config(None, ["algo.name=grpo", "algo.scale_rewards=true"]).algo.scale_rewards == "group"


def test_reward_scalings_by_hand():
    # groups of 3: (1, 0, 0) mean 1/3 and (1, 1, 0) mean 2/3 -> centred: (2/3, −1/3, −1/3), (1/3, 1/3, −2/3)
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    centred = [2 / 3, -1 / 3, -1 / 3, 1 / 3, 1 / 3, -2 / 3]
    np.testing.assert_allclose(group_centred_advantages(r, 3), centred)
    # batch: the 6 rewards' population std = 0.5 (three 1s, three 0s) -> centred / 0.5
    np.testing.assert_allclose(batch_scaled_advantages(r, 3), np.array(centred) / (0.5 + 1e-8))
    assert SCALE_REWARDS["none"] is group_centred_advantages


def test_truncated_replies_by_hand():
    # eos = 2. Row 0 ends with it; row 1 fills its 4 tokens without it (the cap cut it); row 2 is the end token alone
    tokens = torch.tensor([[5, 6, 2, 0], [5, 6, 7, 8], [2, 0, 0, 0]])
    token_mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    torch.testing.assert_close(ended(tokens, token_mask, 2), torch.tensor([1.0, 0.0, 1.0]))
    policy = type("P", (), {"eos_id": 2})()
    masked = PolicyLoss(None, mask_truncated=True).mask(token_mask, tokens, token_mask, policy)
    torch.testing.assert_close(masked, token_mask * torch.tensor([[1.0], [0.0], [1.0]]))
    assert PolicyLoss(None).mask(token_mask, tokens, token_mask, None) is token_mask  # off: the sampled tokens


def _learner_and_rollout(*overrides, seed: int = 0, is_weights: bool = False, pairs=None):
    """A learner in its train stage and a rollout of 4 groups of 4 from its policy, with rewards of every size."""
    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.actors.worker import RolloutWorker

    task = ["task.name=pairs", f"task.data={pairs}", "task.test_size=100", "task.val_size=10"] if pairs else []
    groups = ("algo.group_size=4",) if any(g in overrides[0] for g in ("grpo", "rloo")) else ()
    cfg = tiny_config(*task, *groups, "train.batch_size=16", *overrides)
    learner, worker = Learner(cfg), RolloutWorker(cfg)
    learner.start_stage("train")
    worker.set_weights(learner.get_weights(), 0)
    rng = np.random.default_rng(seed)
    prompts = learner.task.sample_prompts(rng, 4).repeat(4)
    rollout = worker.sample(prompts, RolloutRequest(max_len=learner.task.max_tgt_len, seed=seed))
    rollout.score = rng.normal(size=16).astype(np.float32)
    rollout.rewards = terminal_rewards(rollout.score, rollout.token_mask)
    if is_weights:  # an engine's truncated importance weights (rollout.engine=vllm)
        rollout.is_weights = np.exp(0.2 * rng.normal(size=rollout.logp.shape)).clip(max=2.0).astype(np.float32)
    return learner, rollout


VARIANTS = [
    ("algo.name=grpo", "algo.loss_type=grpo"),
    ("algo.name=grpo", "algo.loss_type=seq-mean-token-sum-norm", "algo.scale_rewards=none"),  # Dr.GRPO
    ("algo.name=grpo", "algo.loss_type=bnpo", "algo.scale_rewards=batch", "algo.delta=1.5"),
    ("algo.name=grpo", "algo.loss_type=luspo", "algo.importance_sampling_level=sequence"),
    ("algo.name=grpo", "algo.loss_type=grpo", "algo.importance_sampling_level=sequence", "algo.eps=3e-4",
     "algo.eps_high=4e-4"),  # GSPO's recipe
    ("algo.name=grpo", "algo.loss_type=cispo", "algo.eps_high=5", "algo.top_entropy_quantile=0.2"),
    ("algo.name=grpo", "algo.loss_type=sapo"),
    ("algo.name=grpo", "algo.loss_type=gmpo", "algo.eps=0.4", "algo.top_entropy_quantile=0.5"),
    ("algo.name=grpo_dynamic", "algo.loss_type=dr_grpo", "algo.delta=3"),
    ("algo.name=rloo", "algo.loss_type=grpo", "algo.top_entropy_quantile=0.5"),
    ("algo.name=ppo", "algo.loss_type=sapo", "algo.entropy_coef=0.01"),
    ("algo.name=ppo_dynamic", "algo.loss_type=luspo"),
]


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: " ".join(x.split("=", 1)[1] for x in o))
def test_every_variant_updates_through_the_learner(overrides):
    """Two epochs of minibatches of 8 (the second minibatch is off-policy), the decoupled objective against the
    learner's weights with its pass in micro-batches of 3 rows, vLLM's importance weights on the advantages (RLOO:
    its one REINFORCE step): the policy moves and the metrics are finite."""
    loop = () if "rloo" in overrides[0] else ("algo.epochs=2", "algo.minibatch_size=8", "algo.ratio_to=proximal",
                                               "learner.micro_batch_size=3")
    learner, rollout = _learner_and_rollout(*overrides, *loop, is_weights=True)
    before = {k: v.clone() for k, v in learner.state.generator.state_dict().items()}
    m = learner.update(rollout, 0)
    assert all(np.isfinite(v) for k, v in m.items() if not k.startswith("ppo_dynamic/")), m  # its α1 = β1 = ∞
    assert m["policy/grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in learner.state.generator.state_dict().items())
    if any("top_entropy_quantile" in o for o in overrides) and "rloo" not in overrides[0]:
        assert 0 < m["policy/kept_token_frac"] < 1


def test_dr_grpo_divides_by_the_tasks_longest_reply():
    """One minibatch at ρ = 1: dapo's loss is −Σ A / (tokens), Dr.GRPO's −Σ A / (B · L) with L the task's reply cap
    (counting: 3), so their ratio is tokens / (B · L)."""
    losses = {}
    for name in ("dapo", "dr_grpo"):
        learner, rollout = _learner_and_rollout("algo.name=grpo", f"algo.loss_type={name}", "algo.minibatch_size=null")
        assert learner.state.max_reply_len == learner.task.max_tgt_len == 3
        losses[name] = learner.update(rollout, 0)["loss/policy"]
    tokens = rollout.action_mask.sum()
    assert losses["dr_grpo"] == pytest.approx(losses["dapo"] * tokens / (16 * 3), rel=1e-5)


def test_overlong_filtering_leaves_the_cut_replies_out(corpus):
    """DAPO's overlong filtering: an update with algo.mask_truncated_completions=true makes the update of one whose
    cut replies (no end token) had no sampled token; on the pairs task, where replies end with one."""
    results = []
    for masked in (True, False):
        learner, rollout = _learner_and_rollout("algo.name=grpo", "algo.loss_type=grpo", "algo.minibatch_size=8",
                                                f"algo.mask_truncated_completions={str(masked).lower()}",
                                                pairs=corpus)
        cut = ended(torch.from_numpy(rollout.tokens), torch.from_numpy(rollout.token_mask),
                    learner.state.generator.eos_id).numpy() == 0
        assert 0 < cut.sum() < len(cut), "the batch needs cut replies and ended ones"
        if not masked:  # by hand: the cut replies have nothing to train on
            rollout.action_mask = rollout.action_mask * (~cut)[:, None]
        m = learner.update(rollout, 0)
        results.append((m, learner.state.generator.state_dict()))
    (m1, w1), (m2, w2) = results
    assert m1["rollout/truncated_frac"] == pytest.approx(cut.mean())
    assert m1["loss/policy"] == pytest.approx(m2["loss/policy"], rel=1e-6)
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k])
