"""Observations as tokens, with the sampled ids kept as they are.

An episode is one token sequence: the first observation rendered as the prompt (``src``), then the policy's sampled
action, the next observation's tokens, the next action, ... (``tokens``). The sampled ids are never decoded and
encoded again; only what the environment adds is rendered, and appended (veRL's agent loop, prime-rl's renderers).

Two renderers, chosen once by the task's vocabulary:

- :class:`VocabRenderer` — rayseq's own vocabulary (a policy trained from scratch): an observation is its words (or
  characters) followed by :data:`TURN`, the token that hands the turn back to the policy; nothing to prove, token
  lists are joined. (Not ``<bos>``: the policies never emit it, so their log-prob of it is −inf, and a trained row
  holds only tokens of finite log-prob.)
- :class:`ChatRenderer` — a Hugging Face tokenizer with a chat template: the observation's tokens are the template's
  suffix for the new messages. After each action the conversation is rendered twice (with the action as the
  assistant's message, and with the new messages and the generation prompt), and the suffix is used only when the
  template is shown to extend what the policy has read exactly: the previous render is a prefix of the new one,
  the assistant's message is rendered as its decoded text followed by the end token, and the suffix starts at that
  end token (a special token: nothing before it can merge with what follows). Where that cannot be shown (a
  template that rewrites earlier turns, trims the reply, ends a turn with another token) the episode goes on in a
  new sample whose prompt is the whole conversation rendered again (:class:`Split`), rather than corrupting one.

:func:`retokenization_drift` counts what re-encoding the final conversation's text would have changed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

TURN = "<turn>"  # the token after each observation in rayseq's own vocabulary: the policy's turn

def as_messages(observation: Any, role: str = "user") -> list[dict]:
    """An observation as chat messages: text -> one ``role`` message; a message or a list of them as they are."""
    if observation is None:
        return []
    if isinstance(observation, str):
        return [{"role": role, "content": observation}]
    if isinstance(observation, dict):
        return [dict(observation)]
    return [dict(m) for m in observation]


def messages_text(messages: list[dict]) -> str:
    """The messages' contents, one per line (what a renderer without a template reads)."""
    return "\n".join(str(m.get("content", "")) for m in messages)


class Split(NamedTuple):
    """The episode continues in a new sample whose prompt is ``src`` (the whole conversation rendered again)."""

    src: list[int]
    reason: str


class VocabRenderer:
    """Observations in rayseq's own vocabulary (module docstring): ``words`` split on whitespace, or characters.

    Args:
        vocab: the task's :class:`rayseq.vocab.Vocab`.
        mode: ``words`` or ``chars``.
        system: a system prompt put before the first observation, or None.
    """

    exact = True  # token lists are joined: no suffix to prove

    def __init__(self, vocab, mode: str = "words", system: str | None = None):
        self.vocab, self.mode, self.system = vocab, mode, system
        self.specials = vocab.specials
        if TURN not in vocab.stoi:
            raise ValueError(f"the vocabulary has no {TURN} token (the episodes' task adds it)")
        self.turn_id = int(vocab.stoi[TURN])

    def _ids(self, text: str) -> list[int]:
        pieces = text.split() if self.mode == "words" else list(text)
        return [int(i) for i in self.vocab.encode(pieces)]

    def start(self, observation, tools=None) -> tuple[list[int], dict]:
        """The first observation -> (prompt ids, the conversation's state)."""
        msgs = ([{"role": "system", "content": self.system}] if self.system else []) + as_messages(observation)
        return self._ids(messages_text(msgs)), {"messages": msgs}

    def action_text(self, ids) -> str:
        """The text of sampled ids (the end token and what follows left out)."""
        words = self.vocab.decode(ids)
        return (" " if self.mode == "words" else "").join(words)

    def next(self, conv: dict, action_ids: list[int], ended: bool, observation) -> list[int] | Split:
        """The tokens that follow the action: the observation's, then :data:`TURN` (an action cut short by the token
        limit gets its end token first, as an observation token: it was not sampled)."""
        new = as_messages(observation)
        conv["messages"] += [{"role": "assistant", "content": self.action_text(action_ids)}, *new]
        return ([] if ended else [self.specials.eos]) + self._ids(messages_text(new)) + [self.turn_id]

    def finish(self, conv: dict, action_ids: list[int], ended: bool) -> None:
        """The episode ended after this action: it joins the conversation (what :meth:`conversation_ids` reads)."""
        conv["messages"] = conv["messages"] + [{"role": "assistant", "content": self.action_text(action_ids)}]
        conv["last_ended"] = ended

    def conversation_ids(self, conv: dict) -> list[int]:
        """The whole conversation encoded again from its text (what :func:`retokenization_drift` compares): every
        reply followed by the end token (the last one only when the policy sampled it)."""
        out, first = [], True
        msgs = conv["messages"]
        for k, m in enumerate(msgs):
            if m["role"] == "assistant":
                last = k == len(msgs) - 1
                out += self._ids(m["content"]) + ([self.specials.eos] if not last or conv.get("last_ended", True)
                                                   else [])
            else:
                out += self._ids(m["content"])
                if not first:
                    out += [self.turn_id]
            first = first and m["role"] == "system"
        return out


class ChatRenderer:
    """Observations as a chat template's suffix, proven to extend the prefix (module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        system: a system prompt put before the first observation, or None.
    """

    exact = False  # each suffix is checked

    def __init__(self, tokenizer, system: str | None = None):
        self.tok, self.system = tokenizer, system
        self.eos_id = int(tokenizer.eos_token_id)
        self.eos_text = tokenizer.convert_ids_to_tokens(self.eos_id)
        if self.eos_id not in set(tokenizer.all_special_ids):
            raise ValueError("the tokenizer's end token is not a special token: observation suffixes could merge with "
                             "the tokens before them")

    def _render(self, messages, tools=None, generation: bool = True) -> str:
        kw = {"tools": tools} if tools else {}
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, **kw)

    def _ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def start(self, observation, tools=None) -> tuple[list[int], dict]:
        msgs = ([{"role": "system", "content": self.system}] if self.system else []) + as_messages(observation)
        text = self._render(msgs, tools)
        return self._ids(text), {"messages": msgs, "text": text, "tools": tools}

    def action_text(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self.tok.decode(ids, skip_special_tokens=True)

    def next(self, conv: dict, action_ids: list[int], ended: bool, observation) -> list[int] | Split:
        """The suffix's ids after the action, or a :class:`Split` where the template cannot be shown to extend the
        prefix."""
        tools = conv.get("tools")
        content = self.action_text(action_ids)
        with_action = conv["messages"] + [{"role": "assistant", "content": content}]
        new = with_action + as_messages(observation)
        before = self._render(with_action, tools, generation=False)
        after = self._render(new, tools)
        conv["messages"] = new
        head = conv["text"] + content + self.eos_text
        reason = None
        if not before.startswith(head):
            reason = "the template does not render the reply as sampled, followed by the end token"
        elif not after.startswith(before):
            reason = "the template rewrites earlier turns"
        conv["text"] = after
        if reason is not None:
            return Split(self._ids(after), reason)
        # the end token when the policy did not sample it (cut short), what the template puts after it (a newline),
        # the new messages and the generation prompt
        suffix = ("" if ended else self.eos_text) + before[len(head):] + after[len(before):]
        return self._ids(suffix)

    def finish(self, conv: dict, action_ids: list[int], ended: bool) -> None:
        """The episode ended after this action: it joins the conversation (what :meth:`conversation_ids` reads)."""
        conv["messages"] = conv["messages"] + [{"role": "assistant", "content": self.action_text(action_ids)}]

    def conversation_ids(self, conv: dict) -> list[int]:
        """The final conversation rendered by the template and encoded again from its text."""
        return self._ids(self._render(conv["messages"], conv.get("tools"), generation=False))


def retokenization_drift(trained: np.ndarray, retokenized: np.ndarray) -> int:
    """How many ids of ``trained`` (the prompt and the episode's tokens, as sampled and rendered) differ from
    ``retokenized`` (the final conversation's text encoded again): positions that differ over the common length, plus
    the difference in length."""
    a, b = np.asarray(trained), np.asarray(retokenized)
    n = min(len(a), len(b))
    return int((a[:n] != b[:n]).sum()) + abs(len(a) - len(b))
