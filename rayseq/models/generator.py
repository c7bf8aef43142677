"""RNN generators (``model.arch=rnn``, the default): GRU/LSTM encoder-decoder (Tuan et al. Sec. 3: seq2seq policy
π_θ(y_t | x, y_<t)) and, with ``conditional=False``, the unconditional LSTM language model of SeqGAN (Yu et al.
Sec. 4: G_θ(y_t | Y_1:t−1); its initial state is zero and ``src`` is ignored).

The class follows the policy protocol of :mod:`rayseq.models.protocol`: it writes the building blocks
(``encode``, ``advance``, ``output_logits``) and the teacher-forced :meth:`Seq2SeqGRU.logprobs` (one cuDNN/MKL
pass); sampling, greedy decoding, serving's ``generate`` and ``first_step_logprobs`` come from
:class:`rayseq.models.protocol.StepDecoding` (phase methods: training, rollouts and serving each call their own).

Shapes: B batch, S source length, T target length, H hidden, V vocabulary. Sources are right-padded;
``src_len`` gives lengths. Decoding starts from ``bos_id`` and a sequence ends at ``eos_id`` (kept
in the output and in the masks) or at ``max_len``. ``<pad>`` and ``<bos>`` are never valid outputs, and
a task may ban more ids (``banned_ids``: the oracle task bans every special, which fixes the length at
``max_len`` as in SeqGAN): all of them get logit −inf in :meth:`Seq2SeqGRU.output_logits`, the one place every
phase method takes its logits from, so the policy that is trained, evaluated and served is one
distribution. Log-probs of ``<pad>`` positions (after a sequence's end) are 0, not −inf, so masked
losses stay finite. The recurrent state ``h`` is a tensor (L, B, H) for GRU and a pair
of them for LSTM; :func:`state_index` / :func:`state_cat` handle both.
"""

from __future__ import annotations

import torch
from torch import nn

from rayseq.models.protocol import GeneratorOutput, SampleOutput, StepDecoding, state_cat, state_index


class Seq2SeqGRU(StepDecoding, nn.Module):
    """Encoder-decoder (``conditional=True``) or decoder-only (``False``) RNN policy; ``cell`` gru|lstm."""

    def __init__(
        self,
        vocab_size: int,
        emb_dim: int = 128,
        hidden_dim: int = 128,
        num_layers: int = 1,
        dropout: float = 0.0,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
        *,
        cell: str = "gru",
        conditional: bool = True,
        banned_ids: tuple[int, ...] = (),
    ):
        super().__init__()
        if cell not in ("gru", "lstm"):
            raise ValueError(f"cell must be 'gru' or 'lstm', got {cell!r}")
        self.vocab_size, self.pad_id, self.bos_id, self.eos_id = vocab_size, pad_id, bos_id, eos_id
        self.hidden_dim, self.num_layers, self.cell, self.conditional = hidden_dim, num_layers, cell, conditional
        self.embedding = nn.Embedding(vocab_size, emb_dim, padding_idx=pad_id)
        rnn_dropout = dropout if num_layers > 1 else 0.0
        rnn = nn.GRU if cell == "gru" else nn.LSTM
        if conditional:
            self.encoder = rnn(emb_dim, hidden_dim, num_layers, batch_first=True, dropout=rnn_dropout)
        self.decoder = rnn(emb_dim, hidden_dim, num_layers, batch_first=True, dropout=rnn_dropout)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden_dim, vocab_size)
        self.banned_ids = tuple(sorted({pad_id, bos_id, *banned_ids}))  # never valid outputs
        ban = torch.zeros(vocab_size)
        ban[list(self.banned_ids)] = float("-inf")
        self.register_buffer("logit_bias", ban, persistent=False)  # (V,) 0 or −inf

    @classmethod
    def from_config(cls, cfg, task) -> Seq2SeqGRU:
        """``model.arch=rnn``: the task's generator (conditional or not, banned ids) from the ``model.*`` sizes."""
        return build_generator(len(task.vocab), cfg.model, task.specials, conditional=task.conditional,
                               banned_ids=task.banned_ids)

    # -- building blocks -------------------------------------------------------------------------
    def encode(self, src: torch.Tensor, src_len: torch.Tensor):
        """src (B, S), src_len (B,) -> initial decoder state ((L, B, H), or a pair for LSTM).

        Unconditional models start from zeros (SeqGAN's h_0 = c_0 = 0)."""
        if not self.conditional:
            w = self.embedding.weight
            z = torch.zeros(self.num_layers, src.shape[0], self.hidden_dim, device=w.device, dtype=w.dtype)
            return (z, z.clone()) if self.cell == "lstm" else z
        emb = self.embedding(src)
        packed = nn.utils.rnn.pack_padded_sequence(
            emb, src_len.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
        )
        _, h = self.encoder(packed)
        return h

    def output_logits(self, states: torch.Tensor) -> torch.Tensor:
        """Output logits with the banned ids at −inf (in place: no second (B, V) copy)."""
        return self.out(self.dropout(states)).add_(self.logit_bias)

    _logits = output_logits

    def advance(self, tok: torch.Tensor, h):
        """Feed one token: tok (B,), h -> decoder output (B, H), new h (MC search steps its rollouts with it)."""
        out, h = self.decoder(self.embedding(tok).unsqueeze(1), h)
        return out[:, 0], h

    # -- phase methods ----------------------------------------------------------------------------
    def logprobs(self, src: torch.Tensor, src_len: torch.Tensor, tokens: torch.Tensor) -> GeneratorOutput:
        """Teacher-forced log-probs of ``tokens`` (B, T): decoder input is BOS, y_1..y_{T-1}."""
        h0 = self.encode(src, src_len)
        bos = torch.full_like(tokens[:, :1], self.bos_id)
        dec_in = torch.cat([bos, tokens[:, :-1]], dim=1)
        states, _ = self.decoder(self.embedding(dec_in), h0)
        logits = self.output_logits(states)
        return GeneratorOutput(self.token_logp(logits, tokens), states, logits)


def build_generator(vocab_size: int, model_cfg, specials, *, conditional: bool = True,
                    banned_ids: tuple[int, ...] = ()) -> Seq2SeqGRU:
    """Generator from a ModelConfig and a vocabulary's special ids (the task says conditional/banned)."""
    return Seq2SeqGRU(
        vocab_size,
        emb_dim=model_cfg.emb_dim,
        hidden_dim=model_cfg.hidden_dim,
        num_layers=model_cfg.num_layers,
        dropout=model_cfg.dropout,
        pad_id=specials.pad,
        bos_id=specials.bos,
        eos_id=specials.eos,
        cell=getattr(model_cfg, "cell", "gru"),
        conditional=conditional,
        banned_ids=banned_ids,
    )


__all__ = ["GeneratorOutput", "SampleOutput", "Seq2SeqGRU", "build_generator", "state_cat", "state_index"]
