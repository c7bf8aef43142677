"""The documentation site and the examples in it: ``mkdocs build --strict`` passes, the generated reference matches
the code (every key ``--print-config`` prints, every option each command's ``--help`` prints, every HTTP route), every
``python -m rayseq.train`` command in the README and the docs is a valid config, the cheap examples run as written,
and the built site works in the system Chromium (pages render, the navigation leads where it says, search finds a
word). No Ray is started; the site's build and the subprocess runs make the module ``e2e``, left out of the fast
tier (``pytest tests/docs`` runs it alone).
"""

from __future__ import annotations

import html
import io
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from tests.doc_examples import ROOT, code_blocks, commands, listed_files, names_file, page, table_rows

pytestmark = pytest.mark.e2e

SCRIPTS = ("rayseq-train", "rayseq-tune", "rayseq-serve", "rayseq-export", "rayseq-data")
DOC_PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")
                                  if "hooks" not in p.parts)]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built as CI builds it: ``mkdocs build --strict`` (a broken link, a missing page, a missing anchor or
    a docstring warning fails it)."""
    out = tmp_path_factory.mktemp("site") / "site"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-6000:]
    assert "WARNING" not in log, log[-6000:]
    print(f"mkdocs build --strict: {time.perf_counter() - t0:.1f} s")
    return out


def html_of(site: Path, uri: str) -> str:
    return (site / uri / "index.html").read_text(encoding="utf-8")


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


# ---------------------------------------------------------------------------------------------- the reference


def print_config(*overrides: str) -> str | None:
    """``python -m rayseq.train --print-config OVERRIDES`` in this process: its output, or None when the config is
    refused (an algorithm on a task it does not accept)."""
    from rayseq.train import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([*overrides, "--print-config"])
    return out.getvalue() if rc == 0 else None


def printed_keys(text: str) -> dict[str, str]:
    """{dotted key: its printed value} of a ``--print-config`` listing (comments skipped, sections nested by
    indentation)."""
    keys, stack = {}, []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        key, _, value = line.strip().partition(":")
        stack = stack[:depth] + [key]
        if value.strip():
            keys[".".join(stack)] = value.strip()
    return keys


def reference_cells(site: Path) -> dict[str, str]:
    """{key id: the default cell's text} of the configuration reference."""
    rows = re.findall(r"<tr>(.*?)</tr>", html_of(site, "reference/config"), flags=re.S)
    cells = {}
    for row in rows:
        found = re.search(r'id="([^"]+)"', row)
        if found:
            tds = re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)
            cells[found.group(1)] = text_of(tds[2])
    return cells


def listings():
    """(label, --print-config output) for the default run, every built-in algorithm (on counting, or on the first
    task that accepts it) and every task (the episodes' one, ``env``, with an environment)."""
    from rayseq.config import ALGOS, TASKS

    yield "default", print_config()
    for algo in ALGOS:
        yield f"algo.name={algo}", next(t for t in (print_config(f"algo.name={algo}", *task) for task in
                                                   ([], ["task.name=chitchat"], ["task.name=oracle"],
                                                    ["task.name=preferences", "train.pretrain_iters=0"])) if t)
    for task in TASKS:
        yield f"task.name={task}", next(t for t in (print_config(f"task.name={task}", *algo) for algo in
                                                   ([], ["algo.name=seqgan"], ["env.name=guess_number"],
                                                    ["algo.name=reward_model", "train.pretrain_iters=0"])) if t)


def reference_id(key: str, keys: dict[str, str]) -> str:
    """The reference lists algo.* keys per algorithm (``algo.grpo.group_size``) and task.* keys per task."""
    for section in ("algo", "task"):
        if key.startswith(section + "."):
            return key.replace(f"{section}.", f"{section}.{keys[section + '.name']}.", 1)
    return key


def test_the_config_reference_lists_every_key_print_config_prints(site):
    cells = reference_cells(site)
    checked = 0
    for label, text in listings():
        keys = printed_keys(text)
        for key, value in keys.items():
            rid = reference_id(key, keys)
            assert rid in cells, f"{label}: --print-config prints {key}, the reference has no {rid}"
            if label == "default" or key.startswith(("algo.", "task.")):  # the value a run of it resolves
                assert cells[rid] == value, f"{label}: {key} is {value!r}, the reference says {cells[rid]!r}"
            checked += 1
    assert checked > 500  # every algorithm's and task's keys, not a handful
    # a key's bounds beside its type, as --print-config prints them beside its description
    rows = re.findall(r"<tr>(.*?)</tr>", html_of(site, "reference/config"), flags=re.S)
    types = {re.search(r'id="([^"]+)"', r).group(1): text_of(re.findall(r"<td[^>]*>(.*?)</td>", r, flags=re.S)[1])
             for r in rows if re.search(r'id="([^"]+)"', r)}
    assert types["task.counting.test_size"] == "int, ≥ 100" and types["model.lora_dropout"] == "float, ≥ 0, < 1"


def test_the_reference_pages_are_generated_from_the_code(site):
    from rayseq.serving.app import api

    # the HTTP API: every route and every schema of the app's OpenAPI document
    text = text_of(html_of(site, "reference/http-api"))
    schema = api.openapi()
    for path, methods in schema["paths"].items():
        for method in methods:
            assert f"{method.upper()} {path}" in text
    for name, s in schema["components"]["schemas"].items():
        assert name in text and all(field in text for field in s.get("properties", {}))
    assert (site / "reference" / "openapi.json").is_file()
    # the command lines: each option its parser has
    cli = text_of(html_of(site, "reference/cli"))
    for module in ("rayseq.train", "rayseq.tune", "rayseq.serve", "rayseq.export", "rayseq.data"):
        r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120,
                           cwd=ROOT)
        assert r.returncode == 0, r.stderr
        options = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", r.stdout))
        assert options and options <= set(re.findall(r"(?<![\w-])--[a-z][\w-]*", cli)), (module, options)
    # an algorithm page's keys table is the algorithm's own keys
    grpo = text_of(html_of(site, "algorithms/grpo"))
    assert "algo.group_size" in grpo and "algo.dynamic_sampling" in grpo and "algo.alpha1" not in grpo
    # the Python API pages carry the docstrings
    assert "ppo_dynamic_loss" in text_of(html_of(site, "reference/python/losses"))


def test_results_pages_show_the_committed_reports_and_plots(site):
    results = ROOT / "benchmarks" / "results"
    findings = sorted([*results.glob("*_findings.md"), *results.glob("*/FINDINGS.md")])
    assert len(findings) >= 15
    for f in findings:
        rel = f.relative_to(results).with_suffix("")
        out = site / "results" / rel / "index.html"
        assert out.is_file(), f"{f} is not a page of the site"
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", f.read_text(encoding="utf-8")):
            assert (f.parent / image).is_file(), f"{f} shows a missing plot {image}"
            assert (site / "results" / rel.parent / image).is_file(), f"the site lacks {image} of {f}"


def test_the_readme_stays_short_and_lab_notes_stay_out():
    readme = page("README.md")
    assert len(readme.splitlines()) <= 300
    # the set-up commands, exactly, and CI runs the second
    assert "pip install -e . && python -m rayseq.train" in readme
    test_command = 'pip install -e ".[dev]" && python -m pytest -n 2 --dist loadscope'
    assert test_command in readme and test_command in (ROOT / ".ci" / "run").read_text()
    for rel in DOC_PAGES:
        text = page(rel)
        assert not re.search(r"\bissue \d+|\bsession\b", text, flags=re.I), f"{rel} speaks of the work log"


def test_links_in_the_readme_and_the_findings_lead_to_files_that_exist():
    """The README and the findings files are read on GitHub too, where their relative links are repository paths
    (the site build checks the docs pages' own links)."""
    results = ROOT / "benchmarks" / "results"
    files = [ROOT / "README.md", *results.glob("*_findings.md"), *results.glob("*/FINDINGS.md")]
    for f in files:
        for target in re.findall(r"\]\(([^)\s]+)\)", f.read_text(encoding="utf-8")):
            if re.match(r"^[a-z]+:|^#", target):
                continue
            path = (f.parent / target.partition("#")[0]).resolve()
            assert path.exists(), f"{f.relative_to(ROOT)} links {target}, which does not exist"


# ---------------------------------------------------------------------------------------------- the examples


def train_commands():
    """(page, argument list after ``rayseq.train``) of every training command in a bash block of the README and
    the docs."""
    for rel in DOC_PAGES:
        for lang, block in code_blocks(page(rel)):
            if lang != "bash":
                continue
            for args in commands(block):
                for name in ("rayseq.train", "rayseq-train"):
                    if name in args:
                        yield rel, args[args.index(name) + 1 :]


# What a command names that only a reader's machine has, and what stands in for it here.
PLACEHOLDERS = {"PATH/seqgan_oracle.npz": None, "runs/<name>": None}
# (the last two: a run, a model folder an earlier line made)
NEEDS_FILES = ("my_models:", "my_algo:", "math_rewards:", "my_env:", "my_shaped:", "--resume", "models/my-",
               "task.init_from=", "train.init_from=", "path: runs/", "models/tiny-")


def test_every_training_command_in_the_docs_is_a_valid_config(tmp_path, monkeypatch):
    """Each `python -m rayseq.train ...` line of the README and the docs passes the same checks as a run before it
    starts (keys, values, what the algorithm and the task accept, reward functions that import), via
    ``--print-config``. Lines that need files of the reader's (their reward module, a model folder, a run to
    resume) are run by the guides' own tests with those files made."""
    shutil.copy(ROOT / "examples" / "polite" / "my_reward.py", tmp_path / "my_reward.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(ROOT)  # --config tune_configs/... as written
    found = checked = 0
    for rel, args in train_commands():
        found += 1
        line = " ".join(args)
        if any(p in line for p in PLACEHOLDERS) or any(n in line for n in NEEDS_FILES):
            continue
        err = io.StringIO()
        with redirect_stdout(io.StringIO()), redirect_stderr(err):
            from rayseq.train import main

            rc = main([*args, "--print-config"])
        assert rc == 0, f"{rel}: python -m rayseq.train {line}\n{err.getvalue()}"
        checked += 1
    assert found >= 30 and checked >= 20, (found, checked)


def test_every_tune_command_in_the_docs_resolves_its_experiment(monkeypatch):
    """Each `python -m rayseq.tune FILE ...` line resolves its experiment (`--print-spec`: the run config, the search
    space, the scheduler, all checked); FILE.yaml stands for one of the shipped files."""
    from rayseq.tune import main

    monkeypatch.chdir(ROOT)
    checked = 0
    for rel in DOC_PAGES:
        for lang, block in code_blocks(page(rel)):
            for args in commands(block) if lang == "bash" else []:
                if "rayseq.tune" not in args or "--resume" in args or any("://" in a for a in args):
                    continue
                args = [a.replace("FILE.yaml", "tune_configs/counting_ppo_dynamic_search.yaml")
                        for a in args[args.index("rayseq.tune") + 1 :]]
                err = io.StringIO()
                with redirect_stdout(io.StringIO()), redirect_stderr(err):
                    rc = main([*args, "--print-spec"])
                assert rc == 0, f"{rel}: python -m rayseq.tune {' '.join(args)}\n{err.getvalue()}"
                checked += 1
    assert checked >= 4


def test_the_getting_started_tiny_run_trains_and_prints_its_table(tmp_path):
    """The tiny in-process run of docs/getting-started.md, as written but for its run directory."""
    block = next(b for lang, b in code_blocks(page("docs/getting-started.md")) if "train.pretrain_iters=50" in b)
    (args,) = commands(block)
    assert args[:3] == ["python", "-m", "rayseq.train"] and "rollout.num_workers=0" in args
    args = [a if not a.startswith("run_dir=") else f"run_dir={tmp_path / 'tiny'}" for a in args[3:]]
    r = subprocess.run([sys.executable, "-m", "rayseq.train", *args, "progress=false"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "MLE (pretrained)" in r.stdout and "precision (greedy)" in r.stdout
    # the first run's table, as the page shows it, has the rows this run of the same task and algorithm prints
    for rel in ("docs/getting-started.md", "README.md"):
        shown = next(b for lang, b in code_blocks(page(rel)) if "MLE (pretrained)" in b)
        assert table_rows(shown) == table_rows(r.stdout), rel
    # the files the pages list are the files the run wrote, by name
    run = tmp_path / "tiny"
    files = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
    listed = listed_files(page("docs/getting-started.md"), "## What a run leaves")
    assert [f for f in files if not any(names_file(n, f) for n in listed)] == []
    assert [n for n in listed if not any(names_file(n, f) for f in files)] == []
    ckpt = [f.removeprefix("checkpoints/") for f in files if f.startswith("checkpoints/")]
    listed = listed_files(page("docs/guides/failures.md"), "## What a checkpoint is, and who writes it")
    assert [f for f in ckpt if not any(names_file(n, f) for n in listed)] == []
    # what an HF policy and a sharded learner write instead: their own tests' run directories
    assert {n for n in listed if not any(names_file(n, f) for f in ckpt)} == {"ckpt_N.safetensors",
                                                                            "ckpt_N.learner/dcp/"}


def test_the_readme_reward_function_scores_as_it_says():
    (code,) = [b for lang, b in code_blocks(page("README.md")) if lang == "python" and "def polite" in b]
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["polite"](["a", "b", "c"], ["sure , thanks !", "here .", "cheers"], [[], [], []]) == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_installed_console_scripts_answer_help(script):
    exe = Path(sys.executable).parent / script
    exe = exe if exe.exists() else shutil.which(script)
    assert exe, f"{script} is not installed: pip install -e . installs it (pyproject.toml [project.scripts])"
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage: "), r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP (python -m http.server on a free port), as a reader would open it."""
    import httpx

    from tests.ports import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(url + "/").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_site_renders_navigates_and_searches_in_chromium(served):
    from tests.browser import chromium

    with chromium() as browser:
        page_ = browser.new_page(viewport={"width": 1280, "height": 900})
        failed, errors = [], []
        page_.on("response", lambda r: failed.append((r.status, r.url)) if r.status >= 400 else None)
        # a request cut short by the next navigation (net::ERR_ABORTED) is not a broken page
        page_.on("requestfailed", lambda r: None if "ERR_ABORTED" in (r.failure or "") else failed.append((0, r.url)))
        page_.on("pageerror", lambda e: errors.append(str(e)))

        page_.goto(served + "/")
        assert page_.title().startswith("rayseq")
        assert page_.text_content("article h1").replace("¶", "").strip() == "rayseq"
        assert page_.locator("nav.md-nav--primary").count() == 1

        # the navigation: the primary nav's link to the algorithms leads to that page, and on to one algorithm
        page_.click("nav.md-nav--primary a[href$='algorithms/']")
        page_.wait_for_url("**/algorithms/")
        assert page_.text_content("article h1").replace("¶", "").strip() == "Algorithms"
        page_.click("article a[href='ppo-dynamic/']")
        page_.wait_for_url("**/algorithms/ppo-dynamic/")
        assert "clip(ρ_t, 1 − β_t, 1 + α_t)" in page_.text_content("article")
        assert page_.locator("article table code", has_text="algo.alpha2").count() >= 1  # its generated keys table

        # a generated page renders its tables, with an anchor per key
        page_.goto(served + "/reference/config/#model.hidden_dim")
        assert page_.locator("[id='model.hidden_dim']").count() == 1
        assert page_.locator("article table").count() > 20

        # a results page shows its plot
        page_.goto(served + "/results/counting_findings/")
        img = page_.locator("article img").first
        img.wait_for()
        assert page_.evaluate("(el) => el.complete && el.naturalWidth > 100", img.element_handle())

        # search: the site's own index, in the browser (no server behind it)
        page_.goto(served + "/")
        page_.click("input.md-search__input")  # at this width the search field is in the header
        page_.fill("input.md-search__input", "discriminator")
        result = page_.locator(".md-search-result__item").first
        result.wait_for(timeout=20_000)
        assert "discriminator" in page_.text_content(".md-search-result").lower()
        page_.locator(".md-search-result__link").first.click()
        page_.wait_for_load_state()
        assert "discriminator" in page_.text_content("article").lower()

        assert errors == []
        assert failed == [], failed  # no missing asset, no request to anywhere else (the site works offline)
        page_.close()
