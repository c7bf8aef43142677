"""Names of the built-in algorithms and tasks, and the classes behind them.

A name resolves to a class that is imported on first use, so this foundation module imports nothing above
it: configs validate names here and read what the class declares (the ``algo.*`` / ``task.*`` keys it reads,
its default values) without loading torch-heavy modules until a name is actually looked up.

What a class declares (class attributes):

- algorithms: ``params`` — the ``algo.*`` keys the update reads besides :data:`COMMON_ALGO_KEYS`;
  ``defaults`` — the algorithm's own values of shared keys (SeqGAN-PPO-dynamic's clip bounds of Tuan et al.
  Supplement C), resolved into the config once, so a run's ``config.yaml`` shows what the learner uses;
  ``adversarial`` — trains SeqGAN's discriminator (reads ``disc.*``); ``monte_carlo`` — its Q comes from
  SeqGAN's Monte-Carlo search with a rollout policy G_β; ``uses_critic`` — the learner keeps a critic V_ψ;
  ``needs_references`` — needs a task with reference replies; ``needs_task_reward`` — needs a task reward.
- tasks: ``params`` — the ``task.*`` keys the task reads besides ``name``; ``has_reward`` — a task reward
  exists; ``has_references`` — inputs have reference replies (BLEU increments ΔR are defined);
  ``scored_remotely`` — the reward is expensive enough for the scorer actors.
"""

from __future__ import annotations

import importlib

ALGORITHMS: dict[str, str] = {
    "mle": "rayseq.algos.mle:MLE",
    "reinforce": "rayseq.algos.reinforce:Reinforce",
    "mixer": "rayseq.algos.mixer:Mixer",
    "mixer_ppo": "rayseq.algos.mixer:MixerPPO",
    "mixer_ppo_dynamic": "rayseq.algos.mixer:MixerPPODynamic",
    "ppo": "rayseq.algos.ppo:PPO",
    "ppo_dynamic": "rayseq.algos.ppo_dynamic:PPODynamic",
    "seqgan": "rayseq.algos.seqgan:SeqGAN",
    "seqgan_ppo": "rayseq.algos.seqgan:SeqGANPPO",
    "seqgan_ppo_dynamic": "rayseq.algos.seqgan:SeqGANPPODynamic",
    "scst": "rayseq.algos.scst:SCST",
    "scheduled_sampling": "rayseq.algos.scheduled_sampling:ScheduledSampling",
    "raml": "rayseq.algos.raml:RAML",
    "data_noising": "rayseq.algos.data_noising:DataNoising",
    "spg": "rayseq.algos.spg:SPG",
    "erpo_interpolation": "rayseq.algos.erpo_interpolation:ERPOInterpolation",
    "actor_critic": "rayseq.algos.actor_critic:ActorCritic",
    "seqgan_critic": "rayseq.algos.seqgan_critic:SeqGANCritic",
}
TASKS: dict[str, str] = {
    "counting": "rayseq.tasks.counting:CountingTask",
    "oracle": "rayseq.tasks.oracle:OracleTask",
    "chitchat": "rayseq.tasks.chitchat:ChitchatTask",
}
# algo.* keys every algorithm reads: its name, the learning rate of the algorithm stage, the gradient clip
COMMON_ALGO_KEYS = ("name", "lr", "max_grad_norm")


def _load(kind: str, table: dict[str, str], name: str):
    try:
        path = table[name]
    except KeyError:
        raise ValueError(f"{kind}.name: unknown {kind} {name!r}; known: {', '.join(table)}") from None
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def algorithm_class(name: str):
    """The class of algorithm ``name`` (a key of :data:`ALGORITHMS`)."""
    return _load("algo", ALGORITHMS, name)


def task_class(name: str):
    """The class of task ``name`` (a key of :data:`TASKS`)."""
    return _load("task", TASKS, name)


def names_with(kind: str, **traits) -> list[str]:
    """Built-in names of ``kind`` (``algo`` or ``task``) whose class has these trait values (for messages)."""
    table, load = (ALGORITHMS, algorithm_class) if kind == "algo" else (TASKS, task_class)
    return [n for n in table if all(getattr(load(n), k) == v for k, v in traits.items())]
