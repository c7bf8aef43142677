"""The documentation's commands run as written (tests/doc_commands.py): each page of :data:`RUN_PAGES` has every
``bash`` block declare how it is tested, in a ``<!-- docs-test ... -->`` comment right above it (the budget keys
appended to its training commands, the commands it does not run and why), and its blocks run in order in a scratch
clone of the repository, each command to exit status 0. A page that drifts from the code fails here."""

from __future__ import annotations

import re
import time

import pytest

from tests.doc_commands import BLOCK, MARKER, bash_blocks, page_blocks, planned, run_page
from tests.doc_examples import ROOT, page

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

# the pages whose commands are run (every bash block of theirs declares how), and the modules they need; the
# Hugging Face pages run in test_doc_commands_hf.py (a module of its own: pytest -n 2 --dist loadscope runs the two
# modules side by side)
RUN_PAGES = {"docs/getting-started.md": (), "docs/guides/failures.md": (), "docs/concepts/configuration.md": ()}
# the README and the guides whose commands are a few short runs (test_doc_commands_guides.py)
GUIDE_PAGES = {"README.md": (), "docs/guides/own-data.md": (), "docs/guides/environments.md": (),
               "docs/guides/transformer.md": ()}
# the guides that train, then serve what they trained (test_doc_commands_serving.py)
SERVING_PAGES = {"docs/guides/serve.md": (), "docs/guides/tune.md": ()}
HF_PAGES = {"docs/guides/hf-policies.md": ("transformers",), "docs/guides/trl.md": ("transformers",),
            "docs/guides/reward-models.md": ("transformers",)}
# the algorithm pages: one training command each, or a few, in one process; those on the chitchat data (which they
# prepare first) run in test_doc_commands_chitchat.py, the others in test_doc_commands_algos.py (two modules, so
# that pytest -n 2 --dist loadscope runs them side by side)
ALGO_PAGES = {str(p.relative_to(ROOT)): () for p in sorted((ROOT / "docs" / "algorithms").glob("*.md"))
              if "```bash" in p.read_text(encoding="utf-8")}
CHITCHAT_PAGES = [rel for rel in ALGO_PAGES if "task.name=chitchat" in page(rel)]
SHELL = ("bash", "sh", "shell", "console")  # the languages of a block of commands
ALL_PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")
                                  if "hooks" not in p.parts)]


def test_every_docs_test_comment_is_understood_and_above_a_block():
    """A docs-test comment anywhere parses (an unknown line is an error) and is right above the bash block it
    is about; on the pages that are run, every bash block has one, and runs something unless it says why not."""
    for rel in ALL_PAGES:
        blocks = page_blocks(rel)  # parses every comment above a block
        outside_code = BLOCK.sub("", page(rel))  # an example of the syntax in a code block is not one
        assert len(MARKER.findall(outside_code)) == sum(b.declared for b in blocks), \
            f"{rel}: a docs-test comment that is not right above a bash block"
    for rel in {**RUN_PAGES, **GUIDE_PAGES, **SERVING_PAGES, **HF_PAGES, **ALGO_PAGES}:
        blocks = bash_blocks(rel)
        assert blocks and all(b.declared for b in blocks), \
            [b.where() for b in blocks if not b.declared]
        assert any(reason is None for b in blocks for _, reason in planned(b)), rel


def test_every_command_block_is_run_or_says_why_not():
    """A page's command blocks (bash, sh, console) are run by a test or declare why not: on a page the tests run,
    every block declares its budget or its skips; on any other page, every block carries a docs-test comment whose
    ``skip:`` lines leave out each of its commands, with the reason (a server, a cluster, a GPU, a placeholder). A new
    page, or a new block, cannot go untested unnoticed."""
    run = {**RUN_PAGES, **GUIDE_PAGES, **SERVING_PAGES, **HF_PAGES, **ALGO_PAGES}
    problems = []
    for rel in ALL_PAGES:
        for b in page_blocks(rel):
            if b.language not in SHELL:
                continue
            if not b.declared:
                problems.append(f"{b.where()}: a {b.language} block without a docs-test comment above it")
            elif rel in run and b.language != "bash":
                problems.append(f"{b.where()}: a page that is run has its commands in a bash block")
            elif rel not in run:
                problems += [f"{b.where()}: not skipped on a page that is not run: {' '.join(args)}"
                             for args, reason in planned(b) if reason is None]
    assert not problems, "\n".join(problems) + (
        "\n(run the page: RUN_PAGES or GUIDE_PAGES in tests/docs/test_doc_commands.py, or skip the command with its "
        "reason; the syntax: tests/doc_commands.py)")


@pytest.mark.parametrize("rel", list(RUN_PAGES))
def test_the_page_commands_run_as_written(rel, tmp_path):
    """Every command of the page that is not skipped, with the budget its block declares, exits with 0."""
    run_and_check(rel, tmp_path)


def run_and_check(rel: str, tmp_path) -> None:
    for module in {**RUN_PAGES, **GUIDE_PAGES, **SERVING_PAGES, **HF_PAGES, **ALGO_PAGES}[rel]:
        pytest.importorskip(module, reason="the hf extra: pip install -e .[hf]")
    t0 = time.perf_counter()
    log = []
    ran = run_page(rel, tmp_path / "clone", log=log.append)
    print("\n".join(log) + f"\n{rel}: {len(ran)} commands in {time.perf_counter() - t0:.0f} s")
    failed = [r for r in ran if r.returncode != 0]
    assert not failed, f"{failed[0].block.where()}: {' '.join(failed[0].args)}\n{failed[0].output[-4000:]}"
    expected = sum(reason is None for b in bash_blocks(rel) for _, reason in planned(b))
    assert len(ran) == expected
    # a training command prints its figures table
    trained = [r for r in ran if r.args[:3] == ["python", "-m", "rayseq.train"] and "--print-config" not in r.args]
    assert all(re.search(r"^run dir: .*wall: \d+ s", r.output, flags=re.M) for r in trained)
