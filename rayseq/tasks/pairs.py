"""Conditional generation on text pairs: a reply to each prompt, rewarded against the prompt's references.

Data: a dataset prepared by ``python -m rayseq.data prepare SOURCE --out DIR`` (``task.data``), e.g. your own
``jsonl:FILE`` of ``{"prompt", "reply"}`` rows (:mod:`rayseq.data.preparation`). Rows with the same prompt are its
references (one-to-many); ``task.prepare=true`` prepares ``task.source`` into ``task.data`` first when it holds no
dataset. The ``chitchat`` task (:mod:`rayseq.tasks.chitchat`) is this task on the chit-chat corpus. With
``task.hf_tokenizer`` (set from ``model.path`` by ``model.arch=hf``) a Hugging Face tokenizer's ids replace the
prepared vocabulary: every row's text is re-tokenised (:func:`rayseq.data.hf_text.retokenize`), so BLEU-2 counts
its subword tokens, and replies are decoded by it. The ids are kept beside the dataset
(``task.data/retokenized/``, :func:`rayseq.data.hf_text.retokenized`): the driver encodes, the actors read them.
Inputs keep their last tokens where the model's positions (its config.json) would not hold them beside the longest
reply (:func:`rayseq.data.hf_text.fit_context`), as every input is truncated.

Reward: the task's own is sentence BLEU-2 of the sampled reply against ALL references of its prompt, the reward
of Tuan et al. (2018, Sec. 5.2) for their chatbot, vectorised (:func:`rayseq.rewards.bleu.sentence_bleu_padded`,
equal to sacrebleu's ``sentence_score`` with effective order) and given at the reply's last token; computed on
ScorerActors. ``reward.fn`` / ``reward.terms`` replace it (:mod:`rayseq.rewards.reward`).

With a subword vocabulary (``task.tokenizer=bpe``: the dataset prepared with ``--tokenizer bpe``,
:mod:`rayseq.data.subword`) the model reads and writes BPE pieces and never emits ``<unk>`` (``banned_ids``: no
training reply has it), while BLEU-2 (reward and evaluation), distinct-n, Self-BLEU and ``reply_len`` count the
words the pieces spell, as on a word-level dataset.

Inputs have keys (``PromptBatch.key``) that name their row across the splits: training rows are 0..N−1, the
validation inputs (one per input group) follow, then the test inputs, so the reward scores a reply to any input:
:meth:`PairsTask.references` gives the replies of the key's input group, :meth:`PairsTask.prompt_values` its prompt
as written and :meth:`PairsTask.column_values` the dataset's other columns of its row (what a reward function on
TRL's keyword protocol receives; a held-out input's are its group's first row's).

Prompt-only data (rows without a reply, ``python -m rayseq.data prepare``) trains with RL only: MLE samples rows
with a reply, and a dataset with none refuses ``train.pretrain_iters`` > 0 when the run is configured
(:meth:`PairsTask.check_config`), naming the missing column; inputs without a reference reply have no BLEU (the
task's own reward is then an error: configure ``reward.fn`` / ``reward.terms``), and the BLEU metrics below are
over the inputs that have references (NaN when none has).

Evaluation on the first ``val_size`` prompts (input groups) of the prepared ``valid`` split (``val/*``, every
``train.eval_every`` iterations: what selects, e.g. ERPO interpolation's annealing and Tune) and on the first
``test_size`` of the ``test`` split (``test/*``, once at the end: what is reported); ``prepare`` keeps both free of
training inputs. The same metrics on each, of greedy replies unless said:
- ``bleu2``: corpus BLEU-2 (sacrebleu) against every reference of each input, in [0, 100];
- ``sentence_bleu2``: mean sentence BLEU-2 (the task's own reward), in [0, 1];
- ``reward``: mean reward (the configured one, ``reward.*``) of temperature-1 SAMPLED replies, drawn with
  ``val_seed`` / ``test_seed`` so that every evaluation draws the same numbers;
- ``distinct1``, ``distinct2``: distinct uni/bigrams over all replies / their count (Li et al. 2016);
- ``self_bleu2``: mean BLEU-2 of a reply against the other replies (Zhu et al. 2018; lower = more
  diverse), on up to 500 replies;
- ``reply_len``: mean reply length in words (EOS excluded);
- ``distinct_replies``: distinct greedy replies / inputs (1: a different reply to every input; a model that answers
  everything with two templates scores 2/n);
- ``unk_replies``: the fraction of greedy replies with an ``<unk>`` (shown as ``…``): 0 for a subword model;
- in the summary's ``details`` (test only): sample replies with their references, and replies to the task's
  ``example_prompts`` (chitchat: the inputs of the paper's Supplement Table 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from rayseq.config import blame
from rayseq.config.paths import LOCAL_PATH
from rayseq.data.dataset import DialogueData, encode_text
from rayseq.data.hf_files import context_length
from rayseq.data.hf_text import HFVocab, retokenized
from rayseq.data.preparation import DataError, PrepareOptions
from rayseq.data.subword import BPEVocab, WordIds
from rayseq.data.text import decode_ids, detokenize
from rayseq.rewards import corpus_bleu, sentence_bleu_padded, terminal_rewards
from rayseq.tasks.base import HELD_OUT, SPLIT_FIELDS, Task, sampled_reward, task_spec
from rayseq.tasks.evaluation import EvalDecode, chunked, evaluate_here, joined
from rayseq.types import PromptBatch

SELF_BLEU_REPLIES = 500


class PairsTask(Task):
    name = "pairs"
    fields = {
        "data": (str | None, Field(
            None, description="Pairs: a dataset prepared by `python -m rayseq.data prepare SOURCE --out DIR` "
            "(chitchat: data/chitchat); the old name task.data_dir is read too.", json_schema_extra=LOCAL_PATH)),
        "source": (str | None, Field(
            None, description="Pairs: what task.prepare prepares into task.data, e.g. jsonl:pairs.jsonl (chitchat: "
            "chitchat, the chitchat-dataset corpus).")),
        "prepare": (bool, Field(
            False, description="Pairs: prepare task.source into task.data first if it holds no dataset.")),
        "tokenizer": (Literal["words", "bpe"] | None, Field(
            None, description="Pairs: the vocabulary task.prepare prepares with (words: the most frequent words, "
            "others <unk>; bpe: subword pieces learned on the training split, never <unk> in a reply), and the one "
            "task.data must have been prepared with; None = prepare's default (words) and whatever task.data holds.")),
        "prepare_vocab_size": (int | None, Field(
            None, ge=5, description="Pairs: vocabulary size (words or bpe pieces, the 4 specials included) "
            "task.prepare prepares with; None = prepare's default (4000).")),
        **SPLIT_FIELDS,
        "hf_tokenizer": (str | None, Field(
            None, description="Pairs: a local Hugging Face tokenizer directory whose tokens replace the prepared "
            "vocabulary (the dataset's text is re-tokenised with it); set from model.path when model.arch=hf.",
            json_schema_extra=LOCAL_PATH)),
    }
    has_reward, has_references = True, True  # BLEU-2 against each input's reference replies
    scored_remotely = True  # against all references of an input: worth the scorer actors
    example_prompts: tuple[str, ...] = ()  # replies to these are in the test details
    # what a chat server applies unless a request says otherwise: a small model's greedy reply loops ("i'm not sure.
    # i'm not sure."); no 3-gram twice and a mild CTRL penalty stop that, and sampling keeps the top 90% of the mass
    decoding = {"no_repeat_ngram_size": 3, "repetition_penalty": 1.2, "top_p": 0.9}
    about = ("A sequence-to-sequence model trained on prompt and reply pairs, then on a reward: send a prompt and it "
             "replies, without memory of earlier turns.")

    def __init__(self, cfg):
        self.cfg = cfg
        if not cfg.data:
            raise ValueError("task.data: set it to a prepared dataset (python -m rayseq.data prepare jsonl:FILE --out "
                             "DIR, then task.data=DIR; or task.source=jsonl:FILE task.prepare=true task.data=DIR)")
        if not (Path(cfg.data) / "manifest.json").is_file():
            source = cfg.source or "jsonl:FILE"
            raise blame("task.data", FileNotFoundError(
                f"task.data={cfg.data}: no prepared dataset there; run "
                f"`python -m rayseq.data prepare {source} --out {cfg.data}` (or set task.source and task.prepare=true)"
            ))
        self.data = DialogueData.load(cfg.data)
        kind = self.data.tokenizer.get("kind", "words")
        if cfg.tokenizer and cfg.tokenizer != kind:
            raise DataError(f"task.data={cfg.data} was prepared with the {kind} tokenizer, task.tokenizer="
                            f"{cfg.tokenizer}: prepare it with `python -m rayseq.data prepare {cfg.source or 'SOURCE'} "
                            f"--tokenizer {cfg.tokenizer} --out DIR` and set task.data=DIR")
        # words of a subword model's replies for BLEU, distinct-n and lengths (None: the tokens are words)
        self.words = WordIds(self.data.vocab) if isinstance(self.data.vocab, BPEVocab) else None
        self._word_refs: dict[int, list[np.ndarray]] = {}  # key -> its references as word ids (subword vocabulary)
        if self.words is not None:
            self.banned_ids = (self.data.vocab.specials.unk,)  # no training reply has <unk>: never emit it
        if cfg.hf_tokenizer:  # a Hugging Face tokenizer's tokens replace the prepared vocabulary (model.arch=hf)
            # a chat template's generation prompt ends a conversational prompt: no separator after it
            # inputs cut to fit beside a reply in the model's positions (its config.json; none: a tokenizer alone)
            self.data = retokenized(self.data, HFVocab(cfg.hf_tokenizer, separator=not self.data.conversational),
                                    cfg.data, context_length(cfg.hf_tokenizer), f"task.data={cfg.data}")
        self.vocab = self.data.vocab
        self.specials = self.vocab.specials
        self.max_src_len = self.data.max_src_len
        self.max_tgt_len = self.data.max_tgt_len + 1  # + EOS
        self.train = self.data.splits["train"]
        self.train_refs = self.train.references()  # per training group: its replies (the BLEU references)
        self._refs = [self.train_refs[g] for g in self.train.group.tolist()]  # per key: its input group's references
        self._key_rows = [("train", i) for i in range(len(self.train))]  # per key: (prepared split, row)
        self._reply_rows = np.flatnonzero(self.train.tgt_len > 0)  # the rows MLE samples
        self._held_out = {}  # split -> (inputs (n, S), lengths (n,), references of each input, keys (n,))
        for split, size in (("val", cfg.val_size), ("test", cfg.test_size)):
            part = self.data.splits[HELD_OUT[split]]
            n = min(size, part.num_groups)
            if n == 0:
                raise DataError(
                    f"task.data={cfg.data}: the {HELD_OUT[split]} split is empty, and training evaluates on it "
                    f"({'val/*' if split == 'val' else 'test/*'}); prepare the data with more prompts or a larger "
                    f"--{HELD_OUT[split]}-frac (see counts in {Path(cfg.data) / 'manifest.json'})")
            src, src_len = part.group_inputs()
            refs = part.references()[:n]
            keys = np.arange(len(self._refs), len(self._refs) + n, dtype=np.int64)
            self._refs += refs
            self._key_rows += [(HELD_OUT[split], int(r)) for r in part.group_rows()[:n]]
            self._held_out[split] = (src[:n], src_len[:n], refs, keys)

    def split(self, split: str) -> tuple[np.ndarray, np.ndarray, list]:
        """``val`` or ``test``: inputs (n, S), lengths (n,) and each input's references."""
        if split not in self._held_out:
            raise ValueError(f"split must be one of {tuple(self._held_out)}, got {split!r}")
        return self._held_out[split][:3]

    def spec(self) -> dict:
        """What serving needs to rebuild inputs and outputs (stored in checkpoints)."""
        return task_spec(self, self.data.tokenizer)

    @classmethod
    def check_config(cls, run_cfg) -> None:
        """Checks of a run on this task's prepared data (when ``task.data`` holds it): a prompt-only dataset has no
        reply to pretrain on (ValueError naming the missing column)."""
        if run_cfg.task.prepare and not run_cfg.task.source:
            raise ValueError("task.prepare=true: set task.source, what to prepare into task.data (e.g. "
                             "jsonl:pairs.jsonl)")
        manifest = Path(run_cfg.task.data or "") / "manifest.json"
        if not run_cfg.task.data or not manifest.is_file():
            return
        import json

        try:
            m = json.loads(manifest.read_text(encoding="utf-8"))
            counts = m["counts"]["train"]
        except (OSError, ValueError, KeyError, TypeError):
            return  # DialogueData.load says what is wrong with it
        if counts.get("prompt_only", 0) < counts.get("pairs", 0) or not counts.get("pairs"):
            return
        column = (m.get("options") or {}).get("reply_column") or "reply"
        if run_cfg.train.pretrain_iters > 0:
            raise ValueError(f"train.pretrain_iters={run_cfg.train.pretrain_iters}: task.data={run_cfg.task.data} has "
                             f"no {column!r} column (prompt-only rows, source {m.get('source')}), and MLE pretraining "
                             "learns replies; set train.pretrain_iters=0 (RL only, e.g. model.arch=hf) or prepare "
                             "data with replies (--reply-column)")
        if run_cfg.model.arch != "hf":
            raise ValueError(f"model.arch={run_cfg.model.arch}: task.data={run_cfg.task.data} has no {column!r} column "
                             "(prompt-only rows), and a model trained from scratch needs replies to learn from; use "
                             "a pretrained policy (model.arch=hf model.path=DIR) or data with replies")

    @classmethod
    def prepare_data(cls, cfg) -> bool:
        """``task.prepare``: prepare ``task.source`` into ``task.data`` if it holds no dataset yet (the driver calls
        this once, before any actor loads the data). Returns True if it prepared."""
        if not (cfg.prepare and cfg.data) or (Path(cfg.data) / "manifest.json").is_file():
            return False
        if not cfg.source:
            raise ValueError(f"task.prepare=true: set task.source (what to prepare into task.data={cfg.data}, e.g. "
                             "jsonl:pairs.jsonl)")
        from rayseq.data.preparation import prepare

        opts = {k: v for k, v in (("tokenizer", cfg.tokenizer), ("vocab_size", cfg.prepare_vocab_size)) if v}
        prepare(cfg.source, cfg.data, PrepareOptions(quiet=True, **opts))
        return True

    # -- data -------------------------------------------------------------------------------------
    def sample_prompts(self, rng: np.random.Generator, n: int, *, with_targets: bool = False) -> PromptBatch:
        """``n`` training rows drawn uniformly (with targets: rows with a reply): :meth:`prompt_rows` of them."""
        if with_targets:
            if not len(self._reply_rows):
                raise DataError(f"task.data={self.cfg.data}: no training row has a reply (a prompt-only dataset), and "
                                "this stage learns replies (MLE); set train.pretrain_iters=0 and an RL algorithm")
            idx = self._reply_rows[rng.integers(0, len(self._reply_rows), size=n)]
        else:
            idx = rng.integers(0, len(self.train), size=n)
        return self.prompt_rows(idx.astype(np.int64), with_targets=with_targets)

    def prompt_rows(self, key: np.ndarray, *, with_targets: bool = False) -> PromptBatch:
        """The training rows ``key`` (B,) as a keyed batch (``key`` = the row; targets end in EOS): what an actor
        rebuilds from the keys the driver sends (``PromptBatch.compact``)."""
        s, idx, n = self.train, np.asarray(key, dtype=np.int64), len(key)
        batch = PromptBatch(s.src[idx], s.src_len[idx], key=idx, keyed=True)
        if with_targets:
            tgt = np.full((n, self.max_tgt_len), self.specials.pad, dtype=np.int64)
            tgt[:, : s.tgt.shape[1]] = s.tgt[idx]
            tgt[np.arange(n), s.tgt_len[idx]] = self.specials.eos
            batch.tgt, batch.tgt_len = tgt, s.tgt_len[idx] + 1
        return batch

    # -- reward -----------------------------------------------------------------------------------
    def references(self, key) -> list[list[np.ndarray]]:
        """The reference replies (id arrays, no EOS) of each input in ``key`` (a training group, or a held-out
        input's key from :meth:`split_keys`): the reward's references."""
        return [self._refs[int(k)] for k in key]

    def prompt_values(self, key) -> list:
        """The prompt of each input in ``key`` as the dataset wrote it: text, or a list of {role, content}
        messages (a dataset prepared before rayseq kept them: its tokenised text, detokenised)."""
        out = []
        for k in key:
            split, row = self._key_rows[int(k)]
            part = self.data.splits[split]
            kind = self.data.tokenizer.get("kind", "words")
            out.append(part.prompts[row] if part.prompts is not None else
                       detokenize(part.src_text[row].split(), "words" if kind == "hf" else kind))
        return out

    def column_values(self, key) -> dict[str, list]:
        """The dataset's other columns (``python -m rayseq.data prepare`` keeps them) of each input in ``key``:
        name -> one value per key."""
        rows = [self._key_rows[int(k)] for k in key]
        return {c: [(self.data.splits[s].columns or {}).get(c, [None] * len(self.data.splits[s]))[r]
                    for s, r in rows] for c in self.data.column_names}

    def word_references(self, key) -> list[list[np.ndarray]]:
        """:meth:`references` as word ids (the same arrays for a word-level vocabulary)."""
        if self.words is None:
            return self.references(key)
        out = []
        for k in key:
            k = int(k)
            if k not in self._word_refs:
                self._word_refs[k] = [self.words(r) for r in self._refs[k]]
            out.append(self._word_refs[k])
        return out

    def bleu_inputs(self, tokens: np.ndarray, lengths: np.ndarray, key) -> tuple[np.ndarray, np.ndarray, list]:
        """Replies (B, T) with (B,) lengths (EOS excluded) and their inputs' keys -> what BLEU counts: the replies'
        words (B, W), their word counts (B,) and each input's references as words (module docstring)."""
        if self.words is None:
            return tokens, lengths, self.references(key)
        return (*self.words.padded(tokens, lengths), self.word_references(key))

    def split_keys(self, split: str) -> np.ndarray:
        """(n,) the keys of the ``val`` or ``test`` inputs of :meth:`split` (their references for the reward)."""
        return self._held_out[split][3]

    def reply_lengths(self, tokens: np.ndarray, token_mask: np.ndarray) -> np.ndarray:
        """(B,) reply length without the EOS."""
        length = (token_mask > 0).sum(1)
        ended = (length > 0) & (tokens[np.arange(len(tokens)), np.maximum(length - 1, 0)] == self.specials.eos)
        return (length - ended).astype(np.int64)

    def rewards(self, src, src_len, tokens, token_mask, key=None) -> tuple[np.ndarray, np.ndarray]:
        """BLEU-2 of each reply against all references of its input."""
        if key is None:
            raise ValueError(f"{self.name} rewards need PromptBatch.key (the input's row: its references)")
        refs = self.references(key)
        if any(len(r) == 0 for r in refs):
            raise DataError(f"task.data={self.cfg.data}: an input without a reference reply (a prompt-only row) has "
                            "no BLEU-2, the task's own reward; configure one: reward.fn=... or reward.terms=[...]")
        words, lengths, refs = self.bleu_inputs(tokens, self.reply_lengths(tokens, token_mask), key)
        score = sentence_bleu_padded(words, lengths, refs, max_order=2)
        score = score.astype(np.float32)
        return terminal_rewards(score, token_mask), score

    # -- evaluation -------------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, generator, src: np.ndarray, src_len: np.ndarray, device="cpu", *, seed: int | None = None,
               batch_size: int = 512) -> tuple[np.ndarray, np.ndarray]:
        """One reply per input, greedy (``seed`` None) or sampled at temperature 1 from a generator seeded with
        ``seed``: tokens (n, max_tgt_len) int64 and their token mask (n, max_tgt_len) float32."""
        gen = None if seed is None else torch.Generator(device=device).manual_seed(int(seed))
        tokens = np.zeros((len(src), self.max_tgt_len), dtype=np.int64)
        mask = np.zeros((len(src), self.max_tgt_len), dtype=np.float32)
        for a in range(0, len(src), batch_size):
            s = generator.sample(torch.from_numpy(src[a : a + batch_size]).to(device),
                                 torch.from_numpy(src_len[a : a + batch_size]).to(device), self.max_tgt_len,
                                 greedy=seed is None, generator=gen)
            t = s.tokens.shape[1]
            tokens[a : a + batch_size, :t] = s.tokens.cpu().numpy()
            mask[a : a + batch_size, :t] = s.token_mask.cpu().numpy()
        return tokens, mask

    def greedy_replies(self, generator, src: np.ndarray, src_len: np.ndarray, device="cpu") -> list[np.ndarray]:
        """The greedy reply (ids, no EOS) to each input."""
        return self._replies(*self.decode(generator, src, src_len, device))

    def _replies(self, tokens: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
        """Decoded replies (n, T) with their mask -> each reply's ids without the EOS."""
        lens = self.reply_lengths(tokens, mask)
        return [tokens[i, : lens[i]] for i in range(len(tokens))]

    def reply_text(self, ids: np.ndarray) -> str:
        return decode_ids(self.vocab, ids, self.data.tokenizer.get("kind", "words"))

    @torch.no_grad()
    def validation_reward(self, generator, device="cpu") -> float:
        """Mean reward of greedy replies to the validation inputs (with the task's own reward: sentence BLEU-2
        against their references, ``val/sentence_bleu2``): the validation-set reward the interpolation
        algorithm anneals on."""
        src, src_len, _ = self.split("val")
        was_training = generator.training
        generator.eval()
        tokens, mask = self.decode(generator, src, src_len, device)
        generator.train(was_training)
        return float(self.rewards(src, src_len, tokens, mask, key=self.split_keys("val"))[1].mean())

    @classmethod
    def metric_names(cls, cfg, split: str) -> list[str]:
        return [f"{split}/{k}" for k in ("bleu2", "sentence_bleu2", "reward", "distinct1", "distinct2", "self_bleu2",
                                          "reply_len", "distinct_replies", "unk_replies")]

    # -- evaluation: decodes on the rollout workers, figures here (rayseq.tasks.evaluation) -----------------------
    eval_batch = 512

    def evaluate(self, generator, device="cpu", *, split: str = "val") -> tuple[dict, dict]:
        """``<split>/*`` metrics (module docstring); details (sample replies, example prompts) on test only."""
        return evaluate_here(self, generator, device, split=split)

    def eval_decodes(self, split: str) -> list[EvalDecode]:
        """Greedy and sampled replies to the split's prompts, in chunks of :attr:`eval_batch` (sampled chunk c seeded
        with ``chunk_seed(split seed, c)``); on test, greedy replies to the task's example prompts too."""
        n = len(self.split(split)[1])
        seed = self.cfg.val_seed if split == "val" else self.cfg.test_seed
        out = [*chunked(split, "greedy", n, self.eval_batch, self.max_tgt_len),
               *chunked(split, "sampled", n, self.eval_batch, self.max_tgt_len, seed)]
        if split == "test" and self.example_prompts:
            out += chunked(split, "examples", len(self.example_prompts), self.eval_batch, self.max_tgt_len)
        return out

    def eval_inputs(self, decode: EvalDecode) -> tuple[np.ndarray, np.ndarray]:
        if decode.name == "examples":
            prompts = [encode_text(p, self.vocab, self.data.tokenizer, self.max_src_len)
                       for p in self.example_prompts[decode.start : decode.stop]]
            p_src = np.full((len(prompts), self.max_src_len), self.specials.pad, dtype=np.int64)
            for i, p in enumerate(prompts):
                p_src[i, : len(p)] = p
            return p_src, np.array([max(len(p), 1) for p in prompts], dtype=np.int64)
        src, src_len, _ = self.split(decode.split)
        return src[decode.start : decode.stop], src_len[decode.start : decode.stop]

    def eval_figures(self, split: str, decoded: list, generator=None, device="cpu") -> tuple[dict, dict]:
        """The metrics of the decoded replies (no likelihood: the generator is not read)."""
        src, src_len, _ = self.split(split)
        replies_of = joined(self.eval_decodes(split), decoded)
        replies = self._replies(*replies_of["greedy"])
        replies_w, refs = replies, self._held_out[split][2]
        if self.words is not None:
            replies_w, refs = [self.words(r) for r in replies], self.word_references(self.split_keys(split))
        sampled, sampled_mask = replies_of["sampled"]
        reward, terms = sampled_reward(self, src, src_len, sampled, sampled_mask, key=self.split_keys(split))
        metrics = {**self._metrics(split, replies_w, refs), f"{split}/reward": float(np.mean(reward)),
                   **{f"{split}/{k}": float(np.mean(v)) for k, v in terms.items()},
                   f"{split}/distinct_replies": len({r.tobytes() for r in replies}) / max(len(replies), 1),
                   f"{split}/unk_replies": float(np.mean([self.specials.unk in r for r in replies]))}
        if split != "test":
            return metrics, {}
        details = {
            "test_samples": [
                {"input": self.reply_text(src[i, : src_len[i]]),
                 "reply": self.reply_text(replies[i]),
                 "references": [self.reply_text(r) for r in self._held_out[split][2][i][:3]]}
                for i in range(min(8, len(replies)))
            ],
        }
        if "examples" in replies_of:
            answers = self._replies(*replies_of["examples"])
            details["paper_prompts"] = [{"input": p, "reply": self.reply_text(r)}
                                        for p, r in zip(self.example_prompts, answers)]
        return metrics, details

    @staticmethod
    def _metrics(split: str, replies: list[np.ndarray], refs: list) -> dict:
        padded, lens = _pad(replies)
        judged = [i for i, r in enumerate(refs) if len(r)]  # BLEU needs references (prompt-only inputs have none)
        if judged:
            bleu2 = 100.0 * corpus_bleu([replies[i] for i in judged], [refs[i] for i in judged], max_order=2)
            sentence = float(sentence_bleu_padded(padded[judged], lens[judged], [refs[i] for i in judged],
                                                  max_order=2).mean())
        else:
            bleu2 = sentence = float("nan")
        metrics = {
            "bleu2": bleu2,
            "sentence_bleu2": sentence,
            "distinct1": distinct_n(replies, 1),
            "distinct2": distinct_n(replies, 2),
            "self_bleu2": self_bleu(replies[:SELF_BLEU_REPLIES]),
            "reply_len": float(lens.mean()) if len(lens) else 0.0,
        }
        return {f"{split}/{k}": v for k, v in metrics.items()}


def ensure_prepared(cfg) -> bool:
    """``task.prepare`` of a pairs-like task config (:meth:`PairsTask.prepare_data`)."""
    return PairsTask.prepare_data(cfg)


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
