"""The RLlib RLModule around rayseq's generator: from a rayseq MLE checkpoint it gives the
generator's own log-probs (teacher-forced and as sampled) and baseline values; RLlib's PPO trains it on the
counting environment on a real local Ray runtime."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns

from rayseq.checkpoint import algorithm_entries, load_checkpoint
from rayseq.config import RunConfig
from rayseq.distributed.driver import Trainer
from rayseq.envs import make_env
from rayseq.envs.rllib_module import GeneratorRLModule
from rayseq.models.baseline import ValueBaseline
from rayseq.models.factory import make_generator
from rayseq.tasks import make_task
from tests.conftest import tiny_config

TINY_MODEL = {"emb_dim": 16, "hidden_dim": 32}


@pytest.fixture(scope="module")
def mle_run(tmp_path_factory):
    """A counting run after a short MLE pretraining, in-process (no Ray; ~2 s): its run directory. Its sampled
    replies are correct ~15% of the time, so PPO sees rewards."""
    run_dir = tmp_path_factory.mktemp("envs") / "mle"
    cfg = tiny_config(
        "rollout.num_workers=0",
        "train.iters=0",
        "task.val_size=100",
        "train.pretrain_iters=400",
        "train.pretrain_lr=1e-2",
        run_dir=run_dir,
    )
    Trainer(cfg).run()
    return run_dir


def rayseq_models(location):
    """The generator and baseline of a checkpoint as rayseq itself builds them (learner.evaluate_checkpoint)."""
    ck = load_checkpoint(location)
    cfg = RunConfig.model_validate(ck["config"])
    task = make_task(cfg.task)
    gen = make_generator(cfg, task)
    gen.load_state_dict(ck["learner"]["generator"])
    base = ValueBaseline(cfg.model.hidden_dim)
    base.load_state_dict(algorithm_entries(ck["learner"])["baseline"])
    return gen.eval(), base, task


def observations(env, src, src_len, tokens):
    """Every observation along sequences ``tokens`` (B, T) of prompts ``src``: a dict of (B·(T+1), ...) tensors, row
    b·(T+1) + t holding prompt b and the prefix y_1..y_t."""
    B, T = tokens.shape
    S = env.observation_space["prompt"].shape[0]
    prompt = np.zeros((B, S), np.int64)
    prompt[:, : src.shape[1]] = src
    prefix = np.zeros((B, T + 1, env.max_tgt_len), np.int64)
    for t in range(T + 1):
        prefix[:, t, :t] = tokens[:, :t]
    obs = {
        "prompt": np.repeat(prompt, T + 1, 0),
        "prompt_len": np.repeat(src_len, T + 1),
        "prefix": prefix.reshape(B * (T + 1), -1),
        "prefix_len": np.tile(np.arange(T + 1), B),
    }
    return {k: torch.as_tensor(v) for k, v in obs.items()}


def module_logp(module, obs, tokens):
    """log π(y_t | x, y_<t) (B, T) through RLlib's own action distribution of the module's output."""
    B, T = tokens.shape
    out = module.forward_inference({Columns.OBS: obs})
    dist = module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
    actions = torch.cat([torch.as_tensor(tokens), torch.zeros(B, 1, dtype=torch.long)], 1).reshape(-1)
    return dist.logp(actions).reshape(B, T + 1)[:, :T]


def test_checkpoint_loads_with_the_generators_log_probs_and_values(mle_run):
    env = make_env("counting")
    module = GeneratorRLModule(
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config={"checkpoint": str(mle_run)},
    )
    module.eval()
    gen, base, task = rayseq_models(mle_run)
    batch = task.sample_prompts(np.random.default_rng(0), 16)
    src, src_len = torch.as_tensor(batch.src), torch.as_tensor(batch.src_len)
    sampled = gen.sample(src, src_len, env.max_tgt_len, generator=torch.Generator().manual_seed(0))
    tokens = sampled.tokens.numpy()  # counting: always 3 tokens (the MLE model does not emit <eos> here)
    assert tokens.shape == (16, 3) and sampled.token_mask.all()
    obs = observations(env, batch.src, batch.src_len, tokens)
    with torch.no_grad():
        ours = module_logp(module, obs, tokens)
        ref = gen.logprobs(src, src_len, sampled.tokens)
        values = module.compute_values({Columns.OBS: obs}).reshape(16, 4)[:, :3]
    torch.testing.assert_close(ours, ref.logp, atol=1e-5, rtol=0)  # teacher-forced
    torch.testing.assert_close(ours, sampled.logp, atol=1e-5, rtol=0)  # as rayseq's rollouts recorded them
    torch.testing.assert_close(values, base(ref.states), atol=1e-5, rtol=0)
    assert ref.logp.sum(1).mean() > -3 * np.log(14)  # the checkpoint's weights, not a fresh model's near-uniform


def test_a_fresh_module_on_an_unconditional_task_with_banned_ids():
    env = make_env("oracle", vocab_size=50, seq_len=6)
    module = GeneratorRLModule(
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config={"task": {"name": "oracle", "vocab_size": 50, "seq_len": 6}, "model": TINY_MODEL},
    )
    gen = make_generator(
        RunConfig.model_validate(
            {"task": {"name": "oracle", "vocab_size": 50, "seq_len": 6}, "model": TINY_MODEL, "algo": {"name": "mle"}}
        ),
        env.task,
    )
    gen.load_state_dict(module.generator.state_dict())
    tokens = np.random.default_rng(0).integers(4, 54, size=(4, 6))
    obs = observations(env, np.zeros((4, 0), np.int64), np.zeros(4, np.int64), tokens)
    with torch.no_grad():
        out = module.forward_exploration({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        ours = module_logp(module, obs, tokens)
        ref = gen.logprobs(
            torch.zeros(4, 0, dtype=torch.long), torch.zeros(4, dtype=torch.long), torch.as_tensor(tokens)
        ).logp
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    assert torch.isfinite(out).all() and (torch.softmax(out, -1)[:, :4] == 0).all()  # specials never emitted


def test_model_config_errors_name_what_is_wrong():
    env = make_env("counting")
    spaces = {"observation_space": env.observation_space, "action_space": env.action_space}
    with pytest.raises(ValueError, match="checkpoint=RUN_DIR"):
        GeneratorRLModule(**spaces, model_config={})
    with pytest.raises(ValueError, match="same task"):
        GeneratorRLModule(**spaces, model_config={"task": {"name": "oracle", "vocab_size": 50}})


@pytest.mark.ray
def test_rllib_ppo_trains_the_module_from_the_checkpoint(ray_session, mle_run):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module import RLModuleSpec

    from rayseq.envs import ENV_NAME, register

    register()
    config = (
        PPOConfig()
        .environment(ENV_NAME, env_config={"task": "counting"})
        .env_runners(num_env_runners=1, num_envs_per_env_runner=1)
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=96, minibatch_size=48, num_epochs=1, lr=1e-3)
        .rl_module(
            rl_module_spec=RLModuleSpec(module_class=GeneratorRLModule, model_config={"checkpoint": str(mle_run)})
        )
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        module = algo.get_module()
        assert isinstance(module, GeneratorRLModule)
        before = {k: v.clone() for k, v in module.generator.state_dict().items()}
        gen, _, _ = rayseq_models(mle_run)
        assert all(torch.equal(before[k], v) for k, v in gen.state_dict().items())  # starts from the checkpoint
        results = [algo.train() for _ in range(2)]
        after = algo.get_module().generator.state_dict()
    finally:
        algo.stop()
    runners = [r["env_runners"] for r in results]
    learners = [r["learners"]["default_policy"] for r in results]
    assert all(r["num_env_steps_sampled"] >= 96 and r["episode_len_max"] <= 3 for r in runners)  # the 3-token cap
    # counting's reward: 1 for a correct reply, else 0; the pretrained model gets some right, so PPO has a signal
    assert all(0.0 <= r["episode_return_mean"] <= 1.0 for r in runners)
    assert max(r["episode_return_max"] for r in runners) == 1.0
    assert all(np.isfinite(x["policy_loss"]) and np.isfinite(x["vf_loss"]) for x in learners)
    assert any(x["policy_loss"] != 0 and x["vf_loss"] > 0 for x in learners)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # PPO changed the generator


@pytest.mark.ray
def test_rllib_guide_example_runs(ray_session, mle_run, capsys):
    """docs/guides/rllib.md's example as written, on the tiny MLE run instead of runs/mle."""
    from tests.doc_examples import code_blocks, page

    code = next(b for lang, b in code_blocks(page("docs/guides/rllib.md")) if lang == "python")
    assert '"runs/mle"' in code
    scope = {}
    exec(compile(code.replace('"runs/mle"', repr(str(mle_run))), "docs/guides/rllib.md", "exec"), scope)
    scope["algo"].stop()
    printed = capsys.readouterr().out.split()
    assert len(printed) == 3 and all(0.0 <= float(x) <= 1.0 for x in printed)


def test_a_conditional_task_with_replies_ending_in_eos(corpus):
    task = {"name": "chitchat", "data": str(corpus)}
    env = make_env(task)
    module = GeneratorRLModule(
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config={"task": task, "model": TINY_MODEL},
    )
    gen = make_generator(
        RunConfig.model_validate({"task": task, "model": TINY_MODEL, "algo": {"name": "mle"}}), env.task
    )
    gen.load_state_dict(module.generator.state_dict())
    batch = env.task.sample_prompts(np.random.default_rng(0), 8, with_targets=True)  # references, then <eos>
    tokens = batch.tgt
    mask = np.arange(tokens.shape[1])[None] < batch.tgt_len[:, None]
    obs = observations(env, batch.src, batch.src_len, tokens)
    with torch.no_grad():
        ours = module_logp(module, obs, tokens)
        ref = gen.logprobs(torch.as_tensor(batch.src), torch.as_tensor(batch.src_len), torch.as_tensor(tokens)).logp
    torch.testing.assert_close(ours[mask], ref[torch.as_tensor(mask)], atol=1e-5, rtol=0)
