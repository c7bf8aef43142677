"""Request/response schemas of the chat endpoint, with the limits every request is checked against."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

MAX_MESSAGE_CHARS = 2000  # one message
MAX_HISTORY_TURNS = 50  # earlier turns sent with a message
MAX_TOKENS = 128  # hard cap on a reply's length
MAX_REPLIES = 8  # num_replies / n
MAX_TOP_K = 1000
MAX_BODY_BYTES = 64 * 1024  # request bodies larger than this get 413
MAX_STOP = 4  # stop strings per request (OpenAI's limit)
MAX_STOP_CHARS = 200
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


MAX_REPETITION_PENALTY = 10.0
REPETITION_HELP = ("Not OpenAI's (CTRL's): a token already in the reply has its logit divided by this (multiplied "
                   "when negative); 1 = off; default: the model's.")
NGRAM_HELP = "Not OpenAI's: no n-gram of this many tokens twice in a reply; 0 = off; default: the model's."


def _check_stop(v):
    items = [v] if isinstance(v, str) else v or []
    if len(items) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop strings")
    if any(not s or len(s) > MAX_STOP_CHARS for s in items):
        raise ValueError(f"stop strings must have 1 to {MAX_STOP_CHARS} characters")
    return v


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
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Nucleus sampling; 1 = the whole distribution; "
                                "default: the model's (GET /v1/models: details.decoding).")
    stop: list[str] | None = Field(None, description=f"Up to {MAX_STOP} strings; a reply ends before the first.")
    repetition_penalty: float | None = Field(None, ge=1.0, le=MAX_REPETITION_PENALTY, description=REPETITION_HELP)
    no_repeat_ngram_size: int | None = Field(None, ge=0, le=MAX_TOKENS, description=NGRAM_HELP)

    _blank = field_validator("message")(_not_blank)
    _stop = field_validator("stop")(_check_stop)

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
    truncated_words: int = Field(0, description="Input words left out at its start: the model reads only its last "
                                 "max_src_len words (tokens).")


class OpenAIMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | None = Field(None, max_length=MAX_MESSAGE_CHARS)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False  # one more chunk before [DONE]: no choices, the request's usage


def _refuse(name: str, allowed: str | None = None):
    """A validator refusing a known OpenAI parameter this server does not implement (a 422 naming it)
    rather than accepting and ignoring it; ``allowed`` names the no-op value that is accepted."""
    def check(cls, v):
        if v is None:
            return v
        raise ValueError(f"not supported by this server{f' (only {allowed})' if allowed else ''}")
    return field_validator(name, mode="before")(check)


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions, OpenAI's shape. Every parameter accepted is honoured: sampling
    (temperature, top_p, top_k, n, seed, max_tokens / max_completion_tokens), presence and frequency penalties (and
    two of other servers: repetition_penalty, no_repeat_ngram_size), stop strings, log-probs, streaming. OpenAI
    parameters a small generator cannot honour (tools, response formats, logit bias, ...) and unknown fields are a
    422 naming the field. Strictly typed and range-checked."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    messages: list[OpenAIMessage] = Field(min_length=1, max_length=MAX_HISTORY_TURNS + 1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Nucleus sampling; 1 = the whole distribution.")
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K, description="Not OpenAI's: sample among the k most likely.")
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    n: int | None = Field(None, ge=1, le=MAX_REPLIES)
    seed: int | None = Field(None, ge=0, le=2**62)
    stop: str | list[str] | None = Field(None, description=f"Up to {MAX_STOP} strings; a reply ends before the "
                                         "first of them, finish_reason \"stop\".")
    logprobs: bool | None = Field(None, description="Each reply token's log-probability (temperature 1).")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="With logprobs: the k most "
                                     "likely tokens at each position.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256, description="An end-user id; accepted, not used or stored.")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="A token already in the reply: its "
                                           "logit minus this; default: the model's.")
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="Its logit minus this times its "
                                            "count in the reply; default: the model's.")
    repetition_penalty: float | None = Field(None, ge=1.0, le=MAX_REPETITION_PENALTY, description=REPETITION_HELP)
    no_repeat_ngram_size: int | None = Field(None, ge=0, le=MAX_TOKENS, description=NGRAM_HELP)
    logit_bias: dict | None = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None

    _no_tools = _refuse("tools")
    _no_tool_choice = _refuse("tool_choice")
    _no_functions = _refuse("functions")
    _no_function_call = _refuse("function_call")
    _no_parallel = _refuse("parallel_tool_calls")

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v):
        if v:
            raise ValueError("not supported by this server (only {})")
        return v

    @field_validator("response_format", mode="before")
    @classmethod
    def _text_only(cls, v):
        if v is not None and v != {"type": "text"}:
            raise ValueError('not supported by this server (only {"type": "text"})')
        return v

    _stop = field_validator("stop")(_check_stop)

    @field_validator("messages")
    @classmethod
    def _last_is_user(cls, v: list[OpenAIMessage]):
        if v[-1].role != "user" or not (v[-1].content or "").strip():
            raise ValueError("the last message must be a non-empty user message")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, v, info: ValidationInfo):
        if v is not None and not info.data.get("logprobs"):
            raise ValueError("requires logprobs: true")
        return v

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


MAX_QUERIES = 256  # queries per POST /get_reward
MAX_QUERY_CHARS = 8 * MAX_MESSAGE_CHARS  # one query: a prompt and its reply


class RewardRequest(BaseModel):
    """POST /get_reward, OpenRLHF's remote reward model's request. Strict: wrong types and unknown fields are
    errors (``labels``, which OpenRLHF sends, is accepted and not read)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    query: list[str] = Field(min_length=1, max_length=MAX_QUERIES,
                             description="Each a prompt followed by its reply, as one text.")
    prompts: list[str] | None = Field(None, max_length=MAX_QUERIES, description="Each query's prompt (its start): "
                                      "the query is split there, as the model was trained.")
    labels: list[Any] | None = Field(None, max_length=MAX_QUERIES, description="Accepted, not read.")

    @field_validator("query")
    @classmethod
    def _query_items(cls, v):
        for i, q in enumerate(v):
            if len(q) > MAX_QUERY_CHARS:
                raise ValueError(f"query[{i}] is longer than {MAX_QUERY_CHARS} characters")
        return v


class RewardResponse(BaseModel):
    """POST /get_reward's answer: one reward per query, in order."""

    rewards: list[float]
    model: str
