"""Built-in environments: guess-the-number, tic-tac-toe and a grid world (the protocol of
:mod:`rayseq.episodes.protocol`).

Both are deterministic given the episode's seed (the G episodes of a GRPO group play the same game), need nothing
but the standard library, and declare their ``vocabulary`` (every word they write and every action they accept), so
a policy trained from scratch reads one token per word (``task.vocabulary=env``).

Guess-the-number is tinker-cookbook's multi-turn recipe (``recipes/multiplayer_rl/guess_number``): a hidden integer
in [lo, hi], at most ``max_guesses`` guesses, each answered "higher" or "lower", reward 1 on a hit. The first integer
in a reply is its guess; a reply without one (or out of range) is answered "invalid" and costs a guess. Binary search
finds at most 2^``max_guesses`` − 1 secrets: every game of 0–100 in 7, 15 of 16 at 0–15 in 4, 1,023 of 1,025 at
0–1024 in 10. With ``warmer`` > 0 every guess after the first also earns a per-turn reward: +``warmer`` when it is
nearer the secret than the guess before it ("warmer"), −``warmer`` when it is not, or is invalid ("colder"): the
intermediate turns carry credit of their own.

Tic-tac-toe: the policy plays x and moves first, against a random opponent (seeded by the episode's seed) or a
fixed one (the first free cell). A move is the first digit 1–9 in the reply (cells row by row); an occupied cell or
none loses at once. Rewards: win 1, draw 0, loss −1; ``info["outcome"]`` says which.

Grid world: a ``size`` × ``size`` grid of text, the agent at a start cell drawn from the seed, the goal in the far
corner; each turn the observation says both cells (``at 0 2 goal 3 3``) and the action is the first of ``up``,
``down``, ``left``, ``right`` in the reply (none, or a move into the wall: the agent stays, ``wall``). Every move
costs ``step_cost``; reaching the goal gives 1 and ends the episode (success); after ``max_steps`` moves it ends.
"""

from __future__ import annotations

import random
import re

_INT = re.compile(r"-?\d+")


class GuessNumber:
    """Guess a hidden integer in [lo, hi] in at most ``max_guesses`` guesses (module docstring)."""

    def __init__(self, lo: int = 0, hi: int = 1024, max_guesses: int = 10, warmer: float = 0.0):
        if hi <= lo or max_guesses < 1:
            raise ValueError(f"guess_number: need lo < hi and max_guesses >= 1 (got {lo}, {hi}, {max_guesses})")
        if warmer < 0:
            raise ValueError(f"guess_number: warmer={warmer} is the size of the warmer/colder reward, >= 0")
        self.lo, self.hi, self.max_guesses, self.warmer = int(lo), int(hi), int(max_guesses), float(warmer)
        self.vocabulary = [str(i) for i in range(self.lo, self.hi + 1)] + [
            "guess", "a", "number", "from", "to", "in", "guesses", "higher", "lower", "correct", "invalid"]

    def reset(self, seed: int, **row) -> str:
        self.secret = random.Random(int(seed)).randint(self.lo, self.hi)
        self.guesses = 0
        self.distance = None  # of the last valid guess from the secret
        return f"guess a number from {self.lo} to {self.hi} in {self.max_guesses} guesses"

    def step(self, action: str):
        self.guesses += 1
        found = _INT.search(action)
        guess = int(found.group()) if found else None
        left = self.guesses < self.max_guesses
        if guess is None or not self.lo <= guess <= self.hi:
            return "invalid", -self.warmer, not left, {"success": False, "valid": False}
        shaped = self._warmer(abs(guess - self.secret))
        if guess == self.secret:
            return "correct", 1.0 + shaped, True, {"success": True, "valid": True}
        return ("higher" if guess < self.secret else "lower"), shaped, not left, {"success": False, "valid": True}

    def _warmer(self, distance: int) -> float:
        """The warmer/colder reward of a valid guess ``distance`` from the secret (0 for the first, or warmer=0)."""
        before, self.distance = self.distance, distance
        if not self.warmer or before is None:
            return 0.0
        return self.warmer if distance < before else -self.warmer


_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def _winner(board: list[str]) -> str | None:
    for a, b, c in _LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return None


class TicTacToe:
    """Tic-tac-toe as x against a random or fixed opponent (module docstring)."""

    def __init__(self, opponent: str = "random"):
        if opponent not in ("random", "first"):
            raise ValueError(f"tictactoe: opponent={opponent!r}: random or first")
        self.opponent = opponent
        self.vocabulary = ["x", "o", ".", "/", "board", "your", "move", "win", "draw", "loss", "illegal",
                           *[str(i) for i in range(1, 10)]]

    def _text(self) -> str:
        b = self.board
        return f"board {' '.join(b[0:3])} / {' '.join(b[3:6])} / {' '.join(b[6:9])} your move"

    def reset(self, seed: int, **row) -> str:
        self.board = ["."] * 9
        self.rng = random.Random(int(seed))
        return self._text()

    def _end(self, outcome: str, reward: float):
        return outcome, reward, True, {"outcome": outcome, "success": outcome == "win"}

    def step(self, action: str):
        found = re.search(r"[1-9]", action)
        cell = int(found.group()) - 1 if found else None
        if cell is None or self.board[cell] != ".":
            return self._end("illegal", -1.0)
        self.board[cell] = "x"
        if _winner(self.board) == "x":
            return self._end("win", 1.0)
        free = [i for i, c in enumerate(self.board) if c == "."]
        if not free:
            return self._end("draw", 0.0)
        self.board[self.rng.choice(free) if self.opponent == "random" else free[0]] = "o"
        if _winner(self.board) == "o":
            return self._end("loss", -1.0)
        if "." not in self.board:
            return self._end("draw", 0.0)
        return self._text(), 0.0, False, {}


_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


class GridWorld:
    """A text grid world with step costs (module docstring)."""

    def __init__(self, size: int = 4, step_cost: float = 0.05, max_steps: int = 8):
        if size < 2 or max_steps < 1 or step_cost < 0:
            raise ValueError(f"gridworld: need size >= 2, max_steps >= 1, step_cost >= 0 (got {size}, {max_steps}, "
                             f"{step_cost})")
        self.size, self.step_cost, self.max_steps = int(size), float(step_cost), int(max_steps)
        self.goal = (self.size - 1, self.size - 1)
        self.vocabulary = ["at", "goal", "wall", *_MOVES, *[str(i) for i in range(self.size)]]

    def _text(self, prefix: str = "") -> str:
        return f"{prefix}at {self.pos[0]} {self.pos[1]} goal {self.goal[0]} {self.goal[1]}"

    def reset(self, seed: int, **row) -> str:
        rng = random.Random(int(seed))
        cells = [(r, c) for r in range(self.size) for c in range(self.size) if (r, c) != self.goal]
        self.pos = rng.choice(cells)
        self.steps = 0
        return self._text()

    def step(self, action: str):
        self.steps += 1
        found = re.search(r"up|down|left|right", action)
        dr, dc = _MOVES[found.group()] if found else (0, 0)
        r, c = self.pos[0] + dr, self.pos[1] + dc
        moved = found is not None and 0 <= r < self.size and 0 <= c < self.size
        if moved:
            self.pos = (r, c)
        if self.pos == self.goal:
            return "goal", 1.0 - self.step_cost, True, {"success": True}
        return (self._text("" if moved else "wall ")), -self.step_cost, self.steps >= self.max_steps, {
            "success": False}


def binary_search_wins(lo: int, hi: int, max_guesses: int) -> int:
    """How many secrets in [lo, hi] a binary search (guess the middle of what is left) finds in ``max_guesses``: the
    analytic ceiling of guess-the-number (1,023 of 1,025 at 0–1024 in 10)."""
    wins = 0
    for secret in range(lo, hi + 1):
        a, b = lo, hi
        for _ in range(max_guesses):
            g = (a + b) // 2
            if g == secret:
                wins += 1
                break
            a, b = (g + 1, b) if g < secret else (a, g - 1)
    return wins
