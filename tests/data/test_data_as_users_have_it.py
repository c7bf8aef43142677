"""Data as TRL users have it: jsonl / parquet / csv / hf sources, --prompt-column and
--reply-column (``completion`` is a reply), prompt-only rows, conversational prompts, and every other column kept in
the Parquet shards and delivered per row by the pairs task."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayseq.config import ConfigError, build_config, task_config_model
from rayseq.data import DataError, DialogueData, PrepareOptions, prepare
from rayseq.data.__main__ import main as data_main
from rayseq.data.text import tokenize
from rayseq.tasks import make_task

PROBLEMS = [(f"what is {a} plus {b} ?", str(a + b)) for a in range(6) for b in range(5)]  # 30 distinct prompts


def opts(**kw) -> PrepareOptions:
    return PrepareOptions(quiet=True, valid_frac=0.1, test_frac=0.1, **kw)


def math_rows(with_reply: bool = False) -> list[dict]:
    """TRL-shaped rows: a prompt, a solution column, a difficulty column; a completion when asked."""
    rows = []
    for i, (q, a) in enumerate(PROBLEMS):
        row = {"prompt": q, "solution": a, "difficulty": i % 3}
        if with_reply:
            row["completion"] = f"it is {a}"
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def all_rows(data: DialogueData):
    """(prompt, reply, {column: value}) of every row of every split."""
    out = []
    for s in data.splits.values():
        for i in range(len(s)):
            out.append((s.prompts[i], s.replies[i], {c: v[i] for c, v in s.columns.items()}))
    return out


def test_prompt_only_jsonl_keeps_every_column(tmp_path):
    """No reply column: every row is prompt-only (an empty tgt), the solution and difficulty columns are written as
    typed extra.* Parquet columns and read back per row, beside the prompt as written."""
    src = write_jsonl(tmp_path / "math.jsonl", math_rows())
    m = prepare(f"jsonl:{src}", tmp_path / "out", opts())
    assert m["columns"] == {"solution": "arrow", "difficulty": "arrow"} and m["prompt_format"] == "text"
    assert sum(c["prompt_only"] for c in m["counts"].values()) == sum(c["pairs"] for c in m["counts"].values())
    table = pq.read_table(tmp_path / "out" / "train" / "part-00000.parquet")
    assert table.schema.field("extra.solution").type == pa.string()
    assert table.schema.field("extra.difficulty").type == pa.int64()
    assert table.column("reply").null_count == table.num_rows
    data = DialogueData.load(tmp_path / "out")
    assert data.column_names == ["solution", "difficulty"] and data.prompt_only_rows == len(PROBLEMS)
    assert all((s.tgt_len == 0).all() for s in data.splits.values())
    want = {q: (a, i % 3) for i, (q, a) in enumerate(PROBLEMS)}
    rows = all_rows(data)
    assert len(rows) == len(PROBLEMS)
    for prompt, reply, cols in rows:
        assert reply is None and (cols["solution"], cols["difficulty"]) == want[prompt]


def test_sources_agree_parquet_csv_hf_and_column_names(tmp_path):
    """The same rows from parquet, csv and a datasets.save_to_disk folder prepare to the same dataset;
    ``completion`` is understood as the reply; --prompt-column / --reply-column name other columns."""
    rows = math_rows(with_reply=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    import pyarrow.csv as pa_csv

    pa_csv.write_csv(pa.Table.from_pylist(rows), tmp_path / "m.csv")
    renamed = [{"question": r["prompt"], "answer_text": r["completion"], "solution": r["solution"],
                "difficulty": r["difficulty"]} for r in rows]
    write_jsonl(tmp_path / "renamed.jsonl", renamed)
    got = {}
    for name, source, kw in (("parquet", f"parquet:{tmp_path / 'm.parquet'}", {}),
                             ("csv", f"csv:{tmp_path / 'm.csv'}", {}),
                             ("renamed", f"jsonl:{tmp_path / 'renamed.jsonl'}",
                              {"prompt_column": "question", "reply_column": "answer_text"})):
        prepare(source, tmp_path / name, opts(**kw))
        got[name] = sorted(all_rows(DialogueData.load(tmp_path / name)), key=lambda r: r[0])
    datasets = pytest.importorskip("datasets", reason="hf: sources need datasets (the peers extra)")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "m_hf"))
    prepare(f"hf:{tmp_path / 'm_hf'}", tmp_path / "hf", opts())
    got["hf"] = sorted(all_rows(DialogueData.load(tmp_path / "hf")), key=lambda r: r[0])
    assert got["parquet"] == got["renamed"] == got["hf"]
    # csv has no types: pyarrow infers them, as pandas and datasets do (the digits of solution are integers)
    assert got["csv"] == [(p, r, {**c, "solution": int(c["solution"])}) for p, r, c in got["parquet"]]
    assert got["parquet"][0][1] == "it is 0" and got["parquet"][0][2] == {"solution": "0", "difficulty": 0}
    data = DialogueData.load(tmp_path / "parquet")
    assert data.prompt_only_rows == 0 and data.splits["train"].tgt_len.min() >= 1
    with pytest.raises(DataError, match="missing field 'question'"):
        prepare(f"parquet:{tmp_path / 'm.parquet'}", tmp_path / "x", opts(prompt_column="question"))


def test_conversational_prompts_and_json_columns(tmp_path):
    """Prompts as {role, content} lists are kept as written (the word tokenizer reads their contents); a TRL
    conversational completion is its text; a column whose values have no common type is kept as JSON; text and
    conversation mixed is an error naming the row."""
    rows = [{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": q}],
             "completion": [{"role": "assistant", "content": f"it is {a}"}],
             "meta": {"a": 1} if i % 2 else [1, "x"]} for i, (q, a) in enumerate(PROBLEMS)]
    m = prepare(f"jsonl:{write_jsonl(tmp_path / 'c.jsonl', rows)}", tmp_path / "out", opts())
    assert m["prompt_format"] == "conversational" and m["columns"] == {"meta": "json"}
    data = DialogueData.load(tmp_path / "out")
    assert data.conversational
    by_prompt = {p[1]["content"]: (r, c) for p, r, c in all_rows(data)}
    for i, (q, a) in enumerate(PROBLEMS):
        reply, cols = by_prompt[q]
        assert reply == f"it is {a}" and cols["meta"] == ({"a": 1} if i % 2 else [1, "x"])
    s = data.splits["train"]
    assert s.src_text[0].startswith("be brief what is")  # the contents, joined, for the word tokenizer
    bad = [{"prompt": "a ?"}, {"prompt": [{"role": "user", "content": "b ?"}]}]
    with pytest.raises(DataError, match=r"c2.jsonl:2: field 'prompt' is a conversation, earlier rows' are text"):
        prepare(f"jsonl:{write_jsonl(tmp_path / 'c2.jsonl', bad)}", tmp_path / "bad", opts())
    with pytest.raises(DataError, match="list of {role, content} messages"):
        prepare(f"jsonl:{write_jsonl(tmp_path / 'c3.jsonl', [{'prompt': [{'role': 'user'}]}])}", tmp_path / "b3",
                opts())


def test_cli_flags_and_summary(tmp_path, capsys):
    rows = [{"question": q, "answer": a} for q, a in PROBLEMS]
    src = write_jsonl(tmp_path / "q.jsonl", rows)
    assert data_main(["prepare", f"jsonl:{src}", "--out", str(tmp_path / "o"), "--prompt-column", "question",
                      "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "columns kept for rewards: answer" in out and "30 prompt-only rows" in out
    assert data_main(["prepare", f"csv:{tmp_path / 'nope.csv'}", "--out", str(tmp_path / "p")]) == 2
    assert "nope.csv: no such file" in capsys.readouterr().err


def test_pairs_task_delivers_columns_per_row_and_refuses_mle(tmp_path):
    """The pairs task's keys name rows: column_values gives each sampled row's own columns (training) and each
    held-out input's (validation, test); a prompt-only dataset refuses MLE pretraining and a model from scratch at
    config time, naming the missing column, and sample_prompts(with_targets=True) refuses too."""
    prepare(f"jsonl:{write_jsonl(tmp_path / 'm.jsonl', math_rows())}", tmp_path / "d", opts())
    base = ["task.name=pairs", f"task.data={tmp_path / 'd'}", "task.val_size=3", "task.test_size=100",
            "rollout.num_workers=0"]
    with pytest.raises(ConfigError, match=r"train.pretrain_iters=1000: task.data=.* has no 'reply' column"):
        build_config(None, base)
    with pytest.raises(ConfigError, match="model.arch=rnn: .* has no 'reply' column"):
        build_config(None, [*base, "train.pretrain_iters=0"])
    task = make_task(task_config_model("pairs")(name="pairs", data=str(tmp_path / "d"), val_size=3, test_size=100))
    answer = dict(PROBLEMS)
    b = task.sample_prompts(np.random.default_rng(0), 16)
    cols, prompts = task.column_values(b.key), task.prompt_values(b.key)
    assert len(cols["solution"]) == 16
    for p, sol, key in zip(prompts, cols["solution"], b.key):
        assert sol == answer[p]
        assert task.train.src_text[key] == " ".join(tokenize(p))  # the row sampled
    for split in ("val", "test"):
        keys = task.split_keys(split)
        src, src_len, _ = task.split(split)
        vals = task.column_values(keys)
        for i, k in enumerate(keys):
            assert vals["solution"][i] == answer[task.prompt_values([k])[0]]
            assert task.vocab.decode(src[i, : src_len[i]]) == tokenize(task.prompt_values([k])[0])
    with pytest.raises(DataError, match="no training row has a reply"):
        task.sample_prompts(np.random.default_rng(0), 4, with_targets=True)

