"""Open-domain chit-chat (Tuan et al. 2018, Sec. 5.2, Table 2 and Supplement Table 2): the ``pairs`` task
(:mod:`rayseq.tasks.pairs`) on the chit-chat corpus.

``task.name=chitchat`` is ``task.name=pairs`` with the corpus's defaults: ``task.data=data/chitchat`` and
``task.source=chitchat`` (the ``chitchat-dataset`` package, see :mod:`rayseq.data.preparation`; another corpus with
``task.source=cornell:DIR`` or ``opensubtitles:FILE``), and the test details carry replies to the inputs of the
paper's Supplement Table 2. Reward and evaluation are the pairs task's: BLEU-2 against all references of an input.
"""

from __future__ import annotations

from rayseq.tasks.pairs import PairsTask, distinct_n, ensure_prepared, self_bleu

PAPER_PROMPTS = (
    "what can i do for you .", "go , go , go !", "i said ...", "it ’s wonderful .", "come here",
    "get him down .", "change your mind .", "let him go .",
)


class ChitchatTask(PairsTask):
    name = "chitchat"
    defaults = {"data": "data/chitchat", "source": "chitchat"}
    example_prompts = PAPER_PROMPTS
    about = ("Chit-chat: a small sequence-to-sequence model trained on short dialogue turns; say something and it "
             "answers in one turn, without memory of earlier turns.")


__all__ = ["PAPER_PROMPTS", "ChitchatTask", "distinct_n", "ensure_prepared", "self_bleu"]
