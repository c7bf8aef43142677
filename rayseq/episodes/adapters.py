"""Adapters: the environment packages users already have, in the protocol of :mod:`rayseq.episodes.protocol`.

Each is a class taking ``env.kwargs`` and named by a built-in ``env.name``:

- ``trl`` — :class:`TRLEnvironment`: a class written for TRL's ``GRPOTrainer(environment_factory=...)``, run
  unchanged: its ``reset(**row)`` gives text appended to the row's prompt, its public methods are the tools the
  policy calls, ``get_reward()`` scores the episode when the policy answers without a tool call.
- ``reasoning_gym`` — :class:`ReasoningGym`: one of reasoning-gym's procedural tasks (countdown, basic_arithmetic,
  ...) as a single-turn episode scored by the task's own ``score_answer``.
- ``textarena`` — :class:`TextArena`: a TextArena game, the policy as one player, the others played by a fixed
  opponent.
- ``gem`` — :class:`GEM`: a GEM (``gem-llm``) environment, Gymnasium-style ``reset``/``step``.
- ``openenv`` — :class:`OpenEnv`: an OpenEnv environment served by its own server process, reached through its
  client.

The packages are not rayseq's dependencies: each adapter imports its package when it is made, and says which extra
installs it when it is missing. Environments that fetch files at run time (word lists, Hugging Face datasets) are
refused before the run starts (``downloads``, :class:`rayseq.episodes.protocol.DownloadRefused`).
"""

from __future__ import annotations

import atexit
import importlib
import inspect
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from rayseq.episodes.protocol import EnvError

EXTRAS = {  # package import name -> (what pip installs, the pyproject extra)
    "reasoning_gym": ("reasoning-gym", "reasoning-gym"),
    "textarena": ("textarena", "textarena"),
    "gem": ("gem-llm", "gem"),
    "openenv": ("openenv-core", "openenv"),
    "trl": ("trl", "peers"),
}


def require(module: str):
    """Import ``module`` (a package an adapter wraps), or :class:`EnvError` saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        pip, extra = EXTRAS.get(top, (top, None))
        how = f'pip install -e ".[{extra}]" (or pip install {pip})' if extra else f"pip install {pip}"
        raise EnvError(f"{module} is not installed ({exc}): {how}; gem-llm and openenv-core pin versions beside "
                       "rayseq's, so install them in an environment of their own (docs/guides/environments.md)"
                       ) from exc


def import_object(path: str, what: str):
    """``package.module:name`` -> the object, or :class:`EnvError` naming ``what``."""
    module, _, name = str(path).partition(":")
    if not name:
        raise EnvError(f"{what}={path!r}: give it as package.module:Name")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise EnvError(f"{what}={path!r}: {type(exc).__name__}: {exc}") from exc


# -- TRL's environment_factory classes ---------------------------------------------------------------------------
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_XML_CALL = re.compile(r"<tool_call>\s*<function=([^\n>]+)>(.*?)</tool_call>", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\s*(.*?)\s*</parameter>", re.DOTALL)
_GLM_CALL = re.compile(r"<tool_call>([^\s<]+)\n?((?:(?!</tool_call>).)*)</tool_call>", re.DOTALL)
_GLM_PARAM = re.compile(r"<arg_key>([^<]+)</arg_key>\s*\n<arg_value>(.*?)</arg_value>", re.DOTALL)
_LLAMA3_CALL = re.compile(r'\{"name":\s*"([^"]+)",\s*"parameters":\s*')

TOOL_FORMATS = {  # env.kwargs.tool_format -> the chat-template families that write their calls so
    "hermes": "<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>: Qwen2.5, Qwen3, Hermes",
    "xml": "<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>: Qwen3.5, "
           "Qwen3-Coder, Nemotron 3",
    "glm": "<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>: GLM-4.5",
    "llama3": "{\"name\": ..., \"parameters\": {...}}: Llama 3.1, 3.2",
    "auto": "each reply read in the format its first call is written in (the four above)",
}


def _unreadable(exc: Exception) -> dict:
    return {"name": "unknown", "error": f"unreadable tool call: {exc}"}


def _hermes(text: str) -> list[dict]:
    calls = []
    for body in _TOOL_CALL.findall(text):
        try:
            call = json.loads(body)
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ValueError("expected {\"name\": ..., \"arguments\": {...}}")
            args = call.get("arguments") or {}
            if isinstance(args, str):
                args = json.loads(args)
            calls.append({"name": call["name"], "arguments": dict(args)})
        except (ValueError, TypeError) as exc:
            calls.append(_unreadable(exc))
    return calls


def _inline_value(raw: str):
    """A value written inline (XML formats): JSON where it reads as JSON, else the text itself (typed later by the
    tool's signature: :func:`typed_arguments`)."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _xml(text: str) -> list[dict]:
    return [{"name": name.strip(), "arguments": {k.strip(): _inline_value(v) for k, v in _XML_PARAM.findall(body)},
             "raw": {k.strip(): v for k, v in _XML_PARAM.findall(body)}}
            for name, body in _XML_CALL.findall(text)]


def _glm(text: str) -> list[dict]:
    return [{"name": name.strip(), "arguments": {k.strip(): _inline_value(v) for k, v in _GLM_PARAM.findall(body)},
             "raw": {k.strip(): v for k, v in _GLM_PARAM.findall(body)}}
            for name, body in _GLM_CALL.findall(text)]


def _llama3(text: str) -> list[dict]:
    calls, decoder, pos = [], json.JSONDecoder(), 0
    while (m := _LLAMA3_CALL.search(text, pos)) is not None:
        try:
            args, end = decoder.raw_decode(text, m.end())
            if not isinstance(args, dict):
                raise ValueError("expected \"parameters\": {...}")
            calls.append({"name": m.group(1), "arguments": args})
            pos = end
        except ValueError as exc:
            calls.append(_unreadable(exc))
            pos = m.end()
    return calls


_PARSERS = {"hermes": _hermes, "xml": _xml, "glm": _glm, "llama3": _llama3}


def parse_tool_calls(text: str, tool_format: str = "hermes") -> list[dict]:
    """The tool calls of a reply, in the format ``tool_format`` (:data:`TOOL_FORMATS`; Hermes by default, the one
    Qwen's and most tool-calling chat templates teach), once per call: ``{"name", "arguments"}``. A call that does not
    parse is kept as ``{"error": ...}`` (answered with the error, as TRL answers a failing call). The XML formats
    write values as text: each is read as JSON where it parses, and :func:`typed_arguments` types it by the tool."""
    if tool_format == "auto":
        if _XML_CALL.search(text):
            tool_format = "xml"
        elif _GLM_PARAM.search(text):
            tool_format = "glm"
        elif _TOOL_CALL.search(text):
            tool_format = "hermes"
        else:
            tool_format = "llama3"
    if tool_format not in _PARSERS:
        raise EnvError(f"env.kwargs.tool_format={tool_format!r}: one of {sorted(TOOL_FORMATS)}")
    return _PARSERS[tool_format](text)


def typed_arguments(tool, call: dict) -> dict:
    """``call``'s arguments for ``tool``: a value written as text (the XML formats') stays text where the tool's
    parameter is annotated ``str``, as TRL types arguments by the tool's schema; every other value as read."""
    raw = call.get("raw")
    if not raw:
        return call["arguments"]
    try:
        params = inspect.signature(tool).parameters
    except (TypeError, ValueError):
        return call["arguments"]
    out = dict(call["arguments"])
    for key, text in raw.items():
        p = params.get(key)
        if p is not None and p.annotation in (str, "str"):
            out[key] = text
    return out


def trl_tools(env) -> list:
    """The tools TRL exposes of an ``environment_factory`` instance: the public functions of its class except
    ``reset`` and ``get_reward``, bound to the instance (TRL lists them on the class, so properties are not run)."""
    return [getattr(env, name) for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


class TRLEnvironment:
    """A class written for TRL's ``GRPOTrainer(environment_factory=...)``, run unchanged.

    The episode: the first observation is the row's ``prompt`` (text or chat messages; from ``env.rows``) with what
    ``reset(**row)`` returns appended to its last user message (TRL's rule; without a prompt, the returned text is the
    observation). Each reply's tool calls (:func:`parse_tool_calls`, in ``tool_format``) are made on the instance's
    public methods and
    answered as ``{"role": "tool", "name", "content": str(result)}`` messages (a call that raises is answered
    ``{"error": ...}``, as TRL does). The episode ends when a reply makes no tool call, or after ``max_calls`` replies
    that did; its reward is then ``get_reward()`` (0 when the class has none), on that last turn.

    Args:
        factory: ``package.module:Class`` (or a function) making the environment with no arguments, as TRL calls it.
        max_calls: replies with tool calls at most (TRL's ``max_tool_calling_iterations``); keep it below
            ``env.max_turns`` so that the episode ends here and is scored.
        seed: pass the episode's seed to ``reset`` as ``seed=`` (only when its signature names ``seed``: TRL never
            passes one). Default: when it names it.
        tool_format: how the policy writes its calls, the chat template's family (:data:`TOOL_FORMATS`): ``hermes``
            (default), ``xml``, ``glm``, ``llama3`` or ``auto``.
    """

    def __init__(self, factory: str, max_calls: int = 8, seed: bool | None = None, tool_format: str = "hermes"):
        if tool_format not in TOOL_FORMATS:
            raise EnvError(f"env.kwargs.tool_format={tool_format!r}: one of "
                           + "; ".join(f"{k} ({v})" for k, v in TOOL_FORMATS.items()))
        self.tool_format = tool_format
        maker = import_object(factory, "env.kwargs.factory")
        self.env = maker()
        if not callable(getattr(self.env, "reset", None)):
            raise EnvError(f"env.kwargs.factory={factory}: {type(self.env).__name__} has no reset() (TRL's "
                           "environment_factory contract)")
        if max_calls < 1:
            raise EnvError(f"env.kwargs.max_calls={max_calls}: at least 1")
        self.max_calls = int(max_calls)
        self.tools = trl_tools(self.env)
        self._by_name = {t.__name__: t for t in self.tools}
        named = "seed" in inspect.signature(self.env.reset).parameters
        self._pass_seed = named if seed is None else bool(seed)

    def reset(self, seed: int, **row):
        kwargs = dict(row, seed=int(seed)) if self._pass_seed else row
        extra = self.env.reset(**kwargs)
        self.calls = 0
        prompt = row.get("prompt")
        if prompt is None:
            if extra is None:
                raise EnvError(f"{type(self.env).__name__}.reset() returned nothing and the row has no prompt: give "
                               "env.rows (JSON lines with a prompt column), as TRL's train_dataset")
            return str(extra)
        if extra is None:
            return prompt
        if isinstance(prompt, str):
            return prompt + str(extra)
        msgs = [dict(m) for m in prompt]
        msgs[-1]["content"] = str(msgs[-1].get("content", "")) + str(extra)
        return msgs

    def _call(self, call: dict) -> dict:
        if "error" in call:
            result = {"error": call["error"]}
        else:
            tool = self._by_name.get(call["name"])
            try:
                if tool is None:
                    raise ValueError(f"Tool {call['name']} not found.")
                result = tool(**typed_arguments(tool, call))
            except Exception as exc:  # noqa: BLE001 (TRL answers a failing call with its error; so do we)
                result = {"error": str(exc)}
        return {"role": "tool", "name": call["name"], "content": str(result)}

    def _reward(self) -> float:
        get = getattr(self.env, "get_reward", None)
        return float(get()) if callable(get) else 0.0

    def step(self, action: str):
        calls = parse_tool_calls(str(action), self.tool_format)
        if not calls:
            return None, self._reward(), True, {"tool_calls": self.calls}
        self.calls += 1
        answers = [self._call(c) for c in calls]
        if self.calls >= self.max_calls:
            return answers, self._reward(), True, {"tool_calls": self.calls, "max_calls": True}
        return answers, 0.0, False, {}

    def close(self):
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


# -- reasoning-gym ------------------------------------------------------------------------------------------------
class ReasoningGym:
    """One of reasoning-gym's procedural tasks, an episode of one turn.

    ``reset(seed)`` makes the task's dataset of one item from the episode's seed (``create_dataset(name, size=1,
    seed=seed, **config)``: the G episodes of a GRPO group get the same question) and gives its question, after the
    instruction to answer in ``<answer>...</answer>`` (reasoning-gym's ``default`` system prompt, or ``prompt``).
    ``step(reply)`` scores the answer inside the last ``<answer>`` tags (reasoning-gym's ``extract_answer``) with the
    task's own ``score_answer`` — 1 for a correct answer, a task's partial credit otherwise — and ends the episode;
    ``info["success"]`` is a score of 1.

    Args:
        task: a reasoning-gym dataset name (``countdown``, ``basic_arithmetic``, ...;
            ``reasoning_gym.factory.DATASETS``).
        config: the dataset's configuration (its ``*Config`` fields, e.g. ``{"min_numbers": 3, "max_numbers": 4}``).
        prompt: ``default``, another key of ``reasoning_gym.utils.SYSTEM_PROMPTS``, or text; prepended as a system
            message. ``none`` puts only the question.
    """

    def __init__(self, task: str = "countdown", config: dict | None = None, prompt: str = "default"):
        rg = require("reasoning_gym")
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer

        if task not in DATASETS:
            raise EnvError(f"env.kwargs.task={task!r}: not a reasoning-gym task (one of {', '.join(sorted(DATASETS))})")
        self.task, self.config = task, dict(config or {})
        self._create, self._extract = rg.create_dataset, extract_answer
        self.system = None if prompt == "none" else SYSTEM_PROMPTS.get(prompt, prompt)
        self._create(task, size=1, seed=0, **self.config)  # a bad config fails here, when the run starts

    def reset(self, seed: int, **row):
        self.data = self._create(self.task, size=1, seed=int(seed), **self.config)
        self.entry = self.data[0]
        user = {"role": "user", "content": self.entry["question"]}
        return [{"role": "system", "content": self.system}, user] if self.system else [user]

    def step(self, action: str):
        answer = self._extract(str(action))
        score = float(self.data.score_answer(answer, self.entry))
        return None, score, True, {"success": score >= 1.0, "answered": answer is not None}


# -- TextArena ----------------------------------------------------------------------------------------------------
_MOVES = re.compile(r"Available Moves:(.*)")
_BRACKETED = re.compile(r"\[[^\[\]]+\]")


def available_moves(observation: str) -> list[str]:
    """The moves a TextArena game lists in its last ``Available Moves: '[0]', '[4]', ...`` line."""
    lines = _MOVES.findall(observation)
    return _BRACKETED.findall(lines[-1]) if lines else []


def first_move(observation: str, rng: random.Random) -> str:
    """A fixed opponent: the first move the game lists as available."""
    moves = available_moves(observation)
    if not moves:
        raise EnvError("opponent=first: the game lists no 'Available Moves:'; give env.kwargs.opponent as "
                       "package.module:function(observation, rng) -> move")
    return moves[0]


def random_move(observation: str, rng: random.Random) -> str:
    """A random opponent, seeded by the episode's seed: one of the moves the game lists as available."""
    moves = available_moves(observation)
    if not moves:
        raise EnvError("opponent=random: the game lists no 'Available Moves:'; give env.kwargs.opponent as "
                       "package.module:function(observation, rng) -> move")
    return rng.choice(moves)


OPPONENTS = {"first": first_move, "random": random_move}


class TextArena:
    """A TextArena game (``textarena.make(game)``), the policy as player ``player``, every other player a fixed
    opponent.

    The game is made without TextArena's default wrappers (``<game>-raw``): an observation is what the game said
    since the policy's last move, one ``[GAME] ...`` / ``[Player k] ...`` line per message (the policy's own moves
    left out: they are in the conversation already). Moves are what TextArena's games parse (``[4]`` in tic-tac-toe,
    ``[12]`` in guess-the-number). The reward is the policy's reward at the game's end (TextArena's ``close()``:
    win 1, loss −1, draw 0; guess-the-number 1 on a hit), ``info["reason"]`` says why it ended.

    Args:
        game: a TextArena id (``TicTacToe-v0``, ``GuessTheNumber-v0``, ...).
        player: the policy's player id.
        num_players: players of the game (default: 1 for single-player games, else 2).
        opponent: ``first`` (the first available move), ``random`` (one of them, seeded by the episode) or
            ``package.module:function(observation, rng) -> move``.
        kwargs: the game's keyword arguments (``textarena.make(game, **kwargs)``).
    """

    WORD_LISTS = ("Wordle", "Hangman", "WordLadder", "WordSearch", "WordChains", "SpellingBee", "Crosswords",
                  "Codenames", "DontSayIt", "LetterAuction")

    def __init__(self, game: str = "TicTacToe-v0", player: int = 0, num_players: int | None = None,
                 opponent: str = "first", kwargs: dict | None = None):
        ta = require("textarena")
        base = game.removesuffix("-raw")
        if base.split("-")[0] in self.WORD_LISTS:
            self.downloads = f"TextArena's {game} loads NLTK word lists (nltk.download) when made"
            return
        try:
            self.env = ta.make(base + "-raw", **(kwargs or {}))
        except ValueError as exc:
            raise EnvError(f"env.kwargs.game={game!r}: {exc}") from exc
        self.player = int(player)
        self.num_players = num_players or (1 if "SinglePlayer" in _reset_source(self.env) else 2)
        self.opponent = OPPONENTS.get(opponent) or import_object(opponent, "env.kwargs.opponent")

    def _take(self, pid: int) -> str:
        """What player ``pid`` has been told since it last read (its own moves left out)."""
        state = self.env.state
        msgs = state.observations.get(pid, [])
        state.observations[pid] = []
        lines = []
        for src, text, _kind in msgs:
            if src == pid:
                continue
            who = "GAME" if src == -1 else f"Player {src}"
            lines.append(f"[{who}] {str(text).strip()}")
        return "\n".join(lines)

    def _until_our_turn(self) -> tuple[str, bool]:
        """Opponents move until it is the policy's turn or the game is done; -> (what the policy was told, done)."""
        seen = self._take(self.player)
        done = self.env.state.done
        while not done and self.env.state.current_player_id != self.player:
            pid = self.env.state.current_player_id
            self._told[pid] = self._told.get(pid, "") + "\n" + self._take(pid)
            done, _ = self.env.step(str(self.opponent(self._told[pid], self.rng)))
            said = self._take(self.player)
            seen = f"{seen}\n{said}" if seen and said else seen or said
        return seen, done

    def reset(self, seed: int, **row):
        self.rng = random.Random(int(seed))
        self._told = {}
        self.env.reset(num_players=self.num_players, seed=int(seed))
        return self._until_our_turn()[0]

    def step(self, action: str):
        done, _ = self.env.step(str(action))
        seen, done = self._until_our_turn() if not done else (self._take(self.player), True)
        if not done:
            return seen, 0.0, False, {}
        rewards, game_info = self.env.close()
        reward = float((rewards or {}).get(self.player, 0.0))
        info = dict((game_info or {}).get(self.player, {}))
        return seen or None, reward, True, {"success": reward > 0, "reason": str(info.get("reason", ""))}


def _reset_source(env) -> str:
    """The source of a TextArena game's ``reset``, which names its state class (``SinglePlayerState``,
    ``TwoPlayerState``, ...): read without running it (before ``reset`` there is no state)."""
    try:
        return inspect.getsource(type(env).reset)
    except (OSError, TypeError):
        return ""


# -- GEM ----------------------------------------------------------------------------------------------------------
class GEM:
    """A GEM (``gem-llm``) environment: ``gem.make(env_id)``, Gymnasium's ``reset(seed) -> (observation, info)`` and
    ``step(action) -> (observation, reward, terminated, truncated, info)``.

    The observation is GEM's text followed by ``info["suffix"]`` when there is one (GEM's games say there what the
    policy should do next: "Enter your next guess."). Moves are what GEM's games parse (``\\boxed{5}``).
    ``game:*`` environments need nothing beyond the package, except the word games (Wordle, Hangman, WordSearch:
    NLTK word lists), and ``rg:*`` ones are reasoning-gym's tasks; ``math:*``, ``qa:*``, ``code:*``, ``logic:*``,
    ``eval:*`` load Hugging Face datasets. Those are refused. ``info["success"]``: the game ended with a reward of at
    least 1 (a solve; reasoning-gym's partial credit is less).

    Args:
        env_id: a GEM id, e.g. ``game:GuessTheNumber-v0-easy``, ``game:Sudoku-v0-easy``.
        kwargs: its keyword arguments (``gem.make(env_id, **kwargs)``).
    """

    WORD_LISTS = ("Wordle", "Hangman", "WordSearch")

    def __init__(self, env_id: str = "game:GuessTheNumber-v0-easy", kwargs: dict | None = None):
        gem = require("gem")
        kind, _, name = env_id.partition(":")
        if kind not in ("game", "rg"):
            self.downloads = f"GEM's {env_id} loads a Hugging Face dataset when made"
            return
        if kind == "game" and name.split("-")[0] in self.WORD_LISTS:
            self.downloads = f"GEM's {env_id} loads NLTK word lists when made"
            return
        try:
            self.env = gem.make(env_id, **(kwargs or {}))
        except ValueError as exc:
            raise EnvError(f"env.kwargs.env_id={env_id!r}: {exc}") from exc

    @staticmethod
    def _text(observation, info) -> str:
        suffix = (info or {}).get("suffix")
        return f"{observation}\n{suffix}" if suffix else str(observation)

    def reset(self, seed: int, **row):
        observation, _ = self.env.reset(seed=int(seed))  # its suffix at reset speaks of the *next* guess
        return str(observation)

    def step(self, action: str):
        observation, reward, terminated, truncated, info = self.env.step(str(action))
        done = bool(terminated or truncated)
        out = dict(info or {})
        out.setdefault("success", bool(terminated) and float(reward) >= 1.0)  # a solve scores 1; partial credit less
        return (None if done else self._text(observation, info)), float(reward), done, out


# -- OpenEnv -------------------------------------------------------------------------------------------------------
_SERVERS: dict[str, tuple[Any, str]] = {}  # app -> (its server process, its URL): one per process, shared
_SERVERS_LOCK = threading.Lock()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_openenv(app: str, startup_timeout_s: float = 180.0) -> str:
    """The URL of a server of the OpenEnv app ``package.module:app`` (``openenv.core.env_server.create_app(...)``):
    started once per process with uvicorn on a free local port, on first use, stopped when the process exits, and
    ending by itself when the process is killed (:mod:`rayseq.episodes.child_server`).
    :class:`EnvError` with the server's output when it does not answer ``/health`` within ``startup_timeout_s``."""
    with _SERVERS_LOCK:
        if app in _SERVERS and _SERVERS[app][0].poll() is None:
            return _SERVERS[app][1]
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen([sys.executable, "-m", "rayseq.episodes.child_server", app, "--port", str(port),
                                 "--parent", str(os.getpid())], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        atexit.register(_stop, proc)
        deadline = time.monotonic() + startup_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    _SERVERS[app] = (proc, url)
                    return url
            except OSError:
                time.sleep(0.2)
        _stop(proc)
        log.seek(0)
        said = log.read().decode(errors="replace").strip()[-2000:]
        raise EnvError(f"env.kwargs.app={app}: its OpenEnv server did not start within {startup_timeout_s:g} s "
                       f"(uvicorn serving {app}): {said or 'no output'}")


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


class OpenEnv:
    """An OpenEnv environment, served by its own server process and reached through OpenEnv's client.

    ``app`` names the server's ASGI app (what ``openenv.core.env_server.create_app(Env, Action, Observation)``
    returns, as in ``openenv init``'s ``server/app.py``): rayseq starts it once per process (:func:`serve_openenv`);
    or ``base_url`` names a server already running. Each instance is one session of OpenEnv's
    ``GenericEnvClient`` (a WebSocket of its own: give the app ``max_concurrent_envs`` at least
    ``env.max_concurrent``). ``reset(seed)`` is the client's ``reset(seed=seed)``; an action is sent as
    ``{action_field: text}``; the reward and ``done`` are the server's.

    An observation's text: its ``text_field``, or its only text field, or its fields as JSON (``reward``, ``done``
    and ``metadata`` left out; ``metadata`` is the step's ``info``).

    Args:
        app: ``package.module:app``, the server's app; or
        base_url: the URL of a running server.
        action_field: the action model's text field (the template's ``message``).
        text_field: the observation's text field (default: its only text field).
        startup_timeout_s: seconds the server may take to answer.
    """

    def __init__(self, app: str | None = None, base_url: str | None = None, action_field: str = "message",
                 text_field: str | None = None, startup_timeout_s: float = 180.0):
        require("openenv")
        from openenv.core.generic_client import GenericEnvClient

        if (app is None) == (base_url is None):
            raise EnvError("env.name=openenv: give env.kwargs.app (package.module:app, served here) or "
                           "env.kwargs.base_url (a running server), one of them")
        self.url = base_url or serve_openenv(app, startup_timeout_s)
        self.action_field, self.text_field = action_field, text_field
        self.client = GenericEnvClient(base_url=self.url).sync()
        self.client.connect()

    def _text(self, observation: dict) -> str:
        fields = {k: v for k, v in (observation or {}).items() if k not in ("reward", "done", "metadata")}
        if self.text_field is not None:
            if self.text_field not in fields:
                raise EnvError(f"env.kwargs.text_field={self.text_field!r}: the observation has {sorted(fields)}")
            return str(fields[self.text_field])
        texts = [v for v in fields.values() if isinstance(v, str)]
        return texts[0] if len(texts) == 1 else json.dumps(fields, sort_keys=True, default=str)

    def reset(self, seed: int, **row):
        return self._text(self.client.reset(seed=int(seed)).observation)

    def step(self, action: str):
        result = self.client.step({self.action_field: str(action)})
        observation = result.observation or {}
        info = dict(observation.get("metadata") or {})
        return self._text(observation), float(result.reward or 0.0), bool(result.done), info

    def close(self):
        self.client.close()


__all__ = ["GEM", "OPPONENTS", "TOOL_FORMATS", "OpenEnv", "ReasoningGym", "TRLEnvironment", "TextArena",
           "available_moves", "first_move", "parse_tool_calls", "random_move", "require", "serve_openenv", "trl_tools",
           "typed_arguments"]
