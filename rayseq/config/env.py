"""The ``env:`` section: the environment a policy acts in, episode by episode (rayseq.episodes).

Setting ``env.name`` makes the run's task the episodes' (``task.name=env``, derived) and its rollouts episodes: the
rollout workers run them (the environments in their own process, or in actors with ``env.num_actors``), and every
rollout algorithm trains on them (GRPO's G samples of a prompt are G episodes from one seed).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from rayseq import registry
from rayseq.config.base import Section


class EnvConfig(Section):
    """An environment and the limits of its episodes."""

    name: str | None = Field(
        None, description="The environment: a built-in (guess_number, tictactoe, gridworld) or your own class as an "
        "import path package.module:Class with reset(seed, **row) and step(action) -> (observation, reward, done, "
        "info) (rayseq/episodes/protocol.py). None: no environment.")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the environment's class (guess_number: lo, hi, "
        "max_guesses, warmer; tictactoe: opponent; gridworld: size, step_cost, max_steps; your class: its own).")
    max_turns: int = Field(10, ge=1, description="Actions per episode at most; then it ends (truncated).")
    max_tokens: int = Field(
        256, ge=1, description="Tokens of an episode after its first prompt at most (actions and observations); an "
        "episode whose next turn would not fit ends (truncated).")
    max_action_tokens: int = Field(16, ge=1, description="Tokens of one action at most (it is cut there).")
    system_prompt: str | None = Field(None, description="A system message put before every episode's first "
                                      "observation.")
    chat_template: str | None = Field(
        None, description="model.arch=hf: a Jinja chat template replacing the tokenizer's (observations are rendered "
        "as its suffix); None: the tokenizer's own.")
    rows: str | None = Field(
        None, description="A JSON-lines file of rows: episode k's reset gets row (seed mod rows) as keyword "
        "arguments (a dataset's columns); None: reset(seed) alone.")
    step_timeout_s: float | None = Field(
        30.0, gt=0, description="Seconds one reset or step may take; past it the episode ends as a failure "
        "(episode/timeouts) and the run goes on. None: no limit (calls run in the worker's thread).")
    max_concurrent: int = Field(
        64, ge=1, description="Environment calls in flight at once per worker (in-process threads) or per actor.")
    num_actors: int = Field(
        0, ge=0, description="Ray actors holding the environments (a pool shared by a worker's episodes, each actor "
        "up to env.max_concurrent of them), for heavy or unsafe environments: a hung one is killed and replaced. 0: in "
        "the rollout worker's process.")
    num_cpus_per_actor: float = Field(0.0, ge=0, description="CPUs each environment actor reserves.")
    transcripts: int = Field(4, ge=0, description="Episodes written as text to the run's viewer/ at each evaluation.")

    @field_validator("name")
    @classmethod
    def _resolves(cls, v: str | None) -> str | None:
        if v is not None:
            registry.environment_factory(v)  # ValueError saying what is wrong (a module not found, no such class)
        return v
