"""rayseq's generator and value baseline as an RLlib RLModule (torch, RLlib's new API stack), so that RLlib's PPO
trains exactly the network rayseq trains.

:class:`GeneratorRLModule` reads the observations of :class:`rayseq.envs.env.SeqEnv` (a prompt and the reply so
far) and returns

- the logits of the next token: the generator's own teacher-forced pass over ``<bos>, y_1..y_t``
  (:meth:`rayseq.models.generator.Seq2SeqGRU.logprobs`), read at position t. A step costs O(t) decoder steps (no
  recurrent state is carried between env steps); the result equals rayseq's incremental decoding. Ids the
  generator never emits (``<pad>``, ``<bos>``, a task's banned ids) get the logit ``BANNED_LOGIT`` instead of −inf
  (probability exactly 0 in float32 either way), which keeps RLlib's entropy and KL terms finite;
- the value V(s_t): rayseq's value baseline (:class:`rayseq.models.baseline.ValueBaseline`, Ranzato et al.: a
  linear map of the detached decoder state that produces y_{t+1}'s distribution), so the value loss never reaches
  the generator, as in rayseq's own algorithms.

``model_config`` (``RLModuleSpec(module_class=GeneratorRLModule, model_config={...})``):

- ``checkpoint``: a rayseq run directory, checkpoint file or URI: the generator and baseline are built from that
  run's config and task and load its weights (an MLE-pretrained run, as ``train.init_from`` uses it; the baseline
  stays zero where that run's algorithm held none); or
- ``task`` (what ``rayseq.envs.make_env`` takes: a name, an import path, a ``task:`` mapping) and ``model`` (a
  ``model:`` mapping, e.g. ``{"hidden_dim": 32}``; rayseq's defaults otherwise): a freshly initialised generator.

RLlib's PPO optimises generator and baseline with one learning rate (rayseq: ``algo.lr`` and ``algo.baseline_lr``)
and scales the value loss by ``vf_loss_coeff``; the detached baseline input keeps the two apart as in rayseq.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule

from rayseq.checkpoint import algorithm_entries, load_checkpoint, resolve_checkpoint
from rayseq.config import RunConfig, build_config
from rayseq.envs.env import task_config, task_section
from rayseq.models.baseline import ValueBaseline
from rayseq.models.factory import make_generator
from rayseq.tasks import make_task

BANNED_LOGIT = -1e9  # in place of −inf: exp(−1e9 − max) is 0 in float32, so log-probs and samples are unchanged


def generator_source(model_config: dict) -> tuple[RunConfig, dict | None, str]:
    """(run config to build the generator from, the learner state to load or None, a description for messages)
    from a module's ``model_config`` (module docstring)."""
    checkpoint = model_config.get("checkpoint")
    if checkpoint is not None:
        if model_config.get("task") is not None or model_config.get("model") is not None:
            raise ValueError("model_config: give either checkpoint (its run's task and model are used) or task/model")
        location = resolve_checkpoint(checkpoint)
        ck = load_checkpoint(location)  # the generator and the value baseline
        return RunConfig.model_validate(ck["config"]), ck["learner"], location
    if model_config.get("task") is None:
        raise ValueError("model_config: give checkpoint=RUN_DIR (a rayseq run) or task=NAME (and model={...})")
    task_cfg, _ = task_config(model_config["task"])
    model = dict(model_config.get("model") or {})
    cfg = build_config({"task": task_section(task_cfg), "model": model, "algo": {"name": "mle"}})
    return cfg, None, f"task {cfg.task.name}"


class GeneratorRLModule(TorchRLModule, ValueFunctionAPI):
    """rayseq's generator π_θ(y_{t+1} | x, y_1..y_t) and baseline b(s_t) on :class:`rayseq.envs.env.SeqEnv`
    observations (module docstring)."""

    def setup(self):
        cfg, learner_state, source = generator_source(dict(self.model_config or {}))
        task = make_task(cfg.task)  # vocabulary size, special ids, banned ids, conditional or not
        self.generator = make_generator(cfg, task)
        self.baseline = ValueBaseline(self.generator.state_dim)
        if learner_state is not None:
            self.generator.load_state_dict(learner_state["generator"])
            entries = algorithm_entries(learner_state)  # the value baseline is the algorithm's, where it holds one
            if "baseline" in entries:
                self.baseline.load_state_dict(entries["baseline"])
        self.max_src_len = int(task.max_src_len)
        n = getattr(self.action_space, "n", None)
        if n is not None and int(n) != self.generator.vocab_size:
            raise ValueError(
                f"{source}: the generator's vocabulary has {self.generator.vocab_size} tokens but the "
                f"environment's action space {n}: build both from the same task"
            )

    def _logits_and_states(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """obs: prompt (B, S), prompt_len (B,), prefix (B, T), prefix_len (B,) -> logits (B, V) of the next token,
        decoder states (B, H) that produce them."""
        prefix, t = obs["prefix"].long(), obs["prefix_len"].long().reshape(-1)
        B = prefix.shape[0]
        # y_1..y_T and one more slot: position t of the teacher-forced pass has read <bos>, y_1..y_t
        tokens = torch.cat([prefix, prefix.new_full((B, 1), self.generator.pad_id)], dim=1)  # (B, T + 1)
        src = obs["prompt"].long()[:, : self.max_src_len]  # unconditional tasks: (B, 0), ignored
        out = self.generator.logprobs(src, obs["prompt_len"].long().reshape(-1), tokens)
        rows = torch.arange(B, device=prefix.device)
        logits = out.logits[rows, t]  # (B, V)
        return logits.masked_fill(torch.isneginf(logits), BANNED_LOGIT), out.states[rows, t]

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        logits, _ = self._logits_and_states(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: logits}

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        logits, states = self._logits_and_states(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: logits, Columns.EMBEDDINGS: states}

    def compute_values(self, batch: dict[str, Any], embeddings: Any | None = None) -> torch.Tensor:
        """V(s_t) (B,): the baseline on the (detached) decoder state of ``_forward_train``, or of a fresh pass."""
        if embeddings is None:
            _, embeddings = self._logits_and_states(batch[Columns.OBS])
        return self.baseline(embeddings)
