"""SeqGAN's synthetic oracle task (Yu et al. 2017, Sec. 5 "Synthetic Data Experiments", Table 1, Fig. 2).

An oracle LSTM G_oracle (vocabulary 5,000, embedding and hidden 32, parameters N(0, 1)) generates
10,000 training sequences of length 20; an unconditional LSTM generator learns from them. Because the
true distribution is known, quality is measured exactly:

- ``nll_oracle`` = −E_{Y∼G_θ}[(1/T) Σ_t log G_oracle(y_t | Y_1:t−1)], over ``eval_samples`` (≥ 10,000)
  generator samples (the paper's NLL-oracle, Eq. 15),
- ``nll_data`` = the generator's mean per-token NLL of held-out oracle samples (the literature's NLL-test).

``val/*`` (every ``train.eval_every`` iterations; what selects): NLL-oracle of samples drawn with ``val_seed``,
NLL of ``val_size`` validation samples of the oracle (``val_seed``). ``test/*`` (once at the end; what is
reported): NLL-oracle of samples drawn with ``test_seed``, NLL of ``test_size`` test samples (``test_seed``).
Training, validation and test sequences are independent draws of the oracle.

The oracle is either seeded random N(0, 1) (``task.oracle_seed``) or loaded from a user-given ``.npz``
with the array names of ``shared/data/README.md`` (``task.oracle_path``; SeqGAN's published oracle gives
MLE 9.038, SeqGAN 8.736, random generator 10.310 in its Table 1). Oracle token j is our id j + 4: ids
0-3 are the special tokens, which the generator never emits (``banned_ids``), so every sequence has
exactly ``seq_len`` tokens as in SeqGAN. There is no task reward: the discriminator provides it.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from pydantic import Field
from torch import nn

from rayseq.config.paths import LOCAL_PATH
from rayseq.tasks.base import SPLIT_FIELDS, Task
from rayseq.tasks.evaluation import EvalDecode, check_split, chunked, evaluate_here
from rayseq.types import PromptBatch
from rayseq.vocab import SPECIAL_TOKENS, Vocab

OFFSET = len(SPECIAL_TOKENS)
ORACLE_ARRAYS = ("embedding", "W_i", "U_i", "b_i", "W_f", "U_f", "b_f", "W_o", "U_o", "b_o",
                 "W_c", "U_c", "b_c", "W_out", "b_out")


class OracleLSTM(nn.Module):
    """The oracle's recurrence exactly as in shared/data/README.md (row vectors times matrices; token 0
    is the start token at t = 0; h_0 = c_0 = 0). Token ids here are the oracle's own, 0..V−1."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        super().__init__()
        missing = [k for k in ORACLE_ARRAYS if k not in arrays]
        if missing:
            raise ValueError(f"oracle arrays missing: {missing}")
        for k in ORACLE_ARRAYS:
            self.register_buffer(k, torch.as_tensor(np.asarray(arrays[k], dtype=np.float32)))
        V, E = self.embedding.shape
        H = self.U_i.shape[0]
        if self.W_out.shape != (H, V) or self.W_i.shape != (E, H) or self.b_out.shape != (V,):
            raise ValueError(f"oracle arrays have inconsistent shapes: embedding {tuple(self.embedding.shape)}, "
                             f"W_i {tuple(self.W_i.shape)}, W_out {tuple(self.W_out.shape)}")
        self.vocab_size, self.hidden = V, H
        # the four gates in one matmul: x [W_i W_f W_o W_c] + h [U_i U_f U_o U_c] + b
        self.register_buffer("W", torch.cat([self.W_i, self.W_f, self.W_o, self.W_c], 1))
        self.register_buffer("U", torch.cat([self.U_i, self.U_f, self.U_o, self.U_c], 1))
        self.register_buffer("b", torch.cat([self.b_i, self.b_f, self.b_o, self.b_c]))

    @classmethod
    def random(cls, vocab_size: int = 5000, hidden: int = 32, seed: int = 0) -> OracleLSTM:
        """All parameters N(0, 1), as SeqGAN's target LSTM initialises them."""
        g = np.random.default_rng(seed)
        shapes = {"embedding": (vocab_size, hidden), "W_out": (hidden, vocab_size), "b_out": (vocab_size,)}
        for gate in "ifoc":
            shapes |= {f"W_{gate}": (hidden, hidden), f"U_{gate}": (hidden, hidden), f"b_{gate}": (hidden,)}
        return cls({k: g.standard_normal(shapes[k]).astype(np.float32) for k in ORACLE_ARRAYS})

    @classmethod
    def load(cls, path: str | Path) -> OracleLSTM:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"task.oracle_path: no such file: {path}")
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            raise ValueError(f"task.oracle_path: {path} is not a readable .npz: {exc}") from None
        try:
            return cls(arrays)
        except ValueError as exc:
            raise ValueError(f"task.oracle_path: {path}: {exc}") from None

    def _cell(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        H = self.hidden
        z = torch.addmm(self.b, x, self.W).addmm_(h, self.U)
        i, f, o = torch.sigmoid(z[:, :H]), torch.sigmoid(z[:, H : 2 * H]), torch.sigmoid(z[:, 2 * H : 3 * H])
        c = f * c + i * torch.tanh(z[:, 3 * H :])
        return o * torch.tanh(c), c

    @torch.no_grad()
    def nll(self, tokens: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
        """tokens (B, T) oracle ids -> (B,) mean per-token NLL under the oracle (teacher forcing)."""
        out = []
        for a in range(0, tokens.shape[0], batch_size):
            y = tokens[a : a + batch_size]
            n = y.shape[0]
            h = torch.zeros(n, self.hidden)
            c = torch.zeros(n, self.hidden)
            prev = torch.zeros(n, dtype=torch.long)  # start token 0
            total = torch.zeros(n)
            for t in range(y.shape[1]):
                h, c = self._cell(self.embedding[prev], h, c)
                logits = torch.addmm(self.b_out, h, self.W_out)  # fused: big temporaries cost page faults here
                total -= logits.gather(1, y[:, t : t + 1]).squeeze(1) - torch.logsumexp(logits, -1)
                prev = y[:, t]
            out.append(total / y.shape[1])
        return torch.cat(out)

    @torch.no_grad()
    def sample(self, n: int, seq_len: int, seed: int, batch_size: int = 500) -> torch.Tensor:
        """(n, seq_len) oracle ids, temperature 1, reproducible for a seed."""
        from rayseq.models.sampling import sample_with_logp

        g = torch.Generator().manual_seed(seed)
        out = []
        for a in range(0, n, batch_size):
            m = min(batch_size, n - a)
            h, c = torch.zeros(m, self.hidden), torch.zeros(m, self.hidden)
            prev = torch.zeros(m, dtype=torch.long)
            cols = []
            for _ in range(seq_len):
                h, c = self._cell(self.embedding[prev], h, c)
                prev, _ = sample_with_logp(torch.addmm(self.b_out, h, self.W_out), torch.rand(m, generator=g))
                cols.append(prev)
            out.append(torch.stack(cols, 1))
        return torch.cat(out)


class OracleTask(Task):
    name = "oracle"
    fields = {
        **SPLIT_FIELDS,
        "oracle_path": (str | None, Field(
            None, description="Oracle: .npz with the oracle LSTM's arrays (SeqGAN's original); None = a random one.",
            json_schema_extra=LOCAL_PATH)),
        "oracle_seed": (int, Field(0, description="Oracle: seed of the random N(0,1) oracle (when no oracle_path).")),
        "vocab_size": (int, Field(
            5000, ge=2, description="Oracle: vocabulary of a random oracle (a file sets its own).")),
        "oracle_hidden": (int, Field(32, ge=1, description="Oracle: embedding and hidden size of a random oracle.")),
        "seq_len": (int, Field(20, ge=2, description="Oracle: sequence length (no end token).")),
        "num_train": (int, Field(10000, ge=1, description="Oracle: training sequences sampled from the oracle.")),
        "data_seed": (int, Field(88, description="Oracle: seed of the training sequences (SeqGAN's code uses 88).")),
        "eval_samples": (int, Field(10000, ge=1, description="Oracle: generator samples scored by NLL-oracle.")),
    }
    has_reward, has_references, scored_remotely = False, False, False  # the discriminator gives SeqGAN's reward
    conditional = False  # unconditional generator: src is empty (B, 0)

    def __init__(self, cfg):
        self.cfg = cfg
        if cfg.oracle_path:
            self.oracle = OracleLSTM.load(cfg.oracle_path)
        else:
            self.oracle = OracleLSTM.random(cfg.vocab_size, cfg.oracle_hidden, cfg.oracle_seed)
        V = self.oracle.vocab_size
        self.vocab = Vocab([f"w{i}" for i in range(V)])
        self.specials = self.vocab.specials
        self.banned_ids = tuple(range(OFFSET))
        self.max_src_len = 0
        self.max_tgt_len = cfg.seq_len

    # sampled on first use (seconds at 10,000 × 20): rollout workers and scorers never need them
    @cached_property
    def train_data(self) -> np.ndarray:
        """(num_train, seq_len) int64 training sequences (our ids), sampled from the oracle with data_seed."""
        return self.oracle.sample(self.cfg.num_train, self.cfg.seq_len, self.cfg.data_seed).numpy() + OFFSET

    @cached_property
    def test_data(self) -> np.ndarray:
        """(test_size, seq_len) int64 held-out oracle samples (test_seed) for NLL-test."""
        return self.oracle.sample(self.cfg.test_size, self.cfg.seq_len, self.cfg.test_seed).numpy() + OFFSET

    @cached_property
    def val_data(self) -> np.ndarray:
        """(val_size, seq_len) int64 validation oracle samples (val_seed)."""
        return self.oracle.sample(self.cfg.val_size, self.cfg.seq_len, self.cfg.val_seed).numpy() + OFFSET

    def sample_prompts(self, rng: np.random.Generator, n: int, *, with_targets: bool = False) -> PromptBatch:
        """``n`` empty prompts; with targets, ``n`` training sequences drawn uniformly (the real data)."""
        src = np.zeros((n, 0), dtype=np.int64)
        src_len = np.zeros(n, dtype=np.int64)
        if not with_targets:
            return PromptBatch(src, src_len)
        idx = rng.integers(0, len(self.train_data), size=n)
        return PromptBatch(src, src_len, self.train_data[idx], np.full(n, self.cfg.seq_len, dtype=np.int64))

    def rewards(self, src, src_len, tokens, token_mask, key=None) -> tuple[np.ndarray, np.ndarray]:
        """No task reward (the discriminator gives SeqGAN's): zeros."""
        return np.zeros(tokens.shape, dtype=np.float32), np.zeros(len(tokens), dtype=np.float32)

    @classmethod
    def metric_names(cls, cfg, split: str) -> list[str]:
        return [f"{split}/nll_oracle", f"{split}/nll_data"]

    # -- evaluation: samples on the rollout workers, the NLLs here (rayseq.tasks.evaluation) ---------------------
    eval_batch = 1000

    def evaluate(self, generator, device="cpu", *, split: str = "val") -> tuple[dict, dict]:
        """``<split>/nll_oracle`` and ``<split>/nll_data`` (module docstring)."""
        return evaluate_here(self, generator, device, split=split)

    def eval_decodes(self, split: str) -> list[EvalDecode]:
        """``task.eval_samples`` sequences sampled from the generator, in chunks of :attr:`eval_batch` (chunk c seeded
        with ``chunk_seed(split seed, c)``)."""
        seed = self.cfg.val_seed if check_split(split) == "val" else self.cfg.test_seed
        return chunked(split, "sampled", self.cfg.eval_samples, self.eval_batch, self.cfg.seq_len, seed)

    def eval_inputs(self, decode: EvalDecode) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((decode.rows, 0), dtype=np.int64), np.zeros(decode.rows, dtype=np.int64)

    @torch.no_grad()
    def eval_figures(self, split: str, decoded: list, generator, device="cpu") -> tuple[dict, dict]:
        """NLL-oracle: the oracle's mean NLL of the sampled sequences; NLL of the held-out data under the generator
        (its likelihood, computed here in chunks of :attr:`eval_batch`)."""
        held_out = self.val_data if split == "val" else self.test_data
        decodes = self.eval_decodes(split)
        if len(decodes) != len(decoded):
            raise ValueError(f"{len(decodes)} decodes, {len(decoded)} results")
        nll_oracle = [self.oracle.nll(torch.from_numpy(tokens) - OFFSET) for tokens, _ in decoded]
        nll_test = []
        for a in range(0, len(held_out), self.eval_batch):
            y = torch.from_numpy(held_out[a : a + self.eval_batch]).to(device)
            empty = torch.zeros(len(y), 0, dtype=torch.long, device=device)
            lp = generator.logprobs(empty, torch.zeros(len(y), dtype=torch.long, device=device), y).logp
            nll_test.append(-lp.mean(1).cpu())
        metrics = {
            f"{split}/nll_oracle": float(torch.cat(nll_oracle).mean()),
            f"{split}/nll_data": float(torch.cat(nll_test).mean()),
        }
        return metrics, {}
