"""An OpenEnv environment as ``openenv init`` lays one out (models, the environment, its server's app), for the
OpenEnv adapter's tests: guess a number in 1..20, answered higher or lower, reward 1 on a hit, at most 5 guesses."""

from __future__ import annotations

import random
import re

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    message: str = Field(..., description="the guess")


class GuessObservation(Observation):
    text: str = Field(default="", description="what the game says")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self.secret = random.Random(seed).randint(1, 20)
        self._state = State(step_count=0)
        return GuessObservation(text="guess a number from 1 to 20", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        found = re.search(r"\d+", action.message)
        guess = int(found.group()) if found else None
        last = self._state.step_count >= 5
        if guess == self.secret:
            return GuessObservation(text="correct", done=True, reward=1.0, metadata={"success": True})
        text = "invalid" if guess is None else ("higher" if guess < self.secret else "lower")
        return GuessObservation(text=text, done=last, reward=0.0, metadata={"success": False})

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=16)
