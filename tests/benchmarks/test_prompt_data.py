"""benchmarks/prompt_data.py's quick run: a sampling sent as token arrays and as keys through the real RolloutGroup
on light stand-ins, and the chitchat data re-tokenised against read back; its table and JSON record."""

from __future__ import annotations

import json

import pytest

from benchmarks.prompt_data import main

pytestmark = [pytest.mark.ray, pytest.mark.e2e]


def test_quick_run_sends_arrays_and_keys_and_times_the_task_start(ray_session, tmp_path):
    pytest.importorskip("transformers", reason="the start part re-tokenises with a Hugging Face tokenizer")
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "prompt_data_quick.json").read_text())
    send = record["send"]
    assert {(r["batch"], r["tokens"], r["form"]) for r in send} == {(b, s, f) for b, s in ((64, 16), (256, 64))
                                                                   for f in ("arrays", "keys")}
    assert all(r["cpu_ms"] > 0 and r["wall_ms"] > 0 and len(r["cpu_ms_all"]) == 3 for r in send)
    by = {(r["batch"], r["form"]): r["sent_bytes"] for r in send}
    # keys: 8 bytes a prompt and the pickling around them; arrays: 2 x B x S int64 and their lengths
    assert by[(256, "arrays")] > 2 * 256 * 64 * 8 > 50 * by[(256, "keys")]
    start = record["start"]
    assert start["identical"] and start["rows"] > 100 and start["encode_s"] > 0 and start["read_s"] > 0
    fitted, whole = start["fit"]  # the arrays built in a fresh process for a 256-position model, and for none
    assert (fitted["context"], whole["context"]) == (256, 0) and fitted["width"] <= whole["width"]
    assert fitted["held_mib"] > 0 and fitted["peak_mib"] >= 0 and fitted["seconds"] > 0
    assert all(f[k] > 0 for f in (fitted, whole) for k in ("batch_ms_held", "batch_ms_padded", "references_s_held"))
    assert record["footprint"] == {"actors": 2, "with_torch": 0}
    assert "| 256 × 64 |" in (tmp_path / "prompt_data_quick.md").read_text()
