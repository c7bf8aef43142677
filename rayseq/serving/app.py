"""Ray Serve deployment with a FastAPI ingress: chat over HTTP from any rayseq checkpoint.

Routes: ``POST /v1/chat``, ``POST /v1/chat/completions`` (OpenAI's shape, ``stream`` with server-sent
events), ``GET /v1/models``, ``GET /healthz``, ``GET /docs`` (OpenAPI), ``GET /`` (a chat page); a reward model's
checkpoint (``algo.name=reward_model``) answers ``POST /get_reward`` (OpenRLHF's ``{"query": [...]}`` →
``{"rewards": [...]}``, :class:`rayseq.models.reward_head.RewardModelScorer`) instead of the chat routes.

Build it with :func:`build_app` — from ``RAYSEQ_CHECKPOINT=runs/x serve run serve/chatbot.yaml``, ``serve run
rayseq.serving.app:build_app checkpoint=runs/x``, or ``python -m rayseq.serve --checkpoint runs/x``.
Concurrent requests are decoded together with ``@serve.batch``; every bad request gets a 4xx with a
JSON body ``{"error": {"message", "type", "param"}}`` and the replica keeps serving.
"""


import json
import os
import secrets
import time
import uuid
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from rayseq.serving.schemas import (
    MAX_BODY_BYTES,
    ChatCompletionRequest,
    ChatRequest,
    ChatResponse,
    RewardRequest,
    RewardResponse,
    Usage,
)

STATIC = Path(__file__).with_name("static")
API_KEY_ENV = "RAYSEQ_API_KEY"


# -- errors ---------------------------------------------------------------------------------------
def error_response(status: int, message: str, type_: str = "invalid_request_error", param=None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param}}, status_code=status)


def _validation_message(exc: RequestValidationError) -> tuple[int, str, str | None]:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return 400, "request body is not valid JSON", None
    parts, first = [], None
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        key = ".".join(loc) or "body"
        first = first or key
        msg = "missing" if e.get("type") == "missing" else e.get("msg", "invalid").removeprefix("Value error, ")
        if e.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{key}: {msg}")
    return 422, "; ".join(parts), first


class BodyGuard:
    """ASGI middleware: for requests with a body, require JSON (415), cap the size (413, also for
    chunked bodies without Content-Length) and require UTF-8 (400) before the app sees the body."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            resp = error_response(415, f"Content-Type must be application/json (got {ctype or 'none'!r})")
            return await resp(scope, receive, send)
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            resp = error_response(413, f"request body larger than {self.max_bytes} bytes")
            return await resp(scope, receive, send)
        body, more = b"", True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
            if len(body) > self.max_bytes:
                resp = error_response(413, f"request body larger than {self.max_bytes} bytes")
                return await resp(scope, receive, send)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            resp = error_response(400, f"request body is not valid UTF-8 (byte {exc.start})")
            return await resp(scope, receive, send)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


api = FastAPI(
    title="rayseq chat",
    description="Chat with a sequence generator trained by rayseq (MLE, REINFORCE, MIXER, PPO, PPO-dynamic).",
    version="0.1.0",
)
api.add_middleware(BodyGuard)


@api.exception_handler(RequestValidationError)
async def _on_validation_error(request: Request, exc: RequestValidationError):
    status, message, param = _validation_message(exc)
    return error_response(status, message, param=param)


@api.exception_handler(StarletteHTTPException)
async def _on_http_error(request: Request, exc: StarletteHTTPException):
    type_ = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
    return error_response(exc.status_code, str(exc.detail), type_)


@api.exception_handler(Exception)
async def _on_unexpected(request: Request, exc: Exception):  # never a stack trace to the client
    return error_response(500, "internal error while generating a reply", "server_error")


# -- the deployment -------------------------------------------------------------------------------
@serve.deployment(name="ChatModel")
@serve.ingress(api)
class ChatDeployment:
    def __init__(self, checkpoint: str, batching: bool = True, max_batch_size: int = 32,
                 batch_wait_timeout_s: float = 0.005, api_key: str | None = None, device: str = "cpu",
                 torch_threads: int = 1, engine: str = "builtin", engine_kwargs: dict | None = None):
        import torch

        from rayseq.data.hf_text import encode_all, spec_vocab
        from rayseq.models.reward_head import RewardModelScorer, is_reward_checkpoint
        from rayseq.serving.model import ChatModel

        torch.set_num_threads(torch_threads)
        self.rewarding = is_reward_checkpoint(checkpoint)  # a reward model: /get_reward instead of chat
        self.model = (RewardModelScorer(checkpoint, spec_vocab, encode_all, device) if self.rewarding else
                      ChatModel(checkpoint, device=device, engine=engine, engine_kwargs=engine_kwargs))
        self.batching = batching
        self.api_key = api_key or os.environ.get(API_KEY_ENV) or None
        for batched in (self._generate_batched, self._score_batched):
            batched.set_max_batch_size(max_batch_size)
            batched.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self.page = (STATIC / "index.html").read_text()

    # -- generation --------------------------------------------------------------------------------
    # Decoding runs on the replica's event loop, not in a worker thread: a thread fights the loop for
    # the GIL, and batches stayed at 2-3 requests (benchmarks/serve_load.py); inline, requests that
    # arrive during a decode queue up and form the next batch. Other routes wait at most one batch.
    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _generate_batched(self, requests):
        return self.model.generate(requests)

    async def _generate(self, request):
        if self.batching:
            return await self._generate_batched(request)
        return self.model.generate([request])[0]  # one request at a time, as a plain server would

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _score_batched(self, requests):
        """Concurrent /get_reward requests scored in one call (each a (queries, prompts) pair)."""
        return self._score_all(requests)

    def _score_all(self, requests) -> list:
        """Each request's rewards, or the InputError that refuses it (the others still get theirs)."""
        from rayseq.models.reward_head import InputError

        flat_q, flat_p, spans = [], [], []
        for queries, prompts in requests:
            spans.append((len(flat_q), len(queries)))
            flat_q += queries
            flat_p += prompts if prompts is not None else [None] * len(queries)
        try:
            rewards = self.model.score(flat_q, flat_p)
        except InputError:  # one request's bad query: score each alone, so only that one is refused
            out = []
            for queries, prompts in requests:
                try:
                    out.append(self.model.score(queries, prompts))
                except InputError as exc:
                    out.append(exc)
            return out
        return [rewards[a : a + n] for a, n in spans]

    def _chat(self):
        """The chat model; a reward model's server refuses chat with a 404 that names its route."""
        if self.rewarding:
            raise StarletteHTTPException(404, "this server holds a reward model: POST /get_reward")
        return self.model

    def _check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        if not secrets.compare_digest(given.encode(), self.api_key.encode()):
            raise StarletteHTTPException(401, "missing or wrong API key (Authorization: Bearer KEY or X-API-Key)")

    def _gen_request(self, text, temperature, top_k, max_tokens, n, seed, **kw):
        from rayseq.serving.model import GenRequest, InputError

        try:  # an input the task does not read is refused here, before it joins a batch
            self.model.encode(text)
        except InputError as exc:
            raise StarletteHTTPException(422, str(exc)) from None

        return GenRequest(text=text, temperature=temperature, top_k=top_k,
                          max_tokens=max_tokens or self.model.max_tgt_len, n=n, seed=seed, **kw)

    # -- routes ------------------------------------------------------------------------------------
    @api.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page(self):
        return HTMLResponse(self.page)

    @api.get("/healthz")
    async def healthz(self):
        return {"status": "ok", "model": self.model.model_id, "batching": self.batching,
                "task": self.model.info["task"], "about": self.model.info["about"],
                "decoding": self.model.info["decoding"]}

    @api.get("/v1/models")
    async def models(self, request: Request):
        self._check_key(request)
        info = self.model.info
        return {"object": "list", "data": [{"id": info["id"], "object": "model", "owned_by": "rayseq",
                                            "created": 0, "details": info}]}

    @api.post("/v1/chat", response_model=ChatResponse)
    async def chat(self, body: ChatRequest, request: Request) -> ChatResponse:
        self._check_key(request)
        g = self._gen_request(self._chat().prompt_text([{"role": "user", "content": body.message}]), body.temperature,
                              body.top_k, body.max_tokens, body.num_replies, body.seed, top_p=body.top_p,
                              stop=tuple(body.stop or ()), repetition_penalty=body.repetition_penalty,
                              no_repeat_ngram_size=body.no_repeat_ngram_size)
        r = await self._generate(g)
        return ChatResponse(
            reply=r.replies[0], replies=r.replies if body.num_replies > 1 else None, model=self.model.model_id,
            usage=Usage(prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
                        total_tokens=r.prompt_tokens + r.completion_tokens),
            unknown_words=r.unknown_words, truncated_words=r.truncated_words,
        )

    @api.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest, request: Request):
        self._check_key(request)
        temperature = 1.0 if body.temperature is None else body.temperature  # OpenAI's default
        messages = [{"role": m.role, "content": m.content} for m in body.messages]
        g = self._gen_request(self._chat().prompt_text(messages), temperature, body.top_k or 0,
                              body.max_completion_tokens or body.max_tokens, body.n or 1, body.seed,
                              top_p=body.top_p, stop=body.stop_strings(), presence_penalty=body.presence_penalty,
                              frequency_penalty=body.frequency_penalty, repetition_penalty=body.repetition_penalty,
                              no_repeat_ngram_size=body.no_repeat_ngram_size,
                              logprobs=(body.top_logprobs or 0) if body.logprobs else None)
        r = await self._generate(g)
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        usage = {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                 "total_tokens": r.prompt_tokens + r.completion_tokens}
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(self._sse(cid, created, r, usage if include_usage else None),
                                     media_type="text/event-stream")
        return {
            "id": cid, "object": "chat.completion", "created": created, "model": self.model.model_id,
            "choices": [
                {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                 "logprobs": None if lp is None else {"content": lp, "refusal": None}}
                for i, (text, reason, lp) in enumerate(zip(r.replies, r.finish_reasons, r.logprobs))
            ],
            "usage": usage,
        }

    @api.post("/get_reward", response_model=RewardResponse)
    async def get_reward(self, body: RewardRequest, request: Request) -> RewardResponse:
        """OpenRLHF's remote reward model: ``{"query": [prompt + reply, ...]}`` → ``{"rewards": [...]}``."""
        self._check_key(request)
        if not self.rewarding:
            raise StarletteHTTPException(404, "this server holds a chat model, not a reward model (algo.name="
                                         "reward_model): /get_reward is a reward model's route")
        if body.prompts is not None and len(body.prompts) != len(body.query):
            raise StarletteHTTPException(422, f"prompts: {len(body.prompts)} items for {len(body.query)} queries")
        item = (list(body.query), None if body.prompts is None else list(body.prompts))
        rewards = await self._score_batched(item) if self.batching else self._score_all([item])[0]
        if isinstance(rewards, Exception):
            raise StarletteHTTPException(422, str(rewards))
        return RewardResponse(rewards=rewards, model=self.model.model_id)

    def _sse(self, cid, created, r, usage):
        """OpenAI's streaming shape: a role chunk, one chunk per token (its text piece, and its log-prob
        when asked for), a finish chunk, with ``usage`` a last chunk without choices, then [DONE]."""
        def chunk(i, delta, reason=None, logprobs=None):
            data = {"id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": self.model.model_id,
                    "choices": [{"index": i, "delta": delta, "finish_reason": reason, "logprobs": logprobs}]}
            return f"data: {json.dumps(data)}\n\n"

        async def events():
            for i, (pieces, reason, lp) in enumerate(zip(r.pieces, r.finish_reasons, r.logprobs)):
                yield chunk(i, {"role": "assistant", "content": ""})
                for j, piece in enumerate(pieces):
                    yield chunk(i, {"content": piece}, logprobs=None if lp is None else {"content": [lp[j]]})
                yield chunk(i, {}, reason)
            if usage is not None:
                data = {"id": cid, "object": "chat.completion.chunk", "created": created,
                        "model": self.model.model_id, "choices": [], "usage": usage}
                yield f"data: {json.dumps(data)}\n\n"
            yield "data: [DONE]\n\n"

        return events()


def _as_bool(v) -> bool:
    return v if isinstance(v, bool) else str(v).strip().lower() in ("1", "true", "yes", "on")


def build_app(args: dict):
    """Serve application builder. Args (strings from the command line, typed values from YAML):
    checkpoint (run directory, checkpoint file or URI; default $RAYSEQ_CHECKPOINT), replicas (1),
    batching (true), max_batch_size (32), batch_wait_timeout_s (0.005), max_ongoing_requests (64),
    api_key (default $RAYSEQ_API_KEY; none = open), device (cpu | cuda), num_gpus (0 per replica), engine (builtin |
    vllm: a Hugging Face checkpoint decoded by vLLM, rayseq.engines.vllm_engine), engine_kwargs (vllm.LLM's)."""
    from rayseq.checkpoint import check_base_model, select_checkpoint
    from rayseq.storage import is_uri

    known = {"checkpoint", "replicas", "batching", "max_batch_size", "batch_wait_timeout_s",
             "max_ongoing_requests", "api_key", "device", "num_gpus", "torch_threads", "engine", "engine_kwargs"}
    unknown = set(args) - known
    if unknown:
        raise ValueError(f"build_app: unknown argument(s) {sorted(unknown)}; known: {sorted(known)}")
    checkpoint = args.get("checkpoint") or os.environ.get("RAYSEQ_CHECKPOINT")
    if not checkpoint:
        raise ValueError(
            "no checkpoint: set RAYSEQ_CHECKPOINT=runs/<run> (what serve/chatbot.yaml leaves empty), or give "
            "checkpoint=PATH (a run directory, checkpoint file or URI)"
        )
    if not is_uri(checkpoint):
        checkpoint = str(Path(checkpoint).expanduser().absolute())  # replicas may run elsewhere
    # fails here, with the path, if none loads (skips damaged ones); and when the policy's base model is not there
    checkpoint, head = select_checkpoint(checkpoint)
    check_base_model(head, args.get("checkpoint") or os.environ.get("RAYSEQ_CHECKPOINT"))
    device = str(args.get("device", "cpu"))
    num_gpus = float(args.get("num_gpus", 1 if device == "cuda" else 0))
    deployment = ChatDeployment.options(
        num_replicas=int(args.get("replicas", 1)),
        max_ongoing_requests=int(args.get("max_ongoing_requests", 64)),
        ray_actor_options={"num_cpus": 1, "num_gpus": num_gpus},
    )
    return deployment.bind(
        checkpoint=checkpoint,
        batching=_as_bool(args.get("batching", True)),
        max_batch_size=int(args.get("max_batch_size", 32)),
        batch_wait_timeout_s=float(args.get("batch_wait_timeout_s", 0.005)),
        api_key=args.get("api_key") or None,
        device=device,
        torch_threads=int(args.get("torch_threads", 1)),
        engine=str(args.get("engine", "builtin")),
        engine_kwargs=dict(args.get("engine_kwargs") or {}),
    )
