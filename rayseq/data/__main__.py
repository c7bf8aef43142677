"""Prepare dialogue corpora for the chit-chat chatbot: Parquet shards, vocabulary, split manifest; and tiny local
Hugging Face models to try model.arch=hf with.

Run book (times on the 2-core project machine):

    # the default corpus (pip package chitchat-dataset, a dependency): 7,168 conversations, ~6 s
    python -m rayseq.data prepare chitchat --out data/chitchat
    # the same with a subword (BPE) vocabulary of 4,000 pieces learned on its training split: no reply needs <unk>
    # (what tune_configs/chitchat*.yaml train on)
    python -m rayseq.data prepare chitchat --out data/chitchat-bpe --tokenizer bpe --vocab-size 4000
    # ChatterBot's YAML corpus (pip install -e ".[chatterbot]"), ~2 s
    python -m rayseq.data prepare chatterbot --out data/chatterbot --language english
    # OPUS OpenSubtitles monolingual text (one utterance a line; .gz is fine). Without blank lines the
    # file is one conversation: cut it into blocks so that it can be split
    python -m rayseq.data prepare opensubtitles:en.txt.gz --out data/os --max-conv-turns 50
    # Cornell Movie-Dialogs (the folder holding movie_lines.txt and movie_conversations.txt)
    python -m rayseq.data prepare cornell:cornell_movie_dialogs_corpus --out data/cornell
    # your own pairs: {"prompt": ..., "reply": ..., "conv_id": ...} a line ("input" works for "prompt"), or
    # prompt<TAB>reply[<TAB>conv_id]; rows with the same prompt are its references (train with task.name=pairs)
    python -m rayseq.data prepare jsonl:pairs.jsonl --out data/mine
    python -m rayseq.data prepare tsv:pairs.tsv --out data/mine --overwrite
    # data as TRL users have it: parquet, csv or a datasets.save_to_disk folder; "completion" is a reply; rows
    # without a reply are prompt-only (RL with model.arch=hf); prompts may be {role, content} message lists; every
    # other column is kept and reaches reward functions (TRL's keyword protocol)
    python -m rayseq.data prepare parquet:train.parquet --out data/math --max-src-len 200
    python -m rayseq.data prepare hf:my_dataset --out data/math --prompt-column question --reply-column answer
    # longer context: the previous 2 utterances, the last 40 tokens of them
    python -m rayseq.data prepare chitchat --out data/chitchat-k2 --context-turns 2 --max-src-len 40
    # data for a Hugging Face model: replies longer than half its positions (in its tokens) dropped
    python -m rayseq.data prepare chitchat --out data/chitchat-gpt2 --fit-model models/my-gpt2

    # a tiny GPT-2 (random weights, 128 positions) with a BPE tokenizer trained on a prepared dataset's training
    # split, and a tiny sequence classifier with two labels: model.arch=hf and reward.fn=hf_classifier offline, ~5 s
    python -m rayseq.data tiny-model data/chitchat --out models/my-gpt2
    python -m rayseq.data tiny-model data/chitchat --out models/my-sentiment --labels NEGATIVE,POSITIVE

The output (vocab.json, manifest.json, {train,valid,test}/part-00000.parquet) is read back with
``rayseq.data.DialogueData.load(DIR)``; manifest.json has the counts, drops and <unk> rate. valid and
test hold no training input: their pairs whose input also occurs in train are dropped (the output says
how many). Rows without a conversation id are grouped by prompt, so a prompt's replies stay in one split; a
warning says when valid or test is empty (training needs both: more prompts, or larger --valid-frac/--test-frac).
A dataset of format v1 (older rayseq) must be prepared again with --overwrite. Bad input exits with status 2 and
``error: FILE:LINE: ...``; nothing is left behind on failure.
"""

from __future__ import annotations

import argparse
import sys
import time

from rayseq.data.preparation import SOURCES, DataError, PrepareOptions, prepare


def _parser() -> argparse.ArgumentParser:
    d = PrepareOptions()
    p = argparse.ArgumentParser(prog="python -m rayseq.data", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("prepare", help="corpus -> Parquet shards + vocab.json + manifest.json")
    q.add_argument("source", metavar="SOURCE", help=f"one of: {', '.join(SOURCES)}")
    q.add_argument("--out", required=True, metavar="DIR", help="output directory (created atomically)")
    q.add_argument("--context-turns", type=int, default=d.context_turns, help="previous utterances in the input")
    q.add_argument("--language", default=d.language, help="chatterbot corpus language")
    q.add_argument(
        "--max-conv-turns",
        type=int,
        default=d.max_conv_turns,
        help="cut conversations into blocks of this many turns (0: never)",
    )
    q.add_argument("--max-src-len", type=int, default=d.max_src_len, help="input tokens kept (the last ones)")
    q.add_argument("--max-tgt-len", type=int, default=d.max_tgt_len, help="longer replies are dropped")
    q.add_argument("--truncate-replies", action="store_true", help="truncate long replies instead of dropping")
    q.add_argument("--tokenizer", default=d.tokenizer, help="words (a word vocabulary) or bpe (subword pieces)")
    q.add_argument("--vocab-size", type=int, default=d.vocab_size, help="words or bpe pieces, including <pad> <bos> "
                   "<eos> <unk>")
    q.add_argument("--min-count", type=int, default=d.min_count, help="train occurrences to enter the vocabulary")
    q.add_argument("--seed", type=int, default=d.seed, help="seed of the conversation-level split")
    q.add_argument("--valid-frac", type=float, default=d.valid_frac, help="fraction of conversations in valid")
    q.add_argument("--test-frac", type=float, default=d.test_frac, help="fraction of conversations in test")
    q.add_argument("--shard-size", type=int, default=d.shard_size, help="rows per Parquet file")
    q.add_argument("--prompt-column", default=None, metavar="NAME",
                   help="the prompt column of jsonl/parquet/csv/hf rows (default: prompt, or input)")
    q.add_argument("--reply-column", default=None, metavar="NAME",
                   help="the reply column (default: reply, or completion); rows without one are prompt-only")
    q.add_argument("--fit-model", default=None, metavar="DIR",
                   help="a Hugging Face model folder the data is for: replies longer than half its positions (in its "
                        "tokens) are dropped, so that a run with model.path=DIR takes the data")
    q.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    q.add_argument("--quiet", action="store_true", help="no progress bars")
    t = sub.add_parser("tiny-model", help="a tiny Hugging Face GPT-2 (or, with --labels, a sequence classifier) with a "
                                          "tokenizer trained on a prepared dataset")
    t.add_argument("data", metavar="DATA", help="a prepared dataset (python -m rayseq.data prepare ... --out DATA)")
    t.add_argument("--out", required=True, metavar="DIR", help="output folder, as save_pretrained writes it")
    t.add_argument("--labels", default=None, metavar="A,B",
                   help="a sequence classifier with these classes (reward.fn=hf_classifier) instead of a causal LM")
    t.add_argument("--vocab-size", type=int, default=400, help="tokenizer pieces, <pad> <bos> <eos> <unk> included")
    t.add_argument("--positions", type=int, default=128, help="the longest sequence the model reads")
    t.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    t.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    return p


def tiny_model(args: dict) -> str:
    """``tiny-model``: the model folder written (:mod:`rayseq.models.tiny_hf`), described in one line."""
    from pathlib import Path

    from transformers.utils import logging as hf_logging

    from rayseq.data.dataset import DialogueData
    from rayseq.data.preparation import _check_out, write_atomically
    from rayseq.models.tiny_hf import make_tiny_classifier, make_tiny_lm, train_tokenizer

    labels = [x.strip() for x in args["labels"].split(",")] if args["labels"] else None
    if labels is not None and (len(labels) < 2 or not all(labels) or len(set(labels)) != len(labels)):
        raise DataError(f"--labels {args['labels']}: two or more different class names, comma-separated")
    out = Path(args["out"]).expanduser()
    _check_out(out, args["overwrite"])  # before the work
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar for a 0.1 M-parameter model
    split = DialogueData.load(args["data"]).splits["train"]
    texts = []  # prompts and replies as written (a conversation's messages' contents), else as prepared
    for prompt, src in zip(split.prompts or [None] * len(split), split.src_text):
        texts += [m["content"] for m in prompt] if isinstance(prompt, list) else [prompt or src]
    texts += [r for r in split.replies or split.tgt_text if r]

    def write(tmp: Path) -> None:
        if labels is None:
            make_tiny_lm(tmp, texts, vocab_size=args["vocab_size"], positions=args["positions"], seed=args["seed"])
        else:
            make_tiny_classifier(tmp, train_tokenizer(texts, args["vocab_size"]), labels=labels,
                                 positions=args["positions"], seed=args["seed"])

    write_atomically(out, args["overwrite"], write)
    kind = f"sequence classifier ({', '.join(labels)})" if labels else "causal LM"
    return (f"a tiny GPT-2 {kind}, {args['positions']} positions, random weights, its tokenizer trained on "
            f"{len(texts)} texts of {args['data']}")


def main(argv: list[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    t0 = time.perf_counter()
    if args.pop("command") == "tiny-model":
        try:
            what = tiny_model(args)
        except (DataError, OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{args['out']}: {what}, in {time.perf_counter() - t0:.1f} s")
        return 0
    source, out = args.pop("source"), args.pop("out")
    try:
        m = prepare(source, out, PrepareOptions(**args))
    except (DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c = m["counts"]
    print(f"{source} -> {out} in {time.perf_counter() - t0:.1f} s")
    for s, n in c.items():
        seen = n.get("dropped_seen_in_train")  # held-out splits only
        print(
            f"  {s:5s}  {n['conversations']:7d} conversations  {n['pairs']:8d} pairs  {n['groups']:8d} groups"
            f"  unk {100 * n['unk_rate']:.2f}%"
            + (f"  (dropped {seen['pairs']} pairs / {seen['inputs']} inputs also in train)" if seen else "")
        )
        if seen is not None and not n["pairs"]:
            why = ("every one of its inputs is also a training input" if seen["pairs"] else
                   f"no conversation (or prompt) was drawn for it from {m['raw_conversations']}")
            print(f"  warning: {s} is empty ({why}); training needs valid and test inputs: add prompts, or raise "
                  "--valid-frac / --test-frac", file=sys.stderr)
    print(f"  vocab {m['vocab']['size']}  dropped {m['dropped']}  truncated {m['truncated']}")
    if m.get("columns"):
        print(f"  columns kept for rewards: {', '.join(m['columns'])}")
    prompt_only = sum(n.get("prompt_only", 0) for n in c.values())
    if prompt_only:
        print(f"  {prompt_only} prompt-only rows (no reply): RL only, train.pretrain_iters=0 with model.arch=hf")
    return 0


if __name__ == "__main__":
    sys.exit(main())
