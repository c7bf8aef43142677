"""A local Hugging Face causal LM as the policy (``model.arch=hf``, ``model.path=DIR``): π_θ(y_t | x, y_<t) is the
LM's next-token distribution on the sequence ``x <bos> y_1 … y_{t−1}`` (the prompt, the separator, the reply so far),
or on ``x y_1 … y_{t−1}`` when the prompt marks its own end (``separator=False``: prompts rendered by the tokenizer's
chat template end with its generation prompt, e.g. ``<|assistant|>``, and the reply follows it directly, as every
other tool that reads the model writes it).

The phase methods are those of :class:`rayseq.models.protocol.StepDecoding`, on the same shapes and conventions
(right-padded ``src`` with ``src_len``, replies ending at ``eos`` and padded after, banned ids at logit −inf,
log-prob 0 at pad positions): :meth:`HFCausalLM.logprobs` runs the whole teacher-forced sequence in one forward
pass; sampling, serving-time generation, greedy decoding and the first-step distribution are the RNN's decoding
loops (the same functions) run on this model's :meth:`HFCausalLM.encode` (the prompt through the LM, its KV
cache kept) and :meth:`HFCausalLM.decode_step` (one token with the cache). Prompts are left-aligned inside the LM's
input (left padding, masked, with position ids counting real tokens only), so every row's reply starts at the same
column. ``states`` are the LM's last hidden layer at the positions that predict each reply token (the value
baseline's and the critic's input).

Weights (:meth:`HFCausalLM.state_dict`): what is trained — every parameter (full fine-tuning), or with
``model.lora_r`` > 0 only the LoRA adapters (peft, Hu et al. 2021), the base weights being ``model.path``'s.
Tied weights appear once, so the dict is safetensors-safe. The KL reference (:meth:`HFCausalLM.reference_policy`)
is a frozen copy of the model (full fine-tuning) or the same model with its adapters disabled (LoRA: no second
copy of the base weights).

The model is loaded with ``local_files_only=True``: never a download at run time.
"""

from __future__ import annotations

import copy
import inspect
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from rayseq.config import blame
from rayseq.models.chunked import LOGIT_ELEMENTS, chunked_token_logprobs, entropy_of_logits, positions_per_chunk
from rayseq.models.protocol import GeneratorOutput, StepDecoding


class _Prefix(NamedTuple):
    cache: object  # the LM's key/value cache (a transformers Cache object, e.g. DynamicCache)
    mask: torch.Tensor  # (B, L) attention mask of what the cache holds
    pos: torch.Tensor  # (B,) position id of the next token
    # without a separator: (logits (B, V), hidden (B, H)) of the prompt's last position, which the first
    # decode_step returns in place of feeding a separator; None once consumed (or with a separator)
    pending: tuple | None = None


def cache_keyword(model) -> str:
    """The keyword under which ``model``'s forward takes its key/value cache: ``cache`` (transformers >= 5.2x, where
    ``past_key_values`` is deprecated, to be removed in 5.40) or ``past_key_values`` (older releases)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model passes it through
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def load_causal_lm(path: str):
    """``AutoModelForCausalLM.from_pretrained(path, local_files_only=True)`` in float32. Under a ``meta`` default
    device (``with torch.device("meta")``: a sharded learner's ranks but rank 0, which receive their shards of the
    weights from rank 0) the same model from ``path``'s config alone, its weights not read, its parameters and
    buffers without storage."""
    try:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ImportError("model.arch=hf needs the hf extra: pip install 'rayseq[hf]'") from None
    hf_logging.disable_progress_bar()  # one bar per actor that builds the model, in every log
    where = Path(path).expanduser()
    if not (where / "config.json").is_file():  # every process that builds the policy reads it: on every node
        raise blame("model.path", FileNotFoundError(
            f"model.path={path}: no Hugging Face model there (no config.json) on this node"))
    if torch.get_default_device().type == "meta":
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(where), local_files_only=True)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()  # as from_pretrained leaves it
    try:
        return AutoModelForCausalLM.from_pretrained(str(where), local_files_only=True, dtype=torch.float32)
    except OSError as exc:  # a weights file missing or unreadable: the same error, naming the key
        blame("model.path", exc)
        raise


def output_ids(model, path: str, specials, vocab_size: int | None, banned_ids) -> tuple[int, tuple[int, ...]]:
    """(V, the ids the policy never emits) of the LM ``model`` (V: its output rows) read with a tokenizer of
    ``vocab_size`` tokens and the task's ``specials`` and ``banned_ids``: pad, the separator (unless it is also the end
    token, as GPT-2's <|endoftext|>), the task's banned ids, and the LM's padding rows beyond the tokenizer."""
    logits_dim = int(model.get_output_embeddings().weight.shape[0])
    if vocab_size is not None and vocab_size > logits_dim:
        raise ValueError(f"model.path={path}: the tokenizer has {vocab_size} tokens but the model only "
                         f"{logits_dim} output rows; model.resize_token_embeddings(len(tokenizer)) and save it")
    beyond = range(vocab_size, logits_dim) if vocab_size is not None else ()
    return logits_dim, tuple(sorted({specials.pad, specials.bos, *banned_ids, *beyond} - {specials.eos}))


class HFPolicyFrame:
    """A Hugging Face policy without its weights: what a rollout worker whose engine runs a model of its own
    (``rollout.engine=vllm``) knows of the policy — its directory, config, special and banned ids, output size, and
    the names, shapes and dtypes of its weights (:meth:`state_dict`: tensors on the ``meta`` device, no memory). The
    engine holds the only copy of the weights there; the policy's log-probs of what it samples are computed by the
    learners (:func:`rayseq.algos.common.behaviour_logprobs`).

    Args: as :class:`HFCausalLM`'s (full fine-tuning: a LoRA policy's engine merges the adapters into base weights,
    which only a whole policy holds), and ``dtype``: the weights' dtype (``model.dtype``)."""

    lora = False

    def __init__(self, path: str, specials, *, vocab_size: int | None = None, banned_ids: tuple[int, ...] = (),
                 separator: bool = True, dtype: torch.dtype = torch.float32):
        with torch.device("meta"):  # the layout alone: parameters without storage, no weights read
            self.model = load_causal_lm(path).to(dtype)
        self.path, self.separator = str(path), separator
        self.vocab_size, self.banned_ids = output_ids(self.model, path, specials, vocab_size, banned_ids)
        self.pad_id, self.bos_id, self.eos_id = specials.pad, specials.bos, specials.eos

    @classmethod
    def from_config(cls, cfg, task) -> HFPolicyFrame:
        """The frame of the policy :meth:`HFCausalLM.from_config` builds, in ``model.dtype``."""
        if cfg.model.lora_r:
            raise ValueError("model.lora_r > 0: the engine merges the adapters into the base weights, which only the "
                             "whole policy holds (HFCausalLM)")
        return cls(cfg.model.path, task.specials, vocab_size=len(task.vocab), banned_ids=tuple(task.banned_ids),
                   separator=getattr(task.vocab, "separator", True), dtype=getattr(torch, cfg.model.dtype))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """:meth:`HFCausalLM.state_dict`'s names (``model.`` + the Hugging Face model's parameter names, tied weights
        once), shapes and dtypes, on the meta device."""
        return {f"model.{n}": p for n, p in self.model.named_parameters()}


class HFCausalLM(nn.Module):
    """A Hugging Face causal LM with the rayseq policy interface (module docstring)."""

    weights_format = "safetensors"  # checkpoints write the trained weights as safetensors (rayseq.checkpoint)
    # rows × (prompt + reply) positions per learner pass when learner.micro_batch_size is unset: its passes with and
    # without gradients take max(1, this // (S + T)) rows at a time (rayseq.algos.common.micro_batch_rows)
    micro_batch_tokens = 16_384
    logit_elements = LOGIT_ELEMENTS  # fp32 logits per chunk of the head (rayseq.models.chunked)

    def __init__(self, path: str, specials, *, vocab_size: int | None = None, banned_ids: tuple[int, ...] = (),
                 lora_r: int = 0, lora_alpha: float = 16.0, lora_dropout: float = 0.0,
                 lora_target_modules: list[str] | None = None, separator: bool = True):
        super().__init__()
        self.separator = separator  # ``x <bos> y`` (True) or ``x y`` (a prompt that marks its own end)
        model = load_causal_lm(path)
        self.path = str(path)
        self.hidden_dim = self.state_dim = int(model.config.hidden_size)  # H of the states the baseline reads
        self.lora = lora_r > 0
        if self.lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                                                     target_modules=lora_target_modules, task_type="CAUSAL_LM"))
        self.model = model
        base = model.get_base_model() if self.lora else model
        self._backbone = getattr(base, base.base_model_prefix)  # the LM without its head: last hidden states
        self._cache_kw = cache_keyword(model)
        self.vocab_size, self.banned_ids = output_ids(model, path, specials, vocab_size, banned_ids)
        self.pad_id, self.bos_id, self.eos_id = specials.pad, specials.bos, specials.eos
        self.conditional = True
        ban = torch.zeros(self.vocab_size)
        ban[list(self.banned_ids)] = float("-inf")
        self.register_buffer("logit_bias", ban, persistent=False)
        # what is trained, hence saved and published: the adapters, or every (distinct) parameter
        self._trained = [n for n, p in self.named_parameters() if p.requires_grad or not self.lora]

    @classmethod
    def from_config(cls, cfg, task) -> HFCausalLM:
        """The policy of ``model.path`` with the task's special ids (its vocabulary is the model's tokenizer)."""
        m = cfg.model
        if not getattr(task, "conditional", True):
            raise ValueError(f"model.arch=hf: the {getattr(task, 'name', '')} task is unconditional; use a prompt -> "
                             "reply task")
        return cls(m.path, task.specials, vocab_size=len(task.vocab), banned_ids=tuple(task.banned_ids),
                   lora_r=m.lora_r, lora_alpha=m.lora_alpha, lora_dropout=m.lora_dropout,
                   lora_target_modules=m.lora_target_modules, separator=getattr(task.vocab, "separator", True))

    # -- weights ------------------------------------------------------------------------------------
    def state_dict(self, *args, **kwargs) -> dict:
        """The trained weights only (module docstring), detached; tied weights once."""
        params = dict(self.named_parameters())
        return {n: params[n].detach() for n in self._trained}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load :meth:`state_dict`'s weights (the same names, all of them)."""
        missing, extra = set(self._trained) - set(state_dict), set(state_dict) - set(self._trained)
        if missing or extra:
            raise KeyError(f"HFCausalLM weights do not match: missing {sorted(missing)[:3]}, unexpected "
                           f"{sorted(extra)[:3]} (a checkpoint of another model.path or model.lora_r?)")
        params = dict(self.named_parameters())
        with torch.no_grad():
            for n in self._trained:
                params[n].copy_(state_dict[n])
        return nn.modules.module._IncompatibleKeys([], [])

    def reference_policy(self):
        """π_ref for the KL penalty: a frozen copy (full fine-tuning) or this model with its adapters disabled."""
        if self.lora:
            return _AdaptersDisabled(self)
        return copy.deepcopy(self).eval().requires_grad_(False)

    def fsdp_blocks(self) -> list[nn.Module]:
        """The LM's decoder layers (its backbone's largest list of modules: GPT-2's ``h``, Llama's ``layers``): a
        sharded learner gathers each one's parameters around its forward (rayseq.distributed.actors.sharding)."""
        lists = [m for m in self._backbone.children() if isinstance(m, nn.ModuleList)]
        return list(max(lists, key=len)) if lists else []

    # -- building blocks ----------------------------------------------------------------------------
    def _left_aligned(self, src: torch.Tensor, src_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded (B, S) -> left-padded ids (B, S) and their mask (B, S) (prompts end at column S−1)."""
        S = src.shape[1]
        col = torch.arange(S, device=src.device).unsqueeze(0) - (S - src_len).unsqueeze(1)
        mask = col >= 0
        ids = src.gather(1, col.clamp(min=0)).masked_fill(~mask, self.pad_id)
        return ids, mask.long()

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float() + self.logit_bias

    def _hidden(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache=None) -> torch.Tensor:
        """The LM's last hidden layer (B, L, H) (after its final norm: what its head reads), and no other layer's;
        ``cache``: a key/value cache to use and extend."""
        kw = {self._cache_kw: cache} if cache is not None else {}
        out = self._backbone(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=cache is not None, **kw)
        return out.last_hidden_state

    token_logp = StepDecoding.token_logp

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> _Prefix:
        """Run the prompts through the LM: its KV cache, mask and next position (the state of :meth:`decode_step`);
        without a separator also the last position's logits and hidden state (the first reply token's)."""
        ids, mask = self._left_aligned(src, src_len)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        from transformers import DynamicCache

        cache = DynamicCache()
        if not self.separator:
            if not ids.shape[1] or bool((src_len <= 0).any()):
                raise ValueError("a policy whose prompts mark their own end (a chat template's generation prompt) "
                                 "needs a non-empty prompt in every row")
            hidden = self._hidden(ids, mask, pos, cache)[:, -1]
            return _Prefix(cache, mask, mask.sum(1), (self.output_logits(hidden), hidden))
        if ids.shape[1]:
            self._hidden(ids, mask, pos, cache)
        return _Prefix(cache, mask, mask.sum(1))

    def decode_step(self, tok: torch.Tensor, state: _Prefix):
        """One token through the LM with the cache: tok (B,) -> logits (B, V) (banned ids −inf), hidden (B, H),
        new state. Without a separator the first step (``tok`` = ``<bos>``, the decoding loops' start) feeds
        nothing: the prompt's last position already gave the first reply token's distribution."""
        if state.pending is not None:
            logits, hidden = state.pending
            return logits, hidden, state._replace(pending=None)
        mask = torch.cat([state.mask, torch.ones_like(state.mask[:, :1])], 1)
        hidden = self._hidden(tok.unsqueeze(1), mask, state.pos.unsqueeze(1), state.cache)  # the cache: in place
        return self.output_logits(hidden)[:, 0], hidden[:, 0], _Prefix(state.cache, mask, state.pos + 1)

    def advance(self, tok: torch.Tensor, state: _Prefix):
        """:meth:`decode_step` without the logits: (hidden (B, H), new state) (the step protocol's building block)."""
        _, hidden, state = self.decode_step(tok, state)
        return hidden, state

    def output_logits(self, out: torch.Tensor) -> torch.Tensor:
        """The LM's output layer on last-layer hidden states (..., H) -> (..., V), banned ids at −inf: the logits
        the LM itself gives (its head is a linear map of the final, normalised hidden state)."""
        return self._logits(self.model.get_output_embeddings()(out))

    # -- phase methods ------------------------------------------------------------------------------
    def _sequence_states(self, src: torch.Tensor, src_len: torch.Tensor,
                         tokens: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The last hidden layer (B, L, H) of one pass over ``x <bos> y_1 … y_{T−1}`` (without a separator
        ``x y_1 … y_{T−1}``) and the column of its first reply prediction: columns start..start+T−1 predict the
        reply's tokens (start = S, or S−1 without a separator: the distributions read one position earlier)."""
        S = src.shape[1]
        ids, mask = self._left_aligned(src, src_len)
        if self.separator:
            bos = torch.full_like(tokens[:, :1], self.bos_id)
            ids = torch.cat([ids, bos, tokens[:, :-1]], 1)
            mask = torch.cat([mask, torch.ones_like(tokens)], 1)
            start = S
        else:
            ids = torch.cat([ids, tokens[:, :-1]], 1)
            mask = torch.cat([mask, torch.ones_like(tokens[:, :-1])], 1)
            start = S - 1
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        return self._hidden(ids, mask, pos), start

    def fits_one_pass(self, rows: int, length: int) -> bool:
        """Whether ``rows`` of ``length`` = S + T positions are small enough for one pass with the head on every
        position, as the LM's own forward runs it: at most ``micro_batch_tokens`` positions and one chunk's worth of
        logits (``logit_elements``, :data:`rayseq.models.chunked.LOGIT_ELEMENTS`). Larger passes run the head on the
        reply's positions only, a chunk at a time (the same values to float rounding: the head's matmul over fewer
        rows rounds differently)."""
        positions = rows * length
        return positions <= self.micro_batch_tokens and positions * self.vocab_size <= self.logit_elements

    def _reply_head(self, hidden: torch.Tensor, start: int, T: int) -> torch.Tensor:
        """Logits (B, T, V) of the reply's positions: the head on the whole sequence then sliced while that fits one
        pass (:meth:`fits_one_pass`), else on the reply's positions only (the prompt's predict nothing)."""
        if self.fits_one_pass(hidden.shape[0], hidden.shape[1]):
            return self.output_logits(hidden)[:, start : start + T]
        return self.output_logits(hidden[:, start : start + T])

    def reply_states(self, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T, H) the last hidden layer at the positions that predict each reply token, without the LM head (a
        reward model's head reads the one at the reply's <eos>: the hidden state of its last token)."""
        hidden, start = self._sequence_states(src, src_len, tokens)
        return hidden[:, start : start + tokens.shape[1]]

    def logprobs(self, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor) -> GeneratorOutput:
        """Teacher-forced log-probs of ``tokens`` (B, T) in one pass over ``x <bos> y_1 … y_{T−1}`` (without a
        separator ``x y_1 … y_{T−1}``); the logits (B, T, V) of the reply's positions (:meth:`_reply_head`)."""
        T = tokens.shape[1]
        hidden, start = self._sequence_states(src, src_len, tokens)
        logits = self._reply_head(hidden, start, T)
        return GeneratorOutput(self.token_logp(logits, tokens), hidden[:, start : start + T], logits)

    def enable_checkpointing(self, on: bool = True) -> None:
        """Recompute the LM's layer activations in the backward pass (transformers' gradient checkpointing)."""
        if on:
            self.model.gradient_checkpointing_enable()
        else:
            self.model.gradient_checkpointing_disable()

    def chunked_logprobs(self, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor, *,
                         entropy: bool = False, chunk: int | None = None) -> GeneratorOutput:
        """:meth:`logprobs` for the gradient pass without its (B, T, V) logits (``logits`` None): the log-probs and
        (``entropy``) the entropies H(π(·|s_t)) (B, T) come from the head run on the reply's positions, ``chunk`` at a
        time (default: :func:`rayseq.models.chunked.positions_per_chunk` of V), each chunk's logits recomputed in the
        backward pass (:func:`rayseq.models.chunked.chunked_token_logprobs`). A pass that :meth:`fits_one_pass` (and
        no ``chunk`` given) is :meth:`logprobs`' arithmetic, its logits dropped after the log-probs and entropies."""
        T = tokens.shape[1]
        hidden, start = self._sequence_states(src, src_len, tokens)
        states = hidden[:, start : start + T]
        if chunk is None and self.fits_one_pass(hidden.shape[0], hidden.shape[1]):
            logits = self._reply_head(hidden, start, T)
            return GeneratorOutput(self.token_logp(logits, tokens), states, None,
                                   entropy_of_logits(logits) if entropy else None)
        logp, ent = chunked_token_logprobs(self.output_logits, states, tokens, self.pad_id,
                                           chunk or positions_per_chunk(self.vocab_size, self.logit_elements),
                                           entropy)
        return GeneratorOutput(logp, states, None, ent)

    def lean_logprobs(self, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor,
                      chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`logprobs`' log-probs (B, T) and states (B, T, H) without its (B, T, V) logits: the head runs on
        ``chunk`` positions at a time, so no more than (B, chunk, V) logits exist at once (the passes without
        gradients: baseline states, the KL reference)."""
        T = tokens.shape[1]
        hidden, start = self._sequence_states(src, src_len, tokens)
        states = hidden[:, start : start + T]
        logp = torch.cat([self.token_logp(self.output_logits(states[:, t : t + chunk]), tokens[:, t : t + chunk])
                          for t in range(0, T, chunk)], 1)
        return logp, states

    # the RNN's decoding loops, on encode/decode_step above
    first_step_logprobs = StepDecoding.first_step_logprobs
    sample = StepDecoding.sample
    greedy = StepDecoding.greedy

    # serving's decoding, per-row settings and generators (its uniforms are drawn step by step: fine for a
    # 50k-150k vocabulary)
    generate = StepDecoding.generate


class _AdaptersDisabled:
    """π_ref of a LoRA policy: its ``logprobs`` with the adapters disabled and in eval mode (the base weights as
    loaded); nothing of its own to save."""

    def __init__(self, policy: HFCausalLM):
        self.policy = policy

    @contextmanager
    def _base(self):
        was_training = self.policy.training
        self.policy.eval()
        try:
            with self.policy.model.disable_adapter():
                yield
        finally:
            self.policy.train(was_training)

    @torch.no_grad()
    def logprobs(self, src, src_len, tokens) -> GeneratorOutput:
        with self._base():
            return self.policy.logprobs(src, src_len, tokens)

    @torch.no_grad()
    def lean_logprobs(self, src, src_len, tokens) -> tuple[torch.Tensor, torch.Tensor]:
        with self._base():
            return self.policy.lean_logprobs(src, src_len, tokens)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict) -> None:
        return None


__all__ = ["HFCausalLM", "load_causal_lm"]
