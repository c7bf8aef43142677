"""A class written for TRL's ``GRPOTrainer(environment_factory=...)`` runs unchanged (``env.name=trl``): TRL itself
finds the same tools and reward in it, a reply's tool calls are read as TRL's own parser reads them, a hand-played
episode gets what TRL would give, and GRPO trains a Hugging Face policy on it through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rayseq.episodes.adapters import TRLEnvironment, parse_tool_calls, trl_tools
from rayseq.episodes.protocol import EnvError, make_environment
from rayseq.train import main as train_main
from tests.episodes.envs_for_tests import TRLCounter
from tests.episodes.test_chat_render import TOOLS_TEMPLATE
from tests.episodes.test_episodes import SMALL
from tests.hf_fixtures import with_chat_template

trl = pytest.importorskip("trl", reason="the peers extra: pip install -e .[peers]")

FACTORY = "tests.episodes.envs_for_tests:TRLCounter"


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def trl_trainer(hf_dir, tmp_path_factory):
    """TRL's GRPOTrainer made with the class, on the tiny GPT-2 with TRL's own Qwen2.5 chat template (one TRL knows
    how to parse tool calls of)."""
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    model = with_chat_template(hf_dir, tmp_path_factory.mktemp("trl") / "tiny-qwen-template", template)
    args = trl.GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl-out")), max_steps=1, report_to=[],
                          per_device_train_batch_size=2, num_generations=2, use_cpu=True)
    return trl.GRPOTrainer(model=str(model), environment_factory=TRLCounter, args=args)


def test_trl_and_the_adapter_find_the_same_tools_and_reward(trl_trainer):
    env = TRLEnvironment(FACTORY)
    assert [t.__name__ for t in trl_trainer._env_tools[None]] == [t.__name__ for t in env.tools] == ["add"]
    assert trl_tools(TRLCounter()) and "TRLCounter" in trl_trainer.reward_func_names  # get_reward: the reward


def test_tool_calls_are_read_as_trls_parser_reads_them(trl_trainer):
    from trl.chat_template_utils import parse_response  # what GRPOTrainer parses a completion with

    tok = trl_trainer.processing_class
    prefix = list(tok.apply_chat_template([{"role": "user", "content": "Go."}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False))
    for text in (call("add", n=2), call("add", n=1) + "\n" + call("add", n=4), "just an answer"):
        ids = tok(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        theirs = parse_response(tok, ids, prefix=prefix).get("tool_calls") or []
        ours = parse_tool_calls(text)
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in theirs] == \
            [(c["name"], c["arguments"]) for c in ours]


def test_a_hand_played_episode_gets_what_trl_would_give():
    env = make_environment("trl", {"factory": FACTORY, "max_calls": 4})
    prompt = [{"role": "system", "content": "Count."}, {"role": "user", "content": "Go."}]
    # reset(**row)'s text is appended to the last user message; the row's columns reach reset
    assert env.reset(0, prompt=prompt, target=4) == [prompt[0], {"role": "user", "content": "Go. Reach 4."}]
    obs, r, done, _ = env.step("I add two. " + call("add", n=2))
    assert (obs, r, done) == ([{"role": "tool", "name": "add", "content": "counter: 2"}], 0.0, False)
    obs, r, done, _ = env.step(call("add", n=9) + call("sub", n=1) + "<tool_call>{not json</tool_call>")
    assert [m["content"] for m in obs] == ["{'error': 'at most 5 at a time'}", "{'error': 'Tool sub not found.'}",
                                           "{'error': 'unreadable tool call: Expecting property name enclosed in "
                                           "double quotes: line 1 column 2 (char 1)'}"]
    assert env.step(call("add", n=2))[:3] == ([{"role": "tool", "name": "add", "content": "counter: 4"}], 0.0, False)
    assert env.step("Done: 4.")[:3] == (None, 1.0, True)  # no tool call: the episode ends, get_reward() scores it
    # without a prompt column the reset's text is the observation; max_calls ends (and scores) the episode
    assert env.reset(1, target=2) == " Reach 2."
    env.step(call("add", n=1)), env.step(call("add", n=1)), env.step(call("add", n=1))
    assert env.step(call("add", n=-1))[1:3] == (1.0, True)


def test_bad_trl_classes_are_refused_with_the_key():
    with pytest.raises(EnvError, match="env.kwargs.factory='nowhere'"):
        make_environment("trl", {"factory": "nowhere"})
    with pytest.raises(EnvError, match="TRLNoReset has no reset"):
        make_environment("trl", {"factory": "tests.episodes.envs_for_tests:TRLNoReset"})
    env = TRLEnvironment("tests.episodes.envs_for_tests:TRLCounterNoText")
    with pytest.raises(EnvError, match="returned nothing and the row has no prompt"):
        env.reset(0)


@pytest.mark.e2e
def test_grpo_trains_a_hf_policy_on_a_trl_environment_from_the_cli(hf_dir, tmp_path, capsys):
    model = with_chat_template(hf_dir, tmp_path / "tiny-tools", TOOLS_TEMPLATE)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": "Count."}], "target": t}) + "\n"
                            for t in (2, 3, 4)))
    run = tmp_path / "run"
    code = train_main(["env.name=trl", f"env.kwargs.factory={FACTORY}", "env.kwargs.max_calls=2", "env.max_turns=3",
                       f"env.rows={rows}", "env.max_action_tokens=24", "algo.name=grpo", "algo.group_size=2",
                       "model.arch=hf", f"model.path={model}", "train.batch_size=4", "train.iters=2",
                       f"run_dir={run}", *SMALL[:-1]])
    assert code == 0, capsys.readouterr().err
    rows = [r for r in pq.read_table(run / "metrics.parquet").to_pylist() if r["stage"] == "train"]
    assert len(rows) == 2 and all(np.isfinite(r["loss/policy"]) for r in rows)
    assert all(1 <= r["episode/turns"] <= 3 and r["episode/failures"] == 0 for r in rows)


def _add(n: int) -> int:
    """Add to the counter.

    Args:
        n: how much
    """
    return n


def _note(text: str) -> str:
    """Write a note.

    Args:
        text: the note
    """
    return text


XML_ADD = "<tool_call>\n<function=_add>\n<parameter=n>\n{}\n</parameter>\n</function>\n</tool_call>"
XML_NOTE = "<tool_call>\n<function=_note>\n<parameter=text>\n75001\n</parameter>\n</function>\n</tool_call>"
GLM = "<tool_call>{}\n<arg_key>{}</arg_key>\n<arg_value>{}</arg_value>\n</tool_call>"
# TRL's chat template of a family -> (tool_format, replies, the turn's end as the template writes it)
OTHER_FORMATS = {
    "qwen3_5_nothink": ("xml", [XML_ADD.format(7), XML_NOTE + "\n" + XML_ADD.format(2), "no call at all"],
                        "<|im_end|>"),
    "glm4moe": ("glm", [GLM.format("_add", "n", 3), GLM.format("_note", "text", "hi there")], ""),
    "llama3_2": ("llama3", ['{"name": "_add", "parameters": {"n": 4}}', "just text"], "<|eot_id|>"),
}


@pytest.mark.parametrize("family", sorted(OTHER_FORMATS))
def test_other_tool_formats_are_read_as_trls_parser_reads_them(hf_dir, family):
    """Qwen3.5's XML, GLM's key/value and Llama 3's JSON calls: ours (typed by the tool's signature) = what TRL's
    ``parse_response`` reads with the family's response template and the tools' schemas; ``auto`` reads them
    the same."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, parse_response

    from rayseq.episodes.adapters import typed_arguments

    fmt, replies, end = OTHER_FORMATS[family]
    tok = AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / f"{family}.jinja").read_text()
    tok = add_response_schema(tok)
    tools = {"_add": _add, "_note": _note}
    prefix = list(tok.apply_chat_template([{"role": "user", "content": "Go."}], tools=list(tools.values()),
                                          add_generation_prompt=True, tokenize=True, return_dict=False))
    for text in replies:
        ids = tok(text + end, add_special_tokens=False)["input_ids"]
        theirs = parse_response(tok, ids, prefix=prefix, tools=list(tools.values())).get("tool_calls") or []
        ours = parse_tool_calls(text, fmt)
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in theirs] == \
            [(c["name"], typed_arguments(tools[c["name"]], c)) for c in ours]
        assert parse_tool_calls(text, "auto") == ours
    # another family's call is no Hermes call (at most an unreadable one, answered with its error)
    assert all("error" in c for c in parse_tool_calls(replies[0], "hermes"))


def test_an_episode_in_the_xml_format_and_a_bad_format():
    env = make_environment("trl", {"factory": FACTORY, "max_calls": 4, "tool_format": "xml"})
    env.reset(0, prompt="Go.", target=2)
    obs, r, done, _ = env.step("<tool_call>\n<function=add>\n<parameter=n>\n2\n</parameter>\n</function>\n</tool_call>")
    assert (obs, r, done) == ([{"role": "tool", "name": "add", "content": "counter: 2"}], 0.0, False)
    assert env.step("Done.")[:3] == (None, 1.0, True)
    with pytest.raises(EnvError, match=r"env.kwargs.tool_format='json': one of .*hermes .*xml .*glm .*llama3 .*auto"):
        make_environment("trl", {"factory": FACTORY, "tool_format": "json"})
    assert "error" in parse_tool_calls('{"name": "add", "parameters": [1]}', "llama3")[0]
