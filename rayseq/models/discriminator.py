"""SeqGAN's CNN discriminator D_φ(Y): the probability that a token sequence is real.

References
- Yu, Zhang, Wang, Yu (2017), "SeqGAN: Sequence Generative Adversarial Nets with Policy Gradient",
  section "The Discriminative Model for Sequences": Eq. 11 (embedding matrix E_{1:T}), Eq. 12
  (c_i = ρ(w ⊗ E_{i:i+l−1} + b)), max-over-time pooling c̃ = max{c_1, …, c_{T−l+1}}, a highway layer
  on the pooled features, a fully connected layer with a sigmoid. Trained by Eq. 5
  (:func:`rayseq.losses.discriminator.discriminator_loss`).
- Kim (2014), "Convolutional Neural Networks for Sentence Classification"; Zhang & LeCun (2015).
- Srivastava, Greff, Schmidhuber (2015), "Highway Networks".
- The SeqGAN code (github.com/LantaoYu/SeqGAN, ``discriminator.py``) for the defaults: filter sizes
  1..10, 15, 20 with 100/200/.../160 filters, dropout keep-prob 0.75, one highway layer, and
  ``l2_reg_lambda=0.2`` on the output layer only. That code uses a 2-class softmax; one logit with a
  sigmoid is the same model (softmax of [0, z] is [1 − σ(z), σ(z)]).

Variable lengths (the paper fixes T; its footnote 2 notes max-over-time pooling handles any length):
a row of length n keeps the windows of width l that lie inside it, starts i = 0..n−l, as the paper's
c_1..c_{T−l+1}; when n < l only window 0 is kept, whose tail is pad embeddings (= 0). Windows that
start at or beyond n are therefore always masked, and so are windows that run past the end of a row
(those would make the output depend on how far the batch is padded). Appending pad tokens or putting
garbage after ``lengths`` never changes a row's output.

Shapes: B batch, T tokens, S source, L packed length, E embedding, F = sum(num_filters) features.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

# SeqGAN code, ``sequence_gan.py``: dis_filter_sizes / dis_num_filters (synthetic data, T = 20)
SEQGAN_FILTER_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20)
SEQGAN_NUM_FILTERS = (100, 200, 200, 200, 200, 100, 100, 100, 100, 100, 160, 160)
# score_shared_prefix convolves groups of at least this many rows (sorted by shared length; the Monte-Carlo
# search's B·N = 1,024 continuations of prefix t form one group at the paper's sizes)
SHARED_GROUP_ROWS = 512


class Highway(nn.Module):
    """One highway layer (Srivastava et al. 2015) in the SeqGAN code's convention:

    t = σ(W_t x + b_t)            transform gate
    y = t · relu(W_h x + b_h) + (1 − t) · x   (1 − t is the carry gate)

    The SeqGAN code calls ``highway(h_pool_flat, size, num_layers=1, bias=0)``, so the gate gets no
    negative bias offset (the helper's default −2 is not used); b_t starts at PyTorch's default.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.transform = nn.Linear(dim, dim)  # W_h, b_h
        self.gate = nn.Linear(dim, dim)  # W_t, b_t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.sigmoid(self.gate(x))
        return t * F.relu(self.transform(x)) + (1.0 - t) * x


class CNNDiscriminator(nn.Module):
    """SeqGAN's CNN text classifier D_φ(Y) (see the module docstring).

    Phase methods: :meth:`forward` returns the logit z (B,) for training with
    ``F.binary_cross_entropy_with_logits``; :meth:`prob` returns D(Y) = σ(z), the probability that
    Y is real; :meth:`score` returns D(Y) for many sequences in chunks without gradients (rewards);
    :meth:`score_shared_prefix` returns the same for rows that start with prefixes of a few base sequences
    (SeqGAN's Monte-Carlo continuations), convolving each prefix's windows once.

    Inputs are right-padded token ids with lengths. With ``src`` the judged sequence is
    ``src[:src_len] + [sep_id] + tokens[:lengths]`` (an (input, reply) pair of a seq2seq task).
    L2 as in the SeqGAN code: pass ``disc.out.parameters()`` to ``discriminator_loss``.
    """

    def __init__(
        self,
        vocab_size: int,
        emb_dim: int = 64,
        filter_sizes: Sequence[int] = SEQGAN_FILTER_SIZES,
        num_filters: Sequence[int] = SEQGAN_NUM_FILTERS,
        dropout: float = 0.25,
        pad_id: int = 0,
        sep_id: int = 1,
    ):
        super().__init__()
        filter_sizes, num_filters = tuple(int(l) for l in filter_sizes), tuple(int(n) for n in num_filters)
        if len(filter_sizes) != len(num_filters):
            raise ValueError(
                f"filter_sizes and num_filters must have the same length, got {len(filter_sizes)} "
                f"filter sizes {filter_sizes} and {len(num_filters)} filter numbers {num_filters}"
            )
        if not filter_sizes:
            raise ValueError("filter_sizes must not be empty")
        if min(filter_sizes) < 1 or min(num_filters) < 1:
            raise ValueError(
                f"filter sizes and numbers must be >= 1, got filter_sizes={filter_sizes}, num_filters={num_filters}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.vocab_size, self.pad_id, self.sep_id = vocab_size, pad_id, sep_id
        self.filter_sizes, self.num_filters = filter_sizes, num_filters
        self.max_filter = max(filter_sizes)
        num_features = sum(num_filters)  # F
        self.embedding = nn.Embedding(vocab_size, emb_dim, padding_idx=pad_id)
        # One Conv1d per filter size: measured 3.6x faster on CPU than one conv with all kernels
        # zero-padded to width max(filter_sizes) (paper sizes, B = 4096, T = 20, 1 thread).
        self.convs = nn.ModuleList(nn.Conv1d(emb_dim, n, l) for l, n in zip(filter_sizes, num_filters))
        self.highway = Highway(num_features)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(num_features, 1)

    # -- building blocks -------------------------------------------------------------------------
    def pack(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        src: torch.Tensor | None = None,
        src_len: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The judged sequences, right-padded with pad_id: -> seq (B, L) int64, n (B,) lengths.

        Without ``src``: tokens[:lengths]. With ``src``: src[:src_len] + [sep_id] + tokens[:lengths].
        L = max(max n, max(filter_sizes)) so that every filter has at least one window.
        """
        B, T = tokens.shape
        if B and int(lengths.max()) > T:
            raise ValueError(f"lengths must be <= tokens.shape[1] = {T}, got max {int(lengths.max())}")
        if src is None:
            n = lengths
            L = max(int(n.max()) if B else 0, self.max_filter)
            if L > T:
                tokens = F.pad(tokens, (0, L - T), value=self.pad_id)
            pos = torch.arange(L, device=tokens.device)
            return tokens[:, :L].masked_fill(pos >= n[:, None], self.pad_id), n
        if src_len is None:
            raise ValueError("src_len is required with src")
        S = src.shape[1]
        if B and int(src_len.max()) > S:
            raise ValueError(f"src_len must be <= src.shape[1] = {S}, got max {int(src_len.max())}")
        n = src_len + 1 + lengths
        L = max(int(n.max()) if B else 0, self.max_filter)
        sep = torch.full_like(tokens[:, :1], self.sep_id)
        pad = torch.full_like(tokens[:, :1], self.pad_id)
        row = torch.cat([src, sep, tokens, pad], dim=1)  # (B, S + T + 2): column S is sep, S+T+1 pad
        pos = torch.arange(L, device=tokens.device)[None]  # (1, L)
        sl = src_len[:, None]
        # position p < src_len reads src[p]; p = src_len reads sep (column S); p > src_len reads
        # tokens[p − src_len − 1] (column S + 1 + p − src_len − 1): both are column p − src_len + S
        idx = torch.where(pos < sl, pos, pos - sl + S)
        idx = torch.where(pos < n[:, None], idx, S + T + 1)
        return row.gather(1, idx), n

    def features(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        src: torch.Tensor | None = None,
        src_len: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Max-over-time pooled convolution features (B, F), before the highway layer."""
        seq, n = self.pack(tokens, lengths, src, src_len)
        L = seq.shape[1]
        # (B, E, L), pad embeddings are 0; contiguous: the convs run ~5% faster on CPU
        emb = self.embedding(seq).transpose(1, 2).contiguous()
        mask = bool((n < L).any())  # False when every row fills L, e.g. fixed-length SeqGAN batches
        starts = torch.arange(L, device=seq.device)  # window start positions
        pooled = []
        for conv, l in zip(self.convs, self.filter_sizes):
            c = conv(emb)  # (B, n_l, L − l + 1) pre-activation c_i (Eq. 12 without ρ)
            if mask:
                last = (n - l).clamp(min=0)  # (B,) last start of a window inside the row; 0 keeps window 0
                outside = starts[: c.shape[-1]][None] > last[:, None]  # (B, L − l + 1)
                c = c.masked_fill_(outside[:, None], float("-inf"))  # in place: conv backward does not need c
            pooled.append(c.amax(-1))
        # ρ = relu after the max: relu is monotone, so max_i relu(c_i) = relu(max_i c_i)
        return F.relu(torch.cat(pooled, dim=1))

    # -- phase methods ---------------------------------------------------------------------------
    def forward(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        src: torch.Tensor | None = None,
        src_len: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens (B, T) int64, lengths (B,), optional src (B, S), src_len (B,) -> logit z (B,)."""
        h = self.highway(self.features(tokens, lengths, src, src_len))
        return self.out(self.dropout(h)).squeeze(-1)

    def prob(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        src: torch.Tensor | None = None,
        src_len: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """D(Y) = σ(z) (B,): the probability that each sequence is real."""
        return torch.sigmoid(self(tokens, lengths, src, src_len))

    def score(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        src: torch.Tensor | None = None,
        src_len: torch.Tensor | None = None,
        batch_size: int = 4096,
    ) -> torch.Tensor:
        """D(Y) (N,) for N sequences, in chunks of ``batch_size``, in eval mode, without gradients.

        The previous train/eval mode is restored afterwards. Each chunk is padded only to its own
        longest row, which does not change the output (see the module docstring).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                out = [
                    self.prob(
                        tokens[i : i + batch_size],
                        lengths[i : i + batch_size],
                        None if src is None else src[i : i + batch_size],
                        None if src_len is None else src_len[i : i + batch_size],
                    )
                    for i in range(0, tokens.shape[0], batch_size)
                ]
        finally:
            self.train(was_training)
        return torch.cat(out) if out else torch.zeros(0, device=tokens.device)

    def score_shared_prefix(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        cont: torch.Tensor,
        cont_len: torch.Tensor,
        prefix_len: torch.Tensor,
        src: torch.Tensor | None = None,
        src_len: torch.Tensor | None = None,
        batch_size: int = 4096,
    ) -> torch.Tensor:
        """D(Y) (B, P, N) of rows that share prefixes with B base sequences, each prefix's windows convolved once.

        tokens (B, T) base sequences, lengths (B,); cont (B, P, N, T') rows, cont_len (B, P, N); prefix_len
        broadcastable to (B, P): row (b, j, n) must equal ``tokens[b]`` on its first min(prefix_len[b, j],
        cont_len[b, j, n], lengths[b]) tokens (SeqGAN's Monte-Carlo continuations: prefix j + 1 of sequence b,
        then the rollout policy's tokens). Optional src (B, S), src_len (B,) are shared by all rows of b.

        Equal (to float rounding) to :meth:`score` on the B·P·N materialised rows, with less work: a window that
        lies inside the shared prefix holds the same tokens for every row of (b, j), so its convolution is a
        window of the base sequence. One pass over the B base sequences gives, per filter, the running max over
        window starts (``cummax``); a row reads the max over its shared windows there and convolves only the
        windows that reach past the prefix. Rows are sorted by shared length and chunked (``batch_size`` rows),
        and a chunk convolves from the first window that is not shared by all its rows (windows shared by some
        of them are computed twice, which the max does not mind). At SeqGAN's sizes (T = 20, prefixes 1..19) a
        third of the convolution work lies inside prefixes.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        B, P, N, _ = cont.shape
        if tokens.shape[0] != B or cont_len.shape != (B, P, N):
            raise ValueError(
                f"cont (B, P, N, T) = {tuple(cont.shape)} needs tokens (B, T) and cont_len (B, P, N), got tokens "
                f"{tuple(tokens.shape)}, cont_len {tuple(cont_len.shape)}"
            )
        if B * P * N == 0:
            return torch.zeros(B, P, N, device=tokens.device)
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                out = self._score_shared_prefix(tokens, lengths, cont, cont_len, prefix_len, src, src_len, batch_size)
        finally:
            self.train(was_training)
        return out

    def _score_shared_prefix(self, tokens, lengths, cont, cont_len, prefix_len, src, src_len, batch_size):
        B, P, N, Tc = cont.shape
        dev = tokens.device
        R = B * P * N
        # shared windows: running max over window starts of each base sequence's convolution
        base, _ = self.pack(tokens, lengths, src, src_len)  # (B, Lb)
        emb = self.embedding(base).transpose(1, 2).contiguous()
        run_max = [conv(emb).cummax(-1).values.transpose(1, 2).contiguous() for conv in self.convs]  # (B, Wb, n_l)
        Wb = [m.shape[1] for m in run_max]
        offset = torch.zeros(B, dtype=torch.long, device=dev) if src is None else src_len.long() + 1  # src + sep
        pre = torch.broadcast_to(torch.as_tensor(prefix_len, device=dev).long(), (B, P))
        shared = torch.minimum(torch.minimum(pre[:, :, None], cont_len.long()), lengths.long()[:, None, None])
        shared = shared.clamp(min=0)  # (B, P, N) tokens shared with the base sequence
        k = min(tokens.shape[1], Tc)  # shared <= both lengths <= both widths
        pos = torch.arange(k, device=dev)
        differ = (cont[..., :k] != tokens[:, None, None, :k]) & (pos < shared[..., None])
        if bool(differ.any()):
            b, j, n, t = (int(x) for x in differ.nonzero()[0])
            raise ValueError(
                f"cont[{b}, {j}, {n}] differs from tokens[{b}] at position {t} < min(prefix_len, cont_len, lengths)"
                f" = {int(shared[b, j, n])}: rows must start with their base sequence's prefix"
            )
        shared = (shared + offset[:, None, None]).reshape(R)  # packed positions shared with the base
        row_b = torch.arange(B, device=dev).repeat_interleave(P * N)
        flat, flat_len = cont.reshape(R, Tc), cont_len.reshape(R)
        order = torch.argsort(shared, stable=True)
        # filter l as a (l·E, n_l) matrix on unfolded windows: [k·E + e, f] = weight[f, e, k]
        w_mm = [conv.weight.permute(2, 1, 0).reshape(-1, conv.out_channels) for conv in self.convs]
        z = torch.empty(R, dtype=self.out.weight.dtype, device=dev)
        for a in range(0, R, batch_size):
            idx = order[a : a + batch_size]
            rb, sh = row_b[idx], shared[idx]
            seq, n = self.pack(flat[idx], flat_len[idx], None if src is None else src[rb],
                               None if src_len is None else src_len[rb])
            e_tl = self.embedding(seq)  # (r, L, E)
            # convolve by groups of rows with (nearly) the same shared length: a group convolves from the first
            # window not shared by all its rows, so that mixing shared lengths in a chunk wastes little
            _, counts = torch.unique_consecutive(sh, return_counts=True)
            bounds, size = [0], 0
            for c in counts.tolist():
                size += c
                if size >= SHARED_GROUP_ROWS:
                    bounds.append(bounds[-1] + size)
                    size = 0
            if size:
                bounds.append(bounds[-1] + size)
            pooled = torch.cat([
                self._prefix_pooled(e_tl[g0:g1], n[g0:g1], sh[g0:g1], rb[g0:g1], run_max, Wb, w_mm)
                for g0, g1 in zip(bounds[:-1], bounds[1:])
            ])
            h = self.highway(F.relu(pooled))
            z[idx] = self.out(self.dropout(h)).squeeze(-1)
        return torch.sigmoid(z).view(B, P, N)

    def _prefix_pooled(self, e_tl, n, sh, rb, run_max, Wb, w_mm):
        """Max-pooled features before the relu (r, F) of rows with embeddings e_tl (r, L, E), lengths n, shared
        lengths sh (packed positions) with base rows rb: the base's running max over the shared windows, and
        the windows from the first one not shared by every row of the group."""
        r, L, E = e_tl.shape
        dev = e_tl.device
        e = None  # (r, E, L), made when a filter needs Conv1d
        s_min = int(sh.min())
        mask = bool((n < L).any())  # as in features(): no row shorter than the group, no window to mask
        pooled = []
        for conv, l, m, wb, w in zip(self.convs, self.filter_sizes, run_max, Wb, w_mm):
            # windows i <= sh − l lie inside the shared prefix: their max is the base's running max at sh − l
            j = sh - l
            p = m[rb, j.clamp(0, wb - 1)]  # (r, n_l)
            p = p.masked_fill_((j < 0)[:, None], float("-inf"))
            first = max(0, s_min - l + 1)  # windows from here on are not shared by every row of the group
            nw = L - l + 1 - first  # windows i = first + k, k < nw
            if nw > 0:
                # narrow filters or few windows: one matmul on the unfolded windows (its copy is l·E floats a
                # window), the bias added after the max; measured on the 2-core machine at the paper's sizes,
                # 4,096 rows: 1.2-2.5x faster than Conv1d for l <= 5, up to 5x for 1-3 windows, slower for l >= 6
                # with many windows
                if l <= 5 or nw <= 3:
                    x = e_tl[:, first:].unfold(1, l, 1).transpose(2, 3).reshape(-1, l * E)
                    c = torch.mm(x, w).view(r, nw, w.shape[1])  # (r, nw, n_l) without the bias
                    win_dim, bias = 1, conv.bias
                else:
                    if e is None:
                        e = e_tl.transpose(1, 2).contiguous()
                    c = conv(e[:, :, first:])  # (r, n_l, nw)
                    win_dim, bias = 2, None
                if mask:
                    last = (n - l).clamp(min=0)  # as in features(): 0 keeps window 0 of a row shorter than l
                    outside = torch.arange(first, first + nw, device=dev)[None] > last[:, None]  # (r, nw)
                    c = c.masked_fill_(outside.unsqueeze(3 - win_dim), float("-inf"))
                c = c.amax(win_dim)
                p = torch.maximum(p, c if bias is None else c + bias)
            pooled.append(p)
        return torch.cat(pooled, dim=1)


def build_discriminator(
    vocab_size: int,
    emb_dim: int = 64,
    filter_sizes: Sequence[int] = SEQGAN_FILTER_SIZES,
    num_filters: Sequence[int] = SEQGAN_NUM_FILTERS,
    dropout: float = 0.25,
    pad_id: int = 0,
    sep_id: int = 1,
) -> CNNDiscriminator:
    """A :class:`CNNDiscriminator` from plain values (what a config section holds)."""
    return CNNDiscriminator(vocab_size, emb_dim, filter_sizes, num_filters, dropout, pad_id, sep_id)
