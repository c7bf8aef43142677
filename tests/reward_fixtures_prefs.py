"""Synthetic preference data for the reward-model tests: a reply with a pleasant word is preferred to one with an
unpleasant word, whatever the prompt and the filler; the filler's length is drawn independently, so "the longer
reply wins" is near chance."""

from __future__ import annotations

import json
import random
from pathlib import Path

from examples.preferences.gold import PLEASANT, UNPLEASANT, gold  # noqa: F401 (the gold reward: reward.terms' entry)

QUESTIONS = ["how was the", "what do you think of the", "tell me about the", "did you like the"]
TOPICS = ["movie", "food", "weather", "book", "trip", "job", "party", "game"]
PROMPTS = [f"{q} {t}" for q in QUESTIONS for t in TOPICS]
GOOD, BAD = sorted(PLEASANT), sorted(UNPLEASANT)
FILLER = ["it was", "honestly it was", "i think it was", "well it was really", "it was quite"]


def preference_rows(n: int = 300, seed: int = 0) -> list[dict]:
    """``n`` standard rows {prompt, chosen, rejected}."""
    rng = random.Random(seed)
    return [{"prompt": rng.choice(PROMPTS), "chosen": f" {rng.choice(FILLER)} {rng.choice(GOOD)}",
             "rejected": f" {rng.choice(FILLER)} {rng.choice(BAD)}"} for _ in range(n)]


def conversational(rows: list[dict]) -> list[dict]:
    """The rows in TRL's conversational format with an implicit prompt (the user's message in both lists)."""
    return [{"chosen": [{"role": "user", "content": r["prompt"]},
                        {"role": "assistant", "content": r["chosen"].strip()}],
             "rejected": [{"role": "user", "content": r["prompt"]},
                          {"role": "assistant", "content": r["rejected"].strip()}]} for r in rows]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def words() -> tuple[str, ...]:
    """Every line the data can hold, for a tiny tokenizer to learn."""
    return tuple(PROMPTS + [f"{f} {w}" for f in FILLER for w in GOOD + BAD])




def policy_rows(rows: list[dict]) -> list[dict]:
    """(prompt, reply) rows for a policy's MLE pretraining: every chosen and every rejected reply, so the pretrained
    policy says pleasant and unpleasant things alike."""
    return [{"prompt": r["prompt"], "reply": r[k].strip()} for r in rows for k in ("chosen", "rejected")]
