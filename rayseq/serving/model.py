"""A trained generator loaded read-only from a checkpoint, with text in and text out.

Everything needed comes from the checkpoint itself: the model sizes (its config), the vocabulary and
the tokenizer (its task spec), and what produced the weights (its driver state). :meth:`ChatModel.generate`
decodes a batch of requests at once, each with its own temperature, top-k, top-p, length cap, stop strings
and seed; replies are detokenised text (:mod:`rayseq.data.text`: no special tokens, ``<unk>`` shown as
``UNK_SHOWN``), optionally with OpenAI-style log-probs.
"""

from __future__ import annotations

import math
import os
import secrets
import time
from dataclasses import dataclass, field

import torch

from rayseq.checkpoint import load_latest
from rayseq.config import ModelConfig
from rayseq.data.hf_text import HFJoiner, HFVocab
from rayseq.data.subword import BPEJoiner, BPEVocab, vocab_from_spec
from rayseq.data.text import UNK_SHOWN, Joiner, tokenize
from rayseq.models.factory import generator_from_parts


def task_help(task: dict, max_src_len: int) -> str:
    """What the model was trained to do and what a good reply is, for the chat page: the task's own words (its spec),
    or for a checkpoint written before specs carried them, a line naming the task."""
    about = task.get("about") or (_OLD_HELP.get(task["name"], "").format(n=max_src_len)
                                  or f"A sequence generator trained on the {task['name']} task.")
    if task.get("tokenizer", {}).get("kind", "words") == "words":
        about += f" {UNK_SHOWN} stands for a word outside its vocabulary."
    return about


# decoding defaults a chat API applies unless a request says otherwise (a task's spec "decoding"): none for tasks
# whose replies repeat by design (counting: "1 1 1"); for chat (pairs, chitchat, PairsTask.decoding) the settings
# that keep a small model from looping ("i'm not sure. i'm not sure.")
NO_DEFAULTS = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "presence_penalty": 0.0,
               "frequency_penalty": 0.0, "top_p": 1.0}
_CHAT = {"no_repeat_ngram_size": 3, "repetition_penalty": 1.2, "top_p": 0.9}  # PairsTask.decoding when written
_OLD_DECODING = {"chitchat": _CHAT, "pairs": _CHAT}  # checkpoints written before specs carried "decoding"

# checkpoints written before the task spec carried `about`, `fixed_reply_length` and `conditional`
_OLD_HELP = {
    "counting": "Counting task (Tuan et al. 2018): send 1 to {n} digits x1 … xN, e.g. 9 2 3. A correct reply is "
                "three digits: for any position t, the number of digits before x_t, the digit x_t, and the number "
                "of digits after it. For 9 2 3 the correct replies are 0 9 2, 1 2 1 and 2 3 0.",
    "chitchat": "Chit-chat: a small sequence-to-sequence model trained on short dialogue turns; say something and "
                "it answers in one turn, without memory of earlier turns.",
}
_OLD_FIXED_LENGTH = {"counting": 3}
_OLD_CLOSED_INPUT = {"counting"}


class InputError(ValueError):
    """An input the model's task does not read (a closed language's unknown words, or too many words); the message
    names them (the server answers 422)."""
_OLD_UNCONDITIONAL = {"oracle"}


def produced_by(ck: dict) -> tuple[str, int]:
    """What produced a checkpoint's generator and after how many of its iterations: ("mle", n) while MLE
    pretraining (or D pretraining, or before the algorithm's first update, where G is as MLE left it),
    else (the algorithm, its iterations)."""
    driver, cfg = ck["driver"], ck["config"]
    stage, stage_iter = driver["stage"], int(driver.get("stage_iter", 0))
    if stage == "mle":
        return "mle", stage_iter
    if stage == "train" and stage_iter > 0:
        return cfg["algo"]["name"], stage_iter
    return "mle", int(cfg["train"]["pretrain_iters"])


@dataclass
class GenRequest:
    text: str  # the message the model answers
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = whole vocabulary
    top_p: float | None = None  # nucleus sampling: the most likely tokens holding this mass; 1 = all; None = default
    max_tokens: int = 20  # reply length cap (the HTTP layer enforces its own maximum)
    n: int = 1  # replies to sample
    seed: int | None = None  # reply i uses seed + i
    stop: tuple[str, ...] = ()  # a reply ends before the first of these strings (finish_reason "stop")
    logprobs: int | None = None  # None: no log-probs; k: each token's, with its k most likely alternatives
    # against repetition (StepDecoding.generate); None = the model's default (ChatModel.decoding)
    repetition_penalty: float | None = None  # θ ≥ 1: a token already in the reply has its logit divided by θ
    no_repeat_ngram_size: int | None = None  # n: no n-gram twice in a reply (0 = off)
    presence_penalty: float | None = None  # OpenAI's: logit − p for a token already in the reply
    frequency_penalty: float | None = None  # OpenAI's: logit − f · its count in the reply


@dataclass
class GenResult:
    replies: list[str]
    finish_reasons: list[str]  # "stop" (the model ended the reply, or a stop string) or "length" (the cap)
    prompt_tokens: int
    completion_tokens: int  # tokens decoded up to each reply's end (end token and stop string included)
    unknown_words: list[str] = field(default_factory=list)
    truncated_words: int = 0  # input words (tokens) left out at its start: the model reads the last max_src_len
    pieces: list[list[str]] = field(default_factory=list)  # per reply: its text, token by token
    logprobs: list[list[dict] | None] = field(default_factory=list)  # per reply: OpenAI's logprobs.content


class ChatModel:
    """``engine``: what decodes the replies: ``builtin`` (the policy's own ``generate``) or ``vllm`` (a Hugging Face
    policy's, :meth:`rayseq.engines.vllm_engine.VLLMEngine.generate_requests`, with the checkpoint's weights loaded;
    ``engine_kwargs`` go to ``vllm.LLM``)."""

    def __init__(self, checkpoint: str | os.PathLike, device: str = "cpu", engine: str = "builtin",
                 engine_kwargs: dict | None = None):
        t0 = time.perf_counter()
        # a run: its newest checkpoint that loads; its weights, not the optimizers
        self.checkpoint, ck = load_latest(checkpoint, map_location=device, training_state=False)
        task = ck["task"]
        if not task.get("conditional", task["name"] not in _OLD_UNCONDITIONAL):
            raise ValueError(f"{self.checkpoint}: an unconditional generator (task {task['name']}) takes no input to "
                             "reply to; serve a chat (or counting) checkpoint")
        hf = "hf_tokenizer" in task["vocab"]  # model.arch=hf: the model's own tokenizer (rayseq.data.hf_text)
        self.vocab = HFVocab.from_spec(task["vocab"]) if hf else vocab_from_spec(task["vocab"])
        tok = task.get("tokenizer", {"kind": "words", "lowercase": True})
        self.tokenizer_kind, self.lowercase = tok["kind"], tok.get("lowercase", True)
        # trained on conversations rendered with the tokenizer's chat template: requests are rendered the same way
        self.chat_template = hf and bool(tok.get("chat_template"))
        self.truecase = self.tokenizer_kind in ("words", "bpe") and self.lowercase  # "i'm fine" -> "I'm fine"
        self.max_src_len = int(task.get("max_src_len", 50))
        self.max_tgt_len = int(task.get("max_tgt_len", 20))
        # replies of a fixed length, without an end token: complete, finish_reason "stop", at that length
        self.fixed_length = task.get("fixed_reply_length", _OLD_FIXED_LENGTH.get(task["name"])) is not None
        self.closed_input = bool(task.get("closed_input", task["name"] in _OLD_CLOSED_INPUT)) and not hf
        self.task_name = task["name"]
        cfg = ck["config"]
        self.device = torch.device(device)
        self.generator = generator_from_parts(ModelConfig(**cfg["model"]), self.vocab, self.vocab.specials,
                                              banned_ids=tuple(task.get("banned_ids", ())))
        self.generator.load_state_dict(ck["learner"]["generator"])
        self.generator.to(self.device).eval()
        self.engine = None
        if engine == "vllm":
            from rayseq.engines.vllm_engine import VLLMEngine

            self.engine = VLLMEngine.for_policy(self.generator, engine_kwargs=engine_kwargs)
            # the checkpoint's weights, from the policy just loaded
            self.engine.load_weights(self.generator.state_dict(), 0)
        elif engine != "builtin":
            raise ValueError(f"engine={engine!r}: one of builtin, vllm")
        self.decoding = {**NO_DEFAULTS, **task.get("decoding", _OLD_DECODING.get(task["name"], {}))}
        if self.engine is not None:  # vLLM bans no n-grams: not a default it can apply (a request asking is refused)
            self.decoding["no_repeat_ngram_size"] = 0
        # never reply with <unk> ("…"); a Hugging Face tokenizer's unk is its pad, banned anyway
        self.banned_ids = () if hf else (self.vocab.specials.unk,)
        by, its = produced_by(ck)
        self.model_id = f"rayseq-{task['name']}-{by}-it{its}"
        driver = ck["driver"]
        self.info = {
            "id": self.model_id, "task": task["name"], "algo": cfg["algo"]["name"], "produced_by": by,
            "stage": driver["stage"], "stage_iteration": int(driver.get("stage_iter", 0)),
            "iteration": driver["iteration"],
            "about": task_help(task, self.max_src_len),
            "checkpoint": self.checkpoint, "vocab_size": len(self.vocab), "device": str(self.device),
            "engine": engine,
            "decoding": dict(self.decoding),
            "load_s": round(time.perf_counter() - t0, 3),
        }

    def _joiner(self):
        """Incremental detokeniser of a reply by token id: ``push(id)`` -> the text it adds, ``peek(id)``."""
        if isinstance(self.vocab, HFVocab):
            return HFJoiner(self.vocab)
        if isinstance(self.vocab, BPEVocab):
            return BPEJoiner(self.vocab, self.truecase)
        return _WordJoiner(Joiner(self.tokenizer_kind, self.truecase), self.vocab.itos)

    def prompt_text(self, messages: list[dict]) -> str:
        """What the model reads of a conversation: the chat template's rendering (``self.chat_template``, as the
        training prompts were; rayseq.data.hf_text), else the last message's content."""
        if self.chat_template:
            return self.vocab.render([{"role": m["role"], "content": m["content"] or ""} for m in messages])
        return messages[-1]["content"]

    def encode(self, text: str) -> tuple[list[int], list[str], int]:
        """Token ids of ``text`` (its last ``max_src_len``: the model's input length), the words that were unknown
        and how many were left out at the start. A task with a closed input language (counting) raises InputError
        for an unknown word or an input longer than it reads, naming them, instead of answering another input."""
        if isinstance(self.vocab, (HFVocab, BPEVocab)):  # subword pieces: the last max_src_len of them
            ids = self.vocab.encode_text(text, 1 << 30).tolist()
            unknown = []  # a Hugging Face tokenizer knows every word; BPE only lacks characters training never saw
            if isinstance(self.vocab, BPEVocab):
                words = tokenize(text, "words", self.lowercase)
                unknown = [w for w in words if self.vocab.specials.unk in self.vocab.encode_words([w])]
            return ids[-self.max_src_len :], unknown, max(0, len(ids) - self.max_src_len)
        words = tokenize(text, self.tokenizer_kind, self.lowercase)
        ids = self.vocab.encode(words).tolist()
        unk = self.vocab.specials.unk
        if self.closed_input:
            self._check_closed(words, [w for w, i in zip(words, ids) if i == unk])
        cut = max(0, len(words) - self.max_src_len)
        return ids[cut:], [w for w, i in zip(words[cut:], ids[cut:]) if i == unk], cut

    def _check_closed(self, words: list[str], unknown: list[str]) -> None:
        sp = self.vocab.specials
        language = [w for i, w in enumerate(self.vocab.itos) if i not in (sp.pad, sp.bos, sp.eos, sp.unk)]
        what = (f"1 to {self.max_src_len} of {' '.join(language)}" if len(language) <= 40
                else f"1 to {self.max_src_len} words of its vocabulary")
        if unknown:
            shown = ", ".join(repr(w) for w in dict.fromkeys(unknown))
            raise InputError(f"input outside the {self.task_name} task's language: {shown} (it reads {what})")
        if not words or len(words) > self.max_src_len:
            raise InputError(f"input of {len(words)} tokens: the {self.task_name} task reads {what}; nothing was "
                             "left out or guessed")

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Decode all replies of all requests in one batch."""
        rows, encoded = [], []
        for r in requests:
            ids, unknown, cut = self.encode(r.text)
            ids = ids or [self.vocab.specials.unk]  # an input of only spaces/punctuation the tokenizer drops
            encoded.append((ids, unknown, cut))
            base = r.seed if r.seed is not None else secrets.randbits(62)
            rows += [(ids, r, base + i) for i in range(r.n)]
        B, S = len(rows), max(len(ids) for ids, _, _ in rows)
        src = torch.full((B, S), self.vocab.specials.pad, dtype=torch.long)
        for i, (ids, _, _) in enumerate(rows):
            src[i, : len(ids)] = torch.tensor(ids)
        dev = self.device
        cap = [min(r.max_tokens, self.max_tgt_len) if self.fixed_length else r.max_tokens for _, r, _ in rows]
        src, src_len = src.to(dev), torch.tensor([len(ids) for ids, _, _ in rows], device=dev)
        def per_row(name, kind=float):
            return torch.tensor([kind(self._setting(r, name)) for _, r, _ in rows], device=dev)

        decode = self.generator.generate if self.engine is None else self.engine.generate_requests
        out = decode(
            src, src_len, torch.tensor(cap, device=dev),
            torch.tensor([float(r.temperature) for _, r, _ in rows], device=dev),
            torch.tensor([int(r.top_k) for _, r, _ in rows], device=dev),
            [torch.Generator(device=dev).manual_seed(seed % 2**63) for _, _, seed in rows],
            top_p=per_row("top_p"), repetition_penalty=per_row("repetition_penalty"),
            presence_penalty=per_row("presence_penalty"), frequency_penalty=per_row("frequency_penalty"),
            no_repeat_ngram_size=per_row("no_repeat_ngram_size", int), banned_ids=self.banned_ids,
        )
        tokens, lengths = out.tokens.cpu().tolist(), out.token_mask.sum(1).long().cpu().tolist()
        logp = self._scores(src, src_len, out.tokens, [i for i, (_, r, _) in enumerate(rows) if r.logprobs is not None])
        results, row = [], 0
        for r, (ids, unknown, cut) in zip(requests, encoded):
            res = GenResult([], [], len(ids), 0, unknown, truncated_words=cut)
            for _ in range(r.n):
                text, reason, n_tokens, pieces, entries = self._reply(tokens[row][: lengths[row]], r, logp.get(row))
                res.replies.append(text)
                res.finish_reasons.append(reason)
                res.completion_tokens += n_tokens
                res.pieces.append(pieces)
                res.logprobs.append(entries)
                row += 1
            results.append(res)
        return results

    def _setting(self, r: GenRequest, name: str):
        """A request's decoding setting, or the model's default when it gave none."""
        value = getattr(r, name)
        return self.decoding[name] if value is None else value

    def _scores(self, src, src_len, tokens, rows: list[int]) -> dict[int, torch.Tensor]:
        """log π_θ(· | x, y_<t) over the vocabulary at every reply position, (T, V) per row asked for (one
        teacher-forced pass, only when some request wants log-probs)."""
        if not rows or tokens.shape[1] == 0:
            return {}
        idx = torch.tensor(rows, device=src.device)
        with torch.no_grad():
            logits = self.generator.logprobs(src[idx], src_len[idx], tokens[idx]).logits
        return dict(zip(rows, torch.log_softmax(logits.float(), dim=-1).cpu()))

    def _reply(self, seq: list[int], r: GenRequest, logp: torch.Tensor | None):
        """One decoded row -> (text, finish_reason, completion tokens, pieces, logprobs entries or None)."""
        eos = self.vocab.specials.eos
        ended = bool(seq) and seq[-1] == eos
        complete = ended or (self.fixed_length and len(seq) >= self.max_tgt_len)
        reason, n_tokens = ("stop" if complete else "length"), len(seq)
        joiner = self._joiner()
        pieces, entries, text = [], ([] if logp is not None else None), ""
        for j, tid in enumerate(seq[:-1] if ended else seq):
            if entries is not None:
                entries.append(self._logprob_entry(joiner, logp[j], tid, r.logprobs))
            piece = joiner.push(tid)
            pieces.append(piece)
            text += piece
            hits = [i for i in (text.find(s) for s in r.stop) if i >= 0]
            if hits:  # decoding would have stopped at this token; the reply ends before the stop string
                cut, n_tokens, reason = min(hits), j + 1, "stop"
                text, kept, start = text[:cut], [], 0
                for p in pieces:  # the pieces that start before the cut, the last one shortened
                    if start >= cut:
                        break
                    kept.append(p[: cut - start])
                    start += len(p)
                pieces = kept
                if entries is not None:
                    entries = entries[: len(kept)]
                break
        return text, reason, n_tokens, pieces, entries

    def _logprob_entry(self, joiner, logp: torch.Tensor, tid: int, k: int) -> dict:
        """OpenAI's ``logprobs.content`` item for the token ``tid`` about to be pushed: its text piece, log-prob
        and the ``k`` most likely tokens here (``<eos>``: ending the reply; impossible tokens left out)."""
        def item(t: int, lp: float) -> dict:
            if t == self.vocab.specials.eos:
                return {"token": "<eos>", "logprob": lp, "bytes": None}
            piece = joiner.peek(t)
            return {"token": piece, "logprob": lp, "bytes": list(piece.encode())}

        entry = item(tid, float(logp[tid]))
        top = []
        if k:
            values, ids = logp.topk(min(k, logp.shape[0]))
            top = [item(int(t), float(v)) for v, t in zip(values.tolist(), ids.tolist()) if math.isfinite(v)]
        return {**entry, "top_logprobs": top}


class _WordJoiner:
    """:class:`rayseq.data.text.Joiner` by token id (the words/chars tokenizers)."""

    def __init__(self, joiner: Joiner, itos: list[str]):
        self.joiner, self.itos = joiner, itos

    def push(self, tid: int) -> str:
        return self.joiner.push(self.itos[tid])

    def peek(self, tid: int) -> str:
        return self.joiner.peek(self.itos[tid])
