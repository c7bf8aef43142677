"""The counting task of Tuan & Lee (2018), used in Tuan et al. (2018) Sec. 5.1, Table 1, Fig. 1-2, Supp. D.

Input x = x_1..x_N, digits 0-9, N uniform in [1, 10]. Output y = (t−1, x_t, N−t) for any t in 1..N,
so one input has N correct outputs (one-to-many). Reward: 1 if correct, else 0.

Evaluation on a validation set of ``val_size`` inputs drawn with ``val_seed`` (``val/*``, every
``train.eval_every`` iterations: what selects) and on a held-out test set of ``test_size`` inputs drawn with
``test_seed`` (``test/*``, once at the end: what is reported), the same metrics on each:
- ``precision``: share of correct greedy outputs (``precision_sampled``: temperature-1 samples),
- ``reward``: mean reward of those samples: the task's own (then it equals ``precision_sampled``) or the
  configured one (``reward.*``),
- the distribution of y_1 for each N (exact, from the model's first-step softmax restricted to digits
  and renormalised) against the ground truth, uniform over 0..N−1: total-variation distance
  ``y1_tv_n{N}`` and its mean over N ``y1_tv``,
- Supplement D's "variance of the distribution of the first word": the variance over the 10 digit
  probabilities, averaged over inputs (``y1_var_n{N}``; one-hot = 0.09, uniform over N digits =
  1/(10N) − 0.01).
Inputs of length N ≥ 4 are in at most one of train, validation and test (validation inputs that are test
inputs are redrawn; training inputs that are either are redrawn); shorter inputs are too few to split
(10 + 100 + 1000 of them).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from rayseq.rewards import terminal_rewards
from rayseq.tasks.base import SPLIT_FIELDS, Task, sampled_reward
from rayseq.tasks.evaluation import EvalDecode, check_split, chunked, evaluate_here, joined
from rayseq.types import PromptBatch
from rayseq.vocab import Vocab

MIN_DISJOINT_LEN = 4
TARGET_LEN = 3
SPLITS = ("val", "test")


class CountingTask(Task):
    name = "counting"
    fields = {
        **SPLIT_FIELDS,
        "min_len": (int, Field(1, ge=1, le=10, description="Counting: shortest input length N.")),
        "max_len": (int, Field(10, ge=1, le=10, description="Counting: longest input length N.")),
    }
    has_reward, has_references, scored_remotely = True, False, False  # 0/1 correctness: cheap, on the workers

    @classmethod
    def check_config(cls, run_cfg) -> None:
        task = run_cfg.task
        if task.min_len > task.max_len:
            raise ValueError(f"task.min_len={task.min_len} > task.max_len={task.max_len}")

    def __init__(self, cfg):
        self.cfg = cfg
        self.vocab = Vocab([str(d) for d in range(10)])
        self.specials = self.vocab.specials
        self.digit0 = self.vocab.stoi["0"]
        self.max_src_len = cfg.max_len
        self.max_tgt_len = TARGET_LEN
        self.test_src, self.test_len = self._draw(np.random.default_rng(cfg.test_seed), cfg.test_size)
        self._held_out = self._long_keys(self.test_src, self.test_len)
        # validation: redrawn where it hits the test set, then held out from training too
        self.val_src, self.val_len = self._draw_outside(np.random.default_rng(cfg.val_seed), cfg.val_size)
        self._held_out = np.union1d(self._held_out, self._long_keys(self.val_src, self.val_len))

    def split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The inputs (n, S) and lengths (n,) of the ``val`` or ``test`` set."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return (self.val_src, self.val_len) if split == "val" else (self.test_src, self.test_len)

    tokenizer = {"kind": "chars", "lowercase": True}  # serving reads "9 2 3" digit by digit
    fixed_reply_length = TARGET_LEN  # y = (t−1, x_t, N−t): three digits, no end token
    closed_input = True  # 1 to max_len digits: anything else is no counting input

    @property
    def about(self) -> str:
        return (f"Counting task (Tuan et al. 2018): send 1 to {self.max_src_len} digits x1 … xN, e.g. 9 2 3. A correct "
                "reply is three digits: for any position t, the number of digits before x_t, the digit x_t, and the "
                "number of digits after it. For 9 2 3 the correct replies are 0 9 2, 1 2 1 and 2 3 0.")

    # -- data -------------------------------------------------------------------------------------
    def _draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        lengths = rng.integers(self.cfg.min_len, self.cfg.max_len + 1, size=n)
        digits = rng.integers(0, 10, size=(n, self.max_src_len))
        valid = np.arange(self.max_src_len)[None, :] < lengths[:, None]
        src = np.where(valid, digits + self.digit0, self.specials.pad).astype(np.int64)
        return src, lengths.astype(np.int64)

    def _keys(self, src: np.ndarray, src_len: np.ndarray) -> np.ndarray:
        """A unique int64 per input: digits in base 10 plus N·10^10."""
        digits = np.where(src >= self.digit0, src - self.digit0, 0)
        powers = 10 ** np.arange(self.max_src_len, dtype=np.int64)
        return (digits * powers).sum(axis=1) + src_len * 10**10

    def _long_keys(self, src: np.ndarray, src_len: np.ndarray) -> np.ndarray:
        """Sorted unique keys of the inputs of length >= 4 (the ones kept apart between splits)."""
        return np.unique(self._keys(src, src_len)[src_len >= MIN_DISJOINT_LEN])

    def in_held_out(self, src: np.ndarray, src_len: np.ndarray) -> np.ndarray:
        """(B,) bool: a held-out (validation or test) input of length >= 4."""
        return (src_len >= MIN_DISJOINT_LEN) & np.isin(self._keys(src, src_len), self._held_out)

    def _draw_outside(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` inputs, redrawn where they hit the held-out keys so far."""
        src, src_len = self._draw(rng, n)
        bad = self.in_held_out(src, src_len)
        while bad.any():
            idx = np.nonzero(bad)[0]
            src[idx], src_len[idx] = self._draw(rng, len(idx))
            bad[idx] = self.in_held_out(src[idx], src_len[idx])
        return src, src_len

    def sample_inputs(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Training inputs (n, S), lengths (n,), redrawn where they hit the validation or test set."""
        return self._draw_outside(rng, n)

    def sample_targets(self, rng: np.random.Generator, src: np.ndarray, src_len: np.ndarray) -> np.ndarray:
        """One correct output per input, t uniform in 1..N: (n, 3) tokens (t−1, x_t, N−t)."""
        i = (rng.random(len(src_len)) * src_len).astype(np.int64)  # t − 1, uniform in 0..N−1
        x_t = src[np.arange(len(src)), i]
        y = np.stack([i + self.digit0, x_t, src_len - 1 - i + self.digit0], axis=1)
        return y.astype(np.int64)

    def sample_prompts(self, rng: np.random.Generator, n: int, *, with_targets: bool = False) -> PromptBatch:
        src, src_len = self.sample_inputs(rng, n)
        if not with_targets:
            return PromptBatch(src, src_len)
        tgt = self.sample_targets(rng, src, src_len)
        return PromptBatch(src, src_len, tgt, np.full(n, TARGET_LEN, dtype=np.int64))

    # -- reward -----------------------------------------------------------------------------------
    def is_correct(self, src: np.ndarray, src_len: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """(B,) bool: tokens start with 3 digits (t−1, x_t, N−t) for some 1 <= t <= N."""
        B = len(src_len)
        if tokens.shape[1] < TARGET_LEN:
            return np.zeros(B, dtype=bool)
        y = tokens[:, :TARGET_LEN] - self.digit0
        digits_ok = ((y >= 0) & (y <= 9)).all(axis=1)
        i = np.clip(y[:, 0], 0, self.max_src_len - 1)
        pos_ok = y[:, 0] < src_len
        x_ok = src[np.arange(B), i] - self.digit0 == y[:, 1]
        n_ok = y[:, 2] == src_len - 1 - y[:, 0]
        return digits_ok & pos_ok & x_ok & n_ok

    def score(self, src: np.ndarray, src_len: np.ndarray, tokens: np.ndarray, token_mask: np.ndarray):
        """Sequence reward (B,) float32: 1 if correct, else 0. Exactly 3 tokens (no EOS before)."""
        ok = self.is_correct(src, src_len, tokens) & (token_mask[:, :TARGET_LEN].sum(1) == TARGET_LEN)
        if tokens.shape[1] > TARGET_LEN:  # longer outputs are wrong
            ok &= token_mask[:, TARGET_LEN:].sum(1) == 0
        return ok.astype(np.float32)

    def rewards(self, src, src_len, tokens, token_mask, key=None) -> tuple[np.ndarray, np.ndarray]:
        """Per-token rewards (B, T) (terminal) and the sequence score (B,)."""
        s = self.score(src, src_len, tokens, token_mask)
        return terminal_rewards(s, token_mask), s

    # -- evaluation: decodes (greedy, sampled) on the rollout workers, figures here (rayseq.tasks.evaluation) ------
    eval_batch = 1024

    def evaluate(self, generator, device="cpu", *, split: str = "val") -> tuple[dict, dict]:
        """Scalars for metrics (``val/...`` or ``test/...``) and details (y1 distributions per N) for summaries.
        The sampled precision draws chunk c of :attr:`eval_batch` inputs from a generator seeded with
        ``chunk_seed(split seed, c)`` (:mod:`rayseq.tasks.evaluation`: the same every evaluation)."""
        return evaluate_here(self, generator, device, split=split)

    def eval_decodes(self, split: str) -> list[EvalDecode]:
        """Greedy and sampled replies (:data:`TARGET_LEN` tokens) to the split's inputs, in chunks of
        :attr:`eval_batch`."""
        n = len(self.split(check_split(split))[1])
        seed = self.cfg.val_seed if split == "val" else self.cfg.test_seed
        return [*chunked(split, "greedy", n, self.eval_batch, TARGET_LEN),
                *chunked(split, "sampled", n, self.eval_batch, TARGET_LEN, seed)]

    def eval_inputs(self, decode: EvalDecode) -> tuple[np.ndarray, np.ndarray]:
        inputs, lengths = self.split(decode.split)
        return inputs[decode.start : decode.stop], lengths[decode.start : decode.stop]

    @torch.no_grad()
    def eval_figures(self, split: str, decoded: list, generator, device="cpu") -> tuple[dict, dict]:
        """precision (greedy), precision_sampled and reward (sampled), and the first digit's distribution per N
        from the policy's first-step probabilities (computed here, in chunks of :attr:`eval_batch`)."""
        inputs, lengths = self.split(split)
        replies = joined(self.eval_decodes(split), decoded)
        (g_tokens, g_mask), (s_tokens, s_mask) = replies["greedy"], replies["sampled"]
        correct, correct_s, reward, digit_probs, reward_terms = [], [], [], [], {}
        for a in range(0, len(lengths), self.eval_batch):
            b = slice(a, a + self.eval_batch)
            np_src, np_len = inputs[b], lengths[b]
            correct.append(self.score(np_src, np_len, g_tokens[b], g_mask[b]))
            correct_s.append(self.score(np_src, np_len, s_tokens[b], s_mask[b]))
            score, terms = sampled_reward(self, np_src, np_len, s_tokens[b], s_mask[b])  # the configured reward
            reward.append(score)
            for k, v in terms.items():
                reward_terms.setdefault(k, []).append(v)
            src, sl = torch.from_numpy(np_src).to(device), torch.from_numpy(np_len).to(device)
            p = generator.first_step_logprobs(src, sl).exp()[:, self.digit0 : self.digit0 + 10]
            digit_probs.append((p / p.sum(-1, keepdim=True)).cpu().numpy())
        probs = np.concatenate(digit_probs)  # (n_test, 10)
        metrics = {
            "precision": float(np.concatenate(correct).mean()),
            "precision_sampled": float(np.concatenate(correct_s).mean()),
            "reward": float(np.concatenate(reward).mean()),
            **{k: float(np.concatenate(v).mean()) for k, v in reward_terms.items()},
        }
        details = {"y1_dist": {}, "y1_truth": {}}
        tvs = []
        for n in range(self.cfg.min_len, self.cfg.max_len + 1):
            sel = lengths == n
            if not sel.any():
                continue
            mean_dist = probs[sel].mean(0)
            truth = np.where(np.arange(10) < n, 1.0 / n, 0.0)
            tv = 0.5 * float(np.abs(mean_dist - truth).sum())
            tvs.append(tv)
            metrics[f"y1_tv_n{n}"] = tv
            metrics[f"y1_var_n{n}"] = float(probs[sel].var(axis=1).mean())
            details["y1_dist"][n] = mean_dist.round(6).tolist()
            details["y1_truth"][n] = truth.tolist()
        metrics["y1_tv"] = float(np.mean(tvs))
        return {f"{split}/{k}": v for k, v in metrics.items()}, details

    @classmethod
    def metric_names(cls, cfg, split: str) -> list[str]:
        """The ``<split>/*`` metrics :meth:`evaluate` reports for the task config ``cfg`` (Tune checks a search's
        metric against them before any trial starts)."""
        ns = range(cfg.min_len, cfg.max_len + 1)
        names = ["precision", "precision_sampled", "reward", "y1_tv", *[f"y1_tv_n{n}" for n in ns],
                 *[f"y1_var_n{n}" for n in ns]]
        return [f"{split}/{k}" for k in names]
