"""Preference data as TRL users have it (rayseq.data.preferences): standard and conversational rows, explicit and
implicit prompts, margins, JSONL / Parquet / CSV / datasets folders, and the errors a bad row gets."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from rayseq.data.errors import DataError
from rayseq.data.preferences import PreferenceRow, read_preferences, split_rows

STANDARD = [{"prompt": "The sky is", "chosen": " blue.", "rejected": " green.", "margin": 2},
            {"prompt": "Grass is", "chosen": " green.", "rejected": " red."}]
CONVERSATIONAL = [{"prompt": [{"role": "user", "content": "What color is the sky?"}],
                   "chosen": [{"role": "assistant", "content": "It is blue."}],
                   "rejected": [{"role": "assistant", "content": "It is green."}]}]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_standard_rows_in_every_file_format(tmp_path):
    want = [PreferenceRow("The sky is", " blue.", " green.", 2.0), PreferenceRow("Grass is", " green.", " red.", 0.0)]
    assert read_preferences(_jsonl(tmp_path / "p.jsonl", STANDARD)) == want
    table = pa.Table.from_pylist([{**r, "margin": r.get("margin")} for r in STANDARD])
    pq.write_table(table, tmp_path / "p.parquet")
    assert read_preferences(tmp_path / "p.parquet") == want
    pa_csv.write_csv(table, tmp_path / "p.csv")
    assert read_preferences(tmp_path / "p.csv") == want
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([{**r, "margin": r.get("margin")} for r in STANDARD]).save_to_disk(tmp_path / "ds")
    assert read_preferences(tmp_path / "ds") == want


def test_conversational_and_implicit_prompts(tmp_path):
    rows = read_preferences(_jsonl(tmp_path / "c.jsonl", CONVERSATIONAL))
    assert rows == [PreferenceRow([{"role": "user", "content": "What color is the sky?"}], "It is blue.",
                                  "It is green.")]
    implicit = [{"chosen": CONVERSATIONAL[0]["prompt"] + CONVERSATIONAL[0]["chosen"],
                 "rejected": CONVERSATIONAL[0]["prompt"] + CONVERSATIONAL[0]["rejected"]}]
    assert read_preferences(_jsonl(tmp_path / "i.jsonl", implicit)) == rows  # TRL's extract_prompt
    text = read_preferences(_jsonl(tmp_path / "t.jsonl", [{"chosen": "The sky is blue.",
                                                           "rejected": "The sky is green."}]))
    assert text == [PreferenceRow("The sky is", " blue.", " green.")]


@pytest.mark.parametrize("row, match", [
    ({"prompt": "x", "chosen": "a"}, "missing field 'rejected'"),
    ({"prompt": "x", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]}, "mixes text"),
    ({"prompt": "x", "chosen": "a", "rejected": "b", "margin": "big"}, "margin"),
    ({"chosen": "a b", "rejected": "c d"}, "share no first word"),
    ({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "user", "content": "a"}],
      "rejected": [{"role": "assistant", "content": "b"}]}, "assistant"),
])
def test_bad_rows_are_named(tmp_path, row, match):
    with pytest.raises(DataError, match=match) as exc:
        read_preferences(_jsonl(tmp_path / "bad.jsonl", [row]))
    assert "bad.jsonl:1" in str(exc.value)


def test_bad_sources(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_preferences(tmp_path / "nowhere.jsonl")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DataError, match="not a .jsonl"):
        read_preferences(tmp_path / "x.txt")
    mixed = [STANDARD[0], {**CONVERSATIONAL[0]}]
    with pytest.raises(DataError, match="some prompts are text"):
        read_preferences(_jsonl(tmp_path / "m.jsonl", mixed))


def test_split_is_seeded_and_disjoint():
    a, b = split_rows(100, 0.1, 0.2, seed=3), split_rows(100, 0.1, 0.2, seed=3)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert (len(a["train"]), len(a["valid"]), len(a["test"])) == (70, 10, 20)
    assert sorted(np.concatenate(list(a.values())).tolist()) == list(range(100))
    assert not np.array_equal(split_rows(100, 0.1, 0.2, seed=4)["test"], a["test"])
    with pytest.raises(DataError, match="none to train"):
        split_rows(2, 0.5, 0.5, seed=0)
