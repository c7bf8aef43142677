"""Open-domain chit-chat (Tuan et al. 2018, Sec. 5.2, Table 2 and Supplement Table 2).

Data: a dataset prepared by ``python -m rayseq.data prepare SOURCE --out DIR`` (``task.data_dir``;
default corpus the ``chitchat-dataset`` package, see :mod:`rayseq.data.dialogue`). Replies to the same
input form its references (one-to-many).

Reward (RL stage): sentence BLEU-2 of the sampled reply against ALL references of its input, the
paper's reward, vectorised (:func:`rayseq.rewards.bleu.sentence_bleu_padded`, equal to sacrebleu's
``sentence_score`` with effective order), given at the reply's last token; computed on ScorerActors.

Evaluation of greedy replies on the first ``val_size`` input groups of the prepared ``valid`` split (``val/*``,
every ``train.eval_every`` iterations: what selects, e.g. ERPO interpolation's annealing and Tune) and on the first
``test_size`` groups of the ``test`` split (``test/*``, once at the end: what is reported); ``prepare`` keeps
both free of training inputs. The same metrics on each:
- ``bleu2``: corpus BLEU-2 (sacrebleu) against every reference of each input, in [0, 100];
- ``sentence_bleu2``: mean sentence BLEU-2 (the training reward), in [0, 1];
- ``distinct1``, ``distinct2``: distinct uni/bigrams over all replies / their count (Li et al. 2016);
- ``self_bleu2``: mean BLEU-2 of a reply against the other replies (Zhu et al. 2018; lower = more
  diverse), on up to 500 replies;
- ``reply_len``: mean reply length in tokens (EOS excluded);
- replies to the inputs of the paper's Supplement Table 2 (in the summary's ``details``).
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from rayseq.data.dataset import DialogueData, encode_text
from rayseq.data.text import detokenize
from rayseq.rewards import corpus_bleu, sentence_bleu_padded, terminal_rewards
from rayseq.tasks.base import Task, task_spec
from rayseq.types import PromptBatch

PAPER_PROMPTS = (
    "what can i do for you .", "go , go , go !", "i said ...", "it ’s wonderful .", "come here",
    "get him down .", "change your mind .", "let him go .",
)
SELF_BLEU_REPLIES = 500


class ChitchatTask(Task):
    name = "chitchat"
    params = ("data_dir", "source", "prepare", "test_size", "val_size")
    has_reward, has_references = True, True  # BLEU-2 against each input's reference replies
    scored_remotely = True  # against all references of an input: worth the scorer actors

    def __init__(self, cfg):
        self.cfg = cfg
        if not cfg.data_dir:
            raise ValueError("task.data_dir: set it to a prepared dataset "
                             "(python -m rayseq.data prepare chitchat --out data/chitchat)")
        if not (Path(cfg.data_dir) / "manifest.json").is_file():
            raise FileNotFoundError(
                f"task.data_dir={cfg.data_dir}: no prepared dataset there; run "
                f"`python -m rayseq.data prepare {cfg.source} --out {cfg.data_dir}` (or set task.prepare=true)"
            )
        self.data = DialogueData.load(cfg.data_dir)
        self.vocab = self.data.vocab
        self.specials = self.vocab.specials
        self.max_src_len = self.data.max_src_len
        self.max_tgt_len = self.data.max_tgt_len + 1  # + EOS
        self.train = self.data.splits["train"]
        self.train_refs = self.train.references()  # per training group: its replies (the BLEU references)
        self._held_out = {"val": ("valid", cfg.val_size), "test": ("test", cfg.test_size)}

    @cached_property
    def _splits(self) -> dict:
        """split -> (inputs (n, S), lengths (n,), references of each input): the first n groups of the split."""
        out = {}
        for split, (name, size) in self._held_out.items():
            part = self.data.splits[name]
            n = min(size, part.num_groups)
            src, src_len = part.group_inputs()
            out[split] = (src[:n], src_len[:n], part.references()[:n])
        return out

    def split(self, split: str) -> tuple[np.ndarray, np.ndarray, list]:
        """``val`` or ``test``: inputs (n, S), lengths (n,) and each input's references."""
        if split not in self._held_out:
            raise ValueError(f"split must be one of {tuple(self._held_out)}, got {split!r}")
        src, src_len, refs = self._splits[split]
        if len(src) == 0:
            raise ValueError(f"{self.cfg.data_dir}: the {self._held_out[split][0]} split is empty (prepared with "
                             "valid_frac / test_frac 0, or every input there also occurs in train, see manifest.json)")
        return src, src_len, refs

    def spec(self) -> dict:
        """What serving needs to rebuild inputs and outputs (stored in checkpoints)."""
        return task_spec(self, self.data.tokenizer)

    # -- data -------------------------------------------------------------------------------------
    def sample_prompts(self, rng: np.random.Generator, n: int, *, with_targets: bool = False) -> PromptBatch:
        """``n`` training pairs drawn uniformly; ``key`` = the input's reference group; targets end in EOS."""
        idx = rng.integers(0, len(self.train), size=n)
        s = self.train
        batch = PromptBatch(s.src[idx], s.src_len[idx], key=s.group[idx])
        if with_targets:
            tgt = np.zeros((n, self.max_tgt_len), dtype=np.int64)
            tgt[:, : s.tgt.shape[1]] = s.tgt[idx]
            tgt[np.arange(n), s.tgt_len[idx]] = self.specials.eos
            batch.tgt, batch.tgt_len = tgt, s.tgt_len[idx] + 1
        return batch

    # -- reward -----------------------------------------------------------------------------------
    def references(self, key) -> list[list[np.ndarray]]:
        """The reference replies (id arrays, no EOS) of each input group in ``key``: the reward's references."""
        return [self.train_refs[int(k)] for k in key]

    def reply_lengths(self, tokens: np.ndarray, token_mask: np.ndarray) -> np.ndarray:
        """(B,) reply length without the EOS."""
        length = (token_mask > 0).sum(1)
        ended = (length > 0) & (tokens[np.arange(len(tokens)), np.maximum(length - 1, 0)] == self.specials.eos)
        return (length - ended).astype(np.int64)

    def rewards(self, src, src_len, tokens, token_mask, key=None) -> tuple[np.ndarray, np.ndarray]:
        """BLEU-2 of each reply against all references of its input group (train split)."""
        if key is None:
            raise ValueError("chitchat rewards need PromptBatch.key (the input's reference group)")
        refs = self.references(key)
        score = sentence_bleu_padded(tokens, self.reply_lengths(tokens, token_mask), refs, max_order=2)
        score = score.astype(np.float32)
        return terminal_rewards(score, token_mask), score

    # -- evaluation -------------------------------------------------------------------------------
    @torch.no_grad()
    def greedy_replies(self, generator, src: np.ndarray, src_len: np.ndarray, device="cpu",
                       batch_size: int = 512) -> list[np.ndarray]:
        out = []
        for a in range(0, len(src), batch_size):
            s = generator.sample(torch.from_numpy(src[a : a + batch_size]).to(device),
                                 torch.from_numpy(src_len[a : a + batch_size]).to(device), self.max_tgt_len,
                                 greedy=True)
            toks, mask = s.tokens.cpu().numpy(), s.token_mask.cpu().numpy()
            lens = self.reply_lengths(toks, mask)
            out.extend(toks[i, : lens[i]] for i in range(len(toks)))
        return out

    def reply_text(self, ids: np.ndarray) -> str:
        return detokenize(self.vocab.decode(ids), self.data.tokenizer.get("kind", "words"))

    @torch.no_grad()
    def validation_reward(self, generator, device="cpu") -> float:
        """Mean sentence BLEU-2 (the reward) of greedy replies to the validation inputs against their
        references (``val/sentence_bleu2``): the validation-set reward the interpolation algorithm anneals on."""
        src, src_len, refs = self.split("val")
        was_training = generator.training
        generator.eval()
        replies = self.greedy_replies(generator, src, src_len, device)
        generator.train(was_training)
        padded, lens = _pad(replies)
        return float(sentence_bleu_padded(padded, lens, refs, max_order=2).mean())

    @classmethod
    def metric_names(cls, cfg, split: str) -> list[str]:
        return [f"{split}/{k}" for k in ("bleu2", "sentence_bleu2", "distinct1", "distinct2", "self_bleu2",
                                          "reply_len")]

    @torch.no_grad()
    def evaluate(self, generator, device="cpu", *, split: str = "val") -> tuple[dict, dict]:
        """``<split>/*`` metrics (module docstring); details (paper prompts' replies, samples) on test only."""
        src, src_len, refs = self.split(split)
        was_training = generator.training
        generator.eval()
        replies = self.greedy_replies(generator, src, src_len, device)
        if split != "test":
            generator.train(was_training)
            return self._metrics(split, replies, refs), {}
        prompts = [encode_text(p, self.vocab, self.data.tokenizer, self.max_src_len) for p in PAPER_PROMPTS]
        p_src = np.zeros((len(prompts), self.max_src_len), dtype=np.int64)
        for i, p in enumerate(prompts):
            p_src[i, : len(p)] = p
        p_len = np.array([max(len(p), 1) for p in prompts], dtype=np.int64)
        paper = self.greedy_replies(generator, p_src, p_len, device)
        generator.train(was_training)
        details = {
            "paper_prompts": [{"input": p, "reply": self.reply_text(r)} for p, r in zip(PAPER_PROMPTS, paper)],
            "test_samples": [
                {"input": self.reply_text(src[i, : src_len[i]]),
                 "reply": self.reply_text(replies[i]),
                 "references": [self.reply_text(r) for r in refs[i][:3]]}
                for i in range(min(8, len(replies)))
            ],
        }
        return self._metrics(split, replies, refs), details

    @staticmethod
    def _metrics(split: str, replies: list[np.ndarray], refs: list) -> dict:
        padded, lens = _pad(replies)
        metrics = {
            "bleu2": 100.0 * corpus_bleu(replies, refs, max_order=2),
            "sentence_bleu2": float(sentence_bleu_padded(padded, lens, refs, max_order=2).mean()),
            "distinct1": distinct_n(replies, 1),
            "distinct2": distinct_n(replies, 2),
            "self_bleu2": self_bleu(replies[:SELF_BLEU_REPLIES]),
            "reply_len": float(lens.mean()) if len(lens) else 0.0,
        }
        return {f"{split}/{k}": v for k, v in metrics.items()}


def ensure_prepared(cfg) -> bool:
    """``task.prepare``: prepare ``task.source`` into ``task.data_dir`` if it holds no dataset yet (the
    driver calls this once, before any actor loads the data). Returns True if it prepared."""
    if not (cfg.prepare and cfg.data_dir) or (Path(cfg.data_dir) / "manifest.json").is_file():
        return False
    from rayseq.data.dialogue import PrepareOptions, prepare

    prepare(cfg.source, cfg.data_dir, PrepareOptions(quiet=True))
    return True


def _pad(replies: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Replies -> ((n, longest) int64 right-padded with 0, (n,) lengths)."""
    lens = np.array([len(r) for r in replies], dtype=np.int64)
    padded = np.zeros((len(replies), max(int(lens.max(initial=0)), 1)), dtype=np.int64)
    for i, r in enumerate(replies):
        padded[i, : len(r)] = r
    return padded, lens


def distinct_n(replies: list[np.ndarray], n: int) -> float:
    """Distinct n-grams over all replies / total n-grams (0 when there are none)."""
    grams = [tuple(r[i : i + n].tolist()) for r in replies for i in range(len(r) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def self_bleu(replies: list[np.ndarray]) -> float:
    """Mean sentence BLEU-2 of each reply against all the others (needs >= 2 replies)."""
    if len(replies) < 2:
        return 0.0
    padded, lens = _pad(replies)
    refs = [[r for j, r in enumerate(replies) if j != i] for i in range(len(replies))]
    return float(sentence_bleu_padded(padded, lens, refs, max_order=2).mean())
