"""Request/response schemas of the chat endpoint, with the limits every request is checked against."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_MESSAGE_CHARS = 2000  # one message
MAX_HISTORY_TURNS = 50  # earlier turns sent with a message
MAX_TOKENS = 128  # hard cap on a reply's length
MAX_REPLIES = 8  # num_replies / n
MAX_TOP_K = 1000
MAX_BODY_BYTES = 64 * 1024  # request bodies larger than this get 413


def _not_blank(v: str) -> str:
    if not v.strip():
        raise ValueError("must not be empty or blank")
    return v


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["user", "assistant", "system"]
    content: str = Field(max_length=MAX_MESSAGE_CHARS)


class ChatRequest(BaseModel):
    """POST /v1/chat. Strict: wrong types are errors, unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", strict=True)
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS, description="What the user says.")
    history: list[Turn | str] = Field(
        default_factory=list, max_length=MAX_HISTORY_TURNS,
        description="Earlier turns, oldest first (accepted and checked; the counting and seq2seq models "
        "answer the message alone).",
    )
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 = greedy decoding.")
    top_k: int = Field(0, ge=0, le=MAX_TOP_K, description="Sample among the k most likely tokens; 0 = all.")
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description="Reply length cap (default: the task's).")
    num_replies: int = Field(1, ge=1, le=MAX_REPLIES, description="Replies to sample.")
    seed: int | None = Field(None, ge=0, le=2**62, description="Same seed, same replies.")

    _blank = field_validator("message")(_not_blank)

    @field_validator("history")
    @classmethod
    def _history_items(cls, v):
        for i, item in enumerate(v):
            if isinstance(item, str) and len(item) > MAX_MESSAGE_CHARS:
                raise ValueError(f"history[{i}] is longer than {MAX_MESSAGE_CHARS} characters")
        return v


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatResponse(BaseModel):
    reply: str
    replies: list[str] | None = None
    model: str
    usage: Usage
    unknown_words: list[str] = Field(default_factory=list, description="Input words mapped to <unk>.")


class OpenAIMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | None = Field(None, max_length=MAX_MESSAGE_CHARS)


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions, OpenAI's shape. Unknown OpenAI parameters are accepted and ignored
    (clients send many); the ones used are strictly typed and range-checked."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    messages: list[OpenAIMessage] = Field(min_length=1, max_length=MAX_HISTORY_TURNS + 1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    n: int | None = Field(None, ge=1, le=MAX_REPLIES)
    seed: int | None = Field(None, ge=0, le=2**62)
    stream: bool | None = False

    @field_validator("messages")
    @classmethod
    def _last_is_user(cls, v: list[OpenAIMessage]):
        if v[-1].role != "user" or not (v[-1].content or "").strip():
            raise ValueError("the last message must be a non-empty user message")
        return v
