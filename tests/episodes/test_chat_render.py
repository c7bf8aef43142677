"""Observations as a chat template's suffix, with a real (tiny, local) byte-level BPE tokenizer: the suffix extends the
ids the policy sampled without touching them, a template that cannot be shown to do so starts a new sample, and the
drift count sees what re-tokenising the conversation would have changed."""

from __future__ import annotations

import numpy as np
import pytest

from rayseq.episodes.render import ChatRenderer, Split, retokenization_drift

pytest.importorskip("transformers", reason="the hf extra: pip install -e .[hf]")

# ChatML's shape, with the tokenizer's end token closing each assistant message
ENDS_REPLIES = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}"
                "{% if m['role'] == 'assistant' %}<eos>{% endif %}\n{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|> {% endif %}")
# the same, keeping only the last two messages: earlier turns are rewritten (dropped) as the conversation grows
FORGETS = ENDS_REPLIES.replace("messages %}", "messages[-2:] %}")
# ENDS_REPLIES with the tools named in a system line: a template that renders tools (TRL's environment_factory classes)
TOOLS_TEMPLATE = ("{% if tools %}<|system|> tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}\n"
                  "{% endif %}" + ENDS_REPLIES)
# no end token after a reply: what the policy sampled (its <eos>) is not what the template renders
NO_END = ENDS_REPLIES.replace("<eos>", "")


@pytest.fixture(scope="module")
def tok(hf_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)


def with_template(tok, template):
    tok.chat_template = template
    return ChatRenderer(tok)


def char_ids(tok, text):
    """``text`` one byte-level token per character: ids a policy may sample, which BPE would have merged."""
    return tok.convert_tokens_to_ids(list(text))


def test_the_suffix_extends_the_sampled_ids_and_the_drift_is_counted(tok):
    r = with_template(tok, ENDS_REPLIES)
    src, conv = r.start("say red")
    action = char_ids(tok, "red") + [tok.eos_token_id]  # sampled one character at a time, then the end token
    nxt = r.next(conv, action, True, "say blue")
    assert not isinstance(nxt, Split)
    ids = src + action + nxt
    assert ids[len(src): len(src) + len(action)] == action  # the sampled ids, untouched
    msgs = [{"role": "user", "content": "say red"}, {"role": "assistant", "content": "red"},
            {"role": "user", "content": "say blue"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == text  # the same conversation, as text
    # the next action, the last one: encoding the final conversation's text again merges r-e-d and b-l-u-e
    last = char_ids(tok, "blue") + [tok.eos_token_id]
    r.finish(conv, last, True)
    final = np.asarray(ids + last)
    again = np.asarray(r.conversation_ids(conv))
    assert tok.decode(again) == tok.decode(final)
    assert retokenization_drift(final, again) > 0
    assert len(again) < len(final)


@pytest.mark.parametrize(("template", "why"), [(FORGETS, "rewrites earlier turns"),
                                               (NO_END, "does not render the reply as sampled")])
def test_a_template_that_does_not_extend_the_prefix_starts_a_new_sample(tok, template, why):
    r = with_template(tok, template)
    _, conv = r.start("say red")
    out = r.next(conv, char_ids(tok, "red") + [tok.eos_token_id], True, "say blue")
    assert isinstance(out, Split) and why in out.reason
    # the new sample's prompt is the conversation rendered again, ready for the next reply (transformers renders
    # templates with trim_blocks: the newline after a block tag goes)
    assert tok.decode(out.src).endswith("<|user|> say blue<|assistant|> ")
