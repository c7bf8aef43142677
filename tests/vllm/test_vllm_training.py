"""GRPO trains the tiny GPT-2 on vLLM rollouts (``rollout.engine=vllm``): the reward rises; after every weights sync
the engine's received weights are the learner's (checksum) and the run says so (``sync/engine_checksum_diff`` 0); the
worker holds no copy of the policy; the engine's log-probs travel with the rollout, the learner computes the policy's
beside them, their mismatch reported (``rollout/logp_diff_*``, ``rollout/engine_kl``) and corrected
(``rollout/is_weight_mean``)."""

from __future__ import annotations

import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayseq.config import ConfigError, build_config
from rayseq.distributed.driver import Trainer
from tests.vllm.conftest import ENGINE_KWARGS

TINY = ["task.name=pairs", "task.test_size=100", "task.val_size=10", "train.pretrain_iters=0", "train.iters=12",
        "train.batch_size=16", "train.eval_every=0", "algo.name=grpo", "algo.group_size=4", "algo.minibatch_size=64",
        "algo.lr=0.03", "progress=false", "seed=0", "reward.fn=tests.vllm.test_vllm_training:share_of_e"]
SIZED = f"rollout.engine_kwargs={{kv_cache_memory_bytes: {ENGINE_KWARGS['kv_cache_memory_bytes']}}}"


def share_of_e(prompts, replies, references):
    """A reward the random tiny model can learn in a few GRPO iterations: the share of e's in the reply."""
    return [r.count("e") / max(len(r), 1) for r in replies]


def vllm_config(corpus, model_dir, *extra, run_dir, sized: bool = True):
    """The tiny GRPO run on vLLM rollouts; ``sized``: with the engine's key/value cache set (64 MiB), else vLLM's
    memory as rayseq sizes it by default."""
    return build_config(None, [*TINY, *([SIZED] if sized else []), f"task.data={corpus}", "model.arch=hf",
                               f"model.path={model_dir}", "rollout.engine=vllm", f"run_dir={run_dir}", *extra])


def train_rows(run_dir) -> list[dict]:
    return [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r["stage"] == "train"]


def test_bad_engine_config(corpus, vllm_hf_dir):
    with pytest.raises(ConfigError, match="rollout.engine=vllm samples Hugging Face policies"):
        build_config(None, ["rollout.engine=vllm"])
    with pytest.raises(ConfigError, match="rollout.engine_kwargs: read only by rollout.engine=vllm"):
        build_config(None, ["rollout.engine_kwargs={dtype: bfloat16}"])
    with pytest.raises(ConfigError, match="rollout.engine"):
        build_config(None, ["rollout.engine=sglang"])


def check_engine_metrics(rows):
    for r in rows:  # every iteration sampled with the learner's weights, its log-probs corrected
        assert r["sync/engine_checksum_diff"] == 0.0
        assert r["rollout/logp_diff_mean"] < 1e-3 and r["rollout/logp_diff_max"] < 1e-2
        assert 0 <= r["rollout/engine_kl"] < 1e-4
        assert r["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)


def test_grpo_on_vllm_rollouts_in_process(corpus, vllm_hf_dir, tmp_path):
    cfg = vllm_config(corpus, vllm_hf_dir, "rollout.num_workers=0", run_dir=tmp_path / "run")
    Trainer(cfg).run()
    rows = train_rows(tmp_path / "run")
    reward = [r["rollout/reward_mean"] for r in rows]
    assert len(reward) == 12
    assert np.mean(reward[-3:]) > np.mean(reward[:3]) + 0.05, reward
    check_engine_metrics(rows)


def test_a_bf16_policy_samples_on_a_bf16_engine(corpus, vllm_hf_dir, tmp_path):
    """model.dtype=bfloat16: the worker's policy frame is bf16 (no weights: the engine holds them), and vLLM runs bf16
    too (its model config's dtype, not float32); every sync loads the policy's bf16 weights (checksum 0); the
    engine's log-probs differ from the learner's (bf16 autocast over fp32 master weights) by bf16 rounding only,
    corrected; the reward rises."""
    import torch

    dtypes = []

    def report(row, trainer):
        engine = trainer.groups.rollout.local.engine
        dtypes.append((engine.llm.llm_engine.model_config.dtype, next(engine.policy.model.parameters()).dtype))

    cfg = vllm_config(corpus, vllm_hf_dir, "rollout.num_workers=0", "model.dtype=bfloat16", run_dir=tmp_path / "run")
    Trainer(cfg, report=report).run()
    assert set(dtypes) == {(torch.bfloat16, torch.bfloat16)}
    rows = train_rows(tmp_path / "run")
    reward = [r["rollout/reward_mean"] for r in rows]
    assert len(reward) == 12
    assert np.mean(reward[-3:]) > np.mean(reward[:3]) + 0.05, reward
    for r in rows:
        assert r["sync/engine_checksum_diff"] == 0.0
        assert r["rollout/logp_diff_mean"] < 0.01 and 0 <= r["rollout/engine_kl"] < 1e-3  # seen: 0.003, 2e-5
        assert r["rollout/is_weight_mean"] == pytest.approx(1.0, abs=0.01)


@pytest.mark.ray
def test_grpo_on_vllm_rollouts_on_ray_workers(ray_session, corpus, vllm_hf_dir, tmp_path):
    """The same on a Ray rollout worker (vLLM inside the actor): the weights reach the engine there."""
    cfg = vllm_config(corpus, vllm_hf_dir, "rollout.num_workers=1", "rollout.num_cpus_per_worker=1",
                      "scorer.num_scorers=0", "learner.num_cpus=1", "train.iters=4", run_dir=tmp_path / "run")
    Trainer(cfg).run()
    rows = train_rows(tmp_path / "run")
    assert len(rows) == 4 and all(r["rollout/staleness"] == 0 for r in rows)
    check_engine_metrics(rows)


@pytest.mark.ray
def test_grpo_on_vllm_rollouts_with_weights_over_the_collective(ray_session, corpus, vllm_hf_dir, tmp_path):
    """rollout.weight_sync=collective to a Ray worker running vLLM: every version reaches the worker over the gloo
    group (its checksum checked there), the engine runs it (``sync/engine_checksum_diff`` 0), and the reward rises."""
    loads = []

    def report(row, trainer):
        if row["stage"] == "train":
            trainer.groups.rollout.sync_weights()
            trainer.groups.rollout.transport.wait()
            loads.append([(s["loads"], s["collective_loads"]) for s in trainer.groups.rollout.stats()])

    cfg = vllm_config(corpus, vllm_hf_dir, "rollout.num_workers=1", "rollout.num_cpus_per_worker=1",
                      "scorer.num_scorers=0", "learner.num_cpus=1", "rollout.weight_sync=collective",
                      run_dir=tmp_path / "run")
    Trainer(cfg, report=report).run()
    rows = train_rows(tmp_path / "run")
    reward = [r["rollout/reward_mean"] for r in rows]
    assert len(reward) == 12
    assert np.mean(reward[-3:]) > np.mean(reward[:3]) + 0.05, reward
    check_engine_metrics(rows)
    assert [c for (_, c), in loads] == list(range(2, 14)) and all(n == c for (n, c), in loads)  # all over gloo


@pytest.mark.ray
def test_two_workers_train_with_the_engine_memory_left_to_rayseq(ray_session, corpus, vllm_hf_dir, tmp_path):
    """rollout.engine=vllm alone, two workers on one machine: each engine takes a share of the node's memory
    (vLLM's own default reserves 92% of the machine for the first engine, and the second could not start); for the
    tiny model, what its sequences can fill (32 MiB), said at start; the run trains."""
    cfg = vllm_config(corpus, vllm_hf_dir, "rollout.num_workers=2", "rollout.num_cpus_per_worker=1",
                      "scorer.num_scorers=0", "learner.num_cpus=1", "train.iters=4", run_dir=tmp_path / "run",
                      sized=False)
    assert cfg.rollout.engine_kwargs == {}
    memory = []

    def report(row, trainer):
        if not memory:
            memory.extend(s["engine_memory"] for s in trainer.groups.rollout.stats())

    Trainer(cfg, report=report).run()
    rows = train_rows(tmp_path / "run")
    assert len(rows) == 4 and all(r["rollout/live_workers"] == 2 for r in rows)
    check_engine_metrics(rows)
    # 2 layers × 1 head × 32 dims × keys and values × fp32 = 512 bytes a token; 256 sequences of 128 (+128) tokens
    assert len(memory) == 2
    for m in memory:
        assert m.startswith(f"kv_cache_memory_bytes={512 * 256 * 256} (32 MiB: what 256 sequences of 128 tokens "
                            "fill; at most 0.5 of the "), m
        assert m.endswith(" GiB available on its node over its 2 engines)"), m


@pytest.mark.ray
def test_an_engine_that_cannot_reserve_its_memory_ends_the_run_at_once(ray_session, corpus, vllm_hf_dir, tmp_path):
    """An engine whose memory the node cannot give (99% of the machine, as vLLM reserves on CPUs): the worker's
    constructor raises, and the run ends as it does with one line naming the worker, vLLM's error and the key to
    change (no wait for a re-creation that would fail the same way)."""
    from rayseq.distributed.groups.startup import StartupFailed

    cfg = vllm_config(corpus, vllm_hf_dir, "rollout.num_workers=1", "rollout.num_cpus_per_worker=1",
                      "scorer.num_scorers=0", "learner.num_cpus=1",
                      "rollout.engine_kwargs={gpu_memory_utilization: 0.99}", run_dir=tmp_path / "run", sized=False)
    t0 = time.monotonic()
    with pytest.raises(StartupFailed, match=r"^rollout worker 0 on node [0-9a-f]{56} \(\S+\) could not start: "
                                            r"ValueError: Available memory on node \d+ .* is less than desired CPU "
                                            r"memory utilization \(0.99, .*\(the key to change: "
                                            r"rollout.engine_kwargs\)$"):
        Trainer(cfg).run()
    assert time.monotonic() - t0 < 90  # the actors' processes and vLLM's import, then at once


def test_a_vllm_worker_holds_no_copy_of_the_policy(corpus, vllm_hf_dir, tmp_path):
    """rollout.engine=vllm: the worker builds no Hugging Face policy (no HFCausalLM, no model weights outside the
    engine): it keeps the policy's frame (names and shapes on the meta device), gives the weights to the engine alone,
    and its rollouts carry the engine's log-probs with the policy's left to the learner, which computes them equal to
    the policy's own on the same weights (within 1e-6 in float32) and the truncated importance weights beside them."""
    import gc

    import torch

    from rayseq.algos.common import behaviour_logprobs
    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.actors.worker import RolloutWorker
    from rayseq.models.hf import HFCausalLM, HFPolicyFrame
    from rayseq.types import RolloutRequest

    def policies() -> set[int]:
        gc.collect()
        return {id(o) for o in gc.get_objects() if isinstance(o, HFCausalLM)}

    cfg = vllm_config(corpus, vllm_hf_dir, "rollout.num_workers=0", run_dir=tmp_path / "run")
    learner = Learner(cfg)
    learner.start_stage("train")
    before = policies()
    worker = RolloutWorker(cfg)
    assert not policies() - before  # the worker built none (the learner's are the ones there were)
    assert worker.generator is None and isinstance(worker.policy, HFPolicyFrame)
    assert all(t.device.type == "meta" for t in worker.policy.state_dict().values())
    assert not any(isinstance(v, torch.nn.Module) and any(p.device.type != "meta" for p in v.parameters())
                   for v in vars(worker).values())
    with torch.no_grad():  # weights the engine's start (model.path's) do not have
        for p in learner.state.generator.parameters():
            p.add_(0.02 * torch.randn_like(p))
    worker.set_weights(learner.get_weights(), 1)
    assert worker.engine.checksum_diff == 0.0 and worker.stats()["checksum"] == pytest.approx(
        sum(float(p.double().sum()) for p in learner.state.generator.parameters()), rel=1e-12)
    prompts = learner.task.sample_prompts(np.random.default_rng(0), 8)
    rollout = worker.sample(prompts, RolloutRequest(max_len=10, seed=2), score=False)
    assert rollout.logp is None and rollout.is_weights is None and rollout.engine_logp is not None
    behaviour_logprobs(learner.state, rollout, cfg.rollout.logp_correction, cfg.rollout.tis_cap)
    src, src_len, tokens = (torch.from_numpy(a) for a in (rollout.src, rollout.src_len, rollout.tokens))
    with torch.no_grad():  # the policy's own teacher-forced log-probs on the same weights
        want = learner.state.generator.eval().logprobs(src, src_len, tokens).logp * torch.from_numpy(
            rollout.action_mask)
    np.testing.assert_allclose(rollout.logp, want.numpy(), rtol=0, atol=1e-6)
    sampled = rollout.action_mask > 0  # the engine's are those up to float32 kernels' rounding, the weights near 1
    assert np.abs(rollout.logp - rollout.engine_logp)[sampled].max() < 1e-3
    want_w = np.where(sampled, np.minimum(np.exp(rollout.logp - rollout.engine_logp), cfg.rollout.tis_cap), 1.0)
    np.testing.assert_allclose(rollout.is_weights, want_w, rtol=1e-6)


def test_a_lora_worker_keeps_its_policy_and_the_learner_computes_the_log_probs(corpus, vllm_hf_dir, tmp_path):
    """model.lora_r > 0 with vLLM: the adapters are merged into base weights on the worker, so it keeps the whole
    policy (HFCausalLM) beside the engine; its rollouts' log-probs are still the learner's to compute."""
    import torch

    from rayseq.algos.common import behaviour_logprobs
    from rayseq.distributed.actors.learner import Learner
    from rayseq.distributed.actors.worker import RolloutWorker
    from rayseq.models.hf import HFCausalLM
    from rayseq.types import RolloutRequest

    cfg = vllm_config(corpus, vllm_hf_dir, "rollout.num_workers=0", "model.lora_r=4", run_dir=tmp_path / "run")
    learner = Learner(cfg)
    learner.start_stage("train")
    with torch.no_grad():  # adapters that change the model (peft starts B at 0)
        for name, p in learner.state.generator.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    worker = RolloutWorker(cfg)
    assert isinstance(worker.generator, HFCausalLM) and worker.policy is worker.generator
    worker.set_weights(learner.get_weights(), 1)
    assert worker.engine.checksum_diff < 1e-12
    rollout = worker.sample(learner.task.sample_prompts(np.random.default_rng(0), 6),
                            RolloutRequest(max_len=8, seed=1), score=False)
    assert rollout.logp is None and rollout.engine_logp is not None
    behaviour_logprobs(learner.state, rollout, "tis", cfg.rollout.tis_cap)
    sampled = rollout.action_mask > 0
    assert np.abs(rollout.logp - rollout.engine_logp)[sampled].max() < 1e-3  # the adapted model on both sides


@pytest.mark.ray
def test_the_evaluation_is_decoded_by_vllm_on_the_workers(ray_session, corpus, vllm_hf_dir, tmp_path):
    """val/* and test/* decoded by vLLM on 2 Ray workers, scored on the learner: the figures of greedy replies equal
    the learner's own evaluation with the built-in loop (vLLM's greedy replies are the policy's on this model);
    those of sampled replies (``reward``) are vLLM's draws."""
    from rayseq.distributed.groups import ActorGroups
    from rayseq.tasks import make_task

    cfg = vllm_config(corpus, vllm_hf_dir, "rollout.num_workers=2", "rollout.num_cpus_per_worker=1",
                      "scorer.num_scorers=0", "learner.num_cpus=1", run_dir=tmp_path / "run")
    task = make_task(cfg.task, cfg.reward)
    groups = ActorGroups(cfg)
    try:
        for split in ("val", "test"):
            remote, _ = groups.evaluate(split, task.eval_decodes(split))
            local, _ = groups.learner.evaluate(split)
            assert sorted(remote) == sorted(local)
            greedy = [k for k in local if not k.startswith(f"{split}/reward")]
            assert {k: remote[k] for k in greedy} == {k: local[k] for k in greedy}, split
    finally:
        groups.shutdown()
