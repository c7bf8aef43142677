"""Coming from TRL: a prompt-only dataset with a solution column trains the tiny GPT-2 with GRPO on
TRL-style reward functions through the Ray path (rollout workers, a scorer actor), each function receiving its
rows' own columns in training, validation and test; conversational prompts are rendered with the tokenizer's chat
template (a clear error without one), and serving renders /v1/chat/completions messages with the same template."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from rayseq.config import ConfigError
from rayseq.data import PrepareOptions, prepare
from rayseq.distributed.driver import Trainer
from rayseq.tasks import make_task
from tests.hf.test_hf_training import hf_config

TINY = ["task.name=pairs", "task.test_size=100", "task.val_size=4", "train.pretrain_iters=0", "train.iters=2",
        "train.batch_size=8", "train.eval_every=2", "algo.minibatch_size=8", "algo.name=grpo", "algo.group_size=4",
        "progress=false"]


def math_jsonl(path, conversational=False, *, size=(6, 5), replies=False):
    """a + b questions for a < size[0], b < size[1], with their solution (and a reply "{a + b} it is")."""
    rows = []
    for a in range(size[0]):
        for b in range(size[1]):
            q = f"what is {a} plus {b}?"
            prompt = [{"role": "system", "content": "answer briefly"}, {"role": "user", "content": q}] \
                if conversational else q
            rows.append({"prompt": prompt, "solution": str(a + b), **({"completion": f"{a + b} it is"} if replies
                                                                        else {})})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def math_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("math")
    prepare(f"jsonl:{math_jsonl(d / 'm.jsonl')}", d / "data",
            PrepareOptions(quiet=True, valid_frac=0.15, test_frac=0.15, max_tgt_len=6))
    return d / "data"


def test_prompt_only_data_needs_rl_only(math_data, hf_dir):
    with pytest.raises(ConfigError, match=r"train.pretrain_iters=2: task.data=.* has no 'reply' column"):
        hf_config(math_data, hf_dir, "train.pretrain_iters=2", tiny=TINY)
    cfg = hf_config(math_data, hf_dir, tiny=TINY)
    task = make_task(cfg.task)
    assert task.max_tgt_len == 7  # --max-tgt-len 6 (in the model's tokens) + the end token


@pytest.mark.ray
def test_grpo_with_trl_rewards_on_ray(ray_session, math_data, hf_dir, tmp_path):
    """GRPO on 2 rollout workers, rewards on a scorer actor: the accuracy reward reads each row's solution (the
    prompt's a + b) in training, in validation and test (the learner's val/reward, test/reward); the length and
    async terms are logged beside it."""
    log = tmp_path / "calls.jsonl"
    cfg = hf_config(math_data, hf_dir, "rollout.num_workers=2", "rollout.num_cpus_per_worker=0.5",
                    "scorer.num_scorers=1", "scorer.num_cpus_per_scorer=0.5", "learner.num_cpus=0.5",
                    f"reward.terms=[{{fn: tests.reward_fixtures:trl_logged, kwargs: {{log: '{log}'}}, name: acc}}, "
                    "{fn: tests.reward_fixtures:trl_length, weight: 0.01}, {fn: tests.reward_fixtures:trl_async}]",
                    run_dir=tmp_path / "run", tiny=TINY)
    summary = Trainer(cfg).run()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) >= 2 * 8
    for c in calls:  # every reply judged against its own row's solution
        words = c["prompt"].rstrip("?").split()
        assert c["solution"] == str(int(words[2]) + int(words[4])) and isinstance(c["completion"], str)
    assert len({c["pid"] for c in calls}) >= 2  # the scorer actor (training) and the learner (val/test)
    rows = [r for r in pq.read_table(tmp_path / "run" / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 2 and all(r["reward/acc"] is not None and "reward/trl_async" in r for r in rows)
    assert "test/reward" in summary["metrics"] and "val/reward" in summary["metrics"]


def test_conversational_prompts_use_the_chat_template(tmp_path, hf_dir, chat_hf_dir):
    """Conversational prompts: the task's input ids are the template's rendering (with the assistant turn opened);
    a tokenizer without a template is a clear error; a trained checkpoint's server renders /v1/chat/completions
    messages the same way."""
    prepare(f"jsonl:{math_jsonl(tmp_path / 'c.jsonl', conversational=True)}", tmp_path / "data",
            PrepareOptions(quiet=True, valid_frac=0.15, test_frac=0.15, max_tgt_len=6))
    with pytest.raises(ValueError, match="the tokenizer has no chat template, and the prompts are conversations"):
        make_task(hf_config(tmp_path / "data", hf_dir, tiny=TINY).task)
    cfg = hf_config(tmp_path / "data", chat_hf_dir, "rollout.num_workers=0",
                    "reward.fn=tests.reward_fixtures:trl_accuracy", run_dir=tmp_path / "run", tiny=TINY)
    task = make_task(cfg.task)
    messages = task.prompt_values([0])[0]
    rendered = f"<|system|> answer briefly\n<|user|> {messages[1]['content']}\n<|assistant|> "
    assert task.reply_text(task.train.src[0, : task.train.src_len[0]]) == rendered
    assert task.spec()["tokenizer"]["chat_template"] is True
    Trainer(cfg).run()

    from rayseq.serving.model import ChatModel

    model = ChatModel(tmp_path / "run")
    assert model.prompt_text(messages) == rendered
    assert model.encode(model.prompt_text(messages))[0] == task.train.src[0, : task.train.src_len[0]].tolist()
    # the exported folder carries the template: TRL-side tools render the same prompt
    from transformers import AutoTokenizer

    from rayseq.export import main as export_main

    assert export_main([str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == rendered


def test_trl_guide_runs_as_written(tmp_path, hf_dir, monkeypatch):
    """docs/guides/trl.md: its files and its three commands, run as written but for the model (the tiny
    GPT-2), a 2-iteration budget and in-process rollouts."""
    from rayseq.config import build_config
    from rayseq.data.__main__ import main as data_main
    from rayseq.export import main as export_main
    from tests.doc_examples import code_blocks, commands, page

    blocks = code_blocks(page("docs/guides/trl.md"))
    (tmp_path / "math.jsonl").write_text(next(b for lang, b in blocks if lang == "json"), encoding="utf-8")
    (tmp_path / "math_rewards.py").write_text(next(b for lang, b in blocks if lang == "python"), encoding="utf-8")
    cmds = commands(next(b for lang, b in blocks if lang == "bash"))  # tiny-model's model: hf_dir stands for it
    prep, train, export = (next(c for c in cmds if c[: len(head)] == head) for head in
                           (["python", "-m", "rayseq.data", "prepare"], ["python", "-m", "rayseq.train"],
                            ["python", "-m", "rayseq.export"]))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert prep[:3] == ["python", "-m", "rayseq.data"] and data_main([*prep[3:], "--quiet"]) == 0
    assert train[:3] == ["python", "-m", "rayseq.train"]
    overrides = [a if not a.startswith("model.path=") else f"model.path={hf_dir}" for a in train[3:]]
    cfg = build_config(None, [*overrides, "train.iters=2", "rollout.num_workers=0", "progress=false"])
    summary = Trainer(cfg).run()
    rows = [r for r in pq.read_table(tmp_path / "runs" / "math" / "metrics.parquet").to_pylist()
            if r["stage"] == "train"]
    assert len(rows) == 2 and all(r["reward/accuracy_reward"] is not None for r in rows)
    # GRPO with dynamic sampling (the command's algo.dynamic_sampling=true): its rounds are logged
    assert cfg.algo.dynamic_sampling and all(r["group/prompts_consumed"] >= 4 for r in rows)
    assert "test/reward" in summary["metrics"]
    assert export[:3] == ["python", "-m", "rayseq.export"] and export_main(export[3:]) == 0
    assert (tmp_path / "exported" / "math" / "config.json").is_file()
