"""MkDocs hook: the pages generated from the code and the benchmark results at build time.

- ``reference/config.md``: every configuration key with its type, default and description, from the pydantic models
  that ``python -m rayseq.train --print-config`` prints (:func:`rayseq.config.described_yaml` reads the same fields):
  the run-level sections, then the ``algo.*`` keys of every built-in algorithm and the ``task.*`` keys of every task,
  each with the value a run of it resolves;
- ``reference/cli.md``: each command line's ``--help`` and the run book of its module docstring;
- ``reference/http-api.md`` and ``reference/openapi.json``: the serving app's OpenAPI schema
  (:data:`rayseq.serving.app.api`), route by route;
- ``results/**``: ``benchmarks/results/`` mirrored (reports, findings, plots, JSON), so that the results pages and the
  reports they link are the committed files themselves;
- ``<!-- rayseq:algo-keys NAME -->`` in a page becomes the table of the keys algorithm NAME reads, and
  ``<!-- rayseq:task-keys NAME -->`` the table of a task's.

Nothing here is hand-copied: a key, option or route added to the code appears on the next build.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import runpy
import sys
import textwrap
import types
import typing
from functools import cache
from pathlib import Path

import yaml
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
RUN_SECTIONS = ("model", "rollout", "scorer", "learner", "disc", "train", "reward", "env")
CLIS = (  # (title, module, argv for --help)
    ("python -m rayseq.train (rayseq-train)", "rayseq.train", ["--help"]),
    ("python -m rayseq.tune (rayseq-tune)", "rayseq.tune", ["--help"]),
    ("python -m rayseq.serve (rayseq-serve)", "rayseq.serve", ["--help"]),
    ("python -m rayseq.export (rayseq-export)", "rayseq.export", ["--help"]),
    ("python -m rayseq.data (rayseq-data)", "rayseq.data", ["--help"]),
    ("python -m rayseq.data prepare", "rayseq.data", ["prepare", "--help"]),
    ("python -m rayseq.data tiny-model", "rayseq.data", ["tiny-model", "--help"]),
)
MARKER = re.compile(r"<!--\s*rayseq:(algo|task)-keys\s+([\w.:]+)\s*-->")

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------------------------------------ the hook


def on_files(files, config):
    generated = {
        "reference/config.md": config_reference(),
        "reference/cli.md": cli_reference(),
        "reference/http-api.md": http_reference(),
        "reference/openapi.json": json.dumps(openapi_schema(), indent=2) + "\n",
    }
    for uri, content in generated.items():
        files.append(File.generated(config, uri, content=content))
    for path in result_files():
        files.append(File.generated(config, f"results/{path.relative_to(RESULTS).as_posix()}",
                                    abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    markdown = MARKER.sub(lambda m: keys_table(m.group(1), m.group(2)), markdown)
    return repoint_links(markdown, page.file.src_uri, Path(config["docs_dir"]))


ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|obj|exc):(?=<code)")


def on_page_content(html, page, config, files):
    """Docstrings cite code with Sphinx roles (``:func:`name```); on the site the code span alone says it."""
    return ROLE.sub("", html).replace("<code>~", "<code>")


LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def repoint_links(markdown: str, src_uri: str, docs_dir: Path) -> str:
    """Links written as they work in the repository (GitHub renders the findings files where they are) made to work in
    the site: a target inside ``docs/`` or ``benchmarks/results/`` becomes the relative path to its page; a link to
    another repository file (a script, a YAML file) becomes its text, the file's path in a code span."""
    real = RESULTS / src_uri.removeprefix("results/") if src_uri.startswith("results/") else docs_dir / src_uri
    here = (docs_dir / src_uri).parent

    def sub(m: re.Match) -> str:
        bang, text, target = m.groups()
        if re.match(r"^[a-z]+:|^#|^/", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        resolved = Path(os.path.normpath(real.parent / path))
        for root, prefix in ((docs_dir, ""), (RESULTS, "results")):
            try:
                rel = resolved.relative_to(root)
            except ValueError:
                continue
            new = os.path.relpath(docs_dir / prefix / rel, here).replace(os.sep, "/")
            return f"{bang}[{text}]({new}{'#' + anchor if anchor else ''})"
        try:
            shown = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            return m.group(0)
        return text if text.startswith("`") else f"{text} (`{shown}`)" if text != shown else f"`{shown}`"

    return LINK.sub(sub, markdown)


# ------------------------------------------------------------------------------------------------ formatting


def type_name(annotation) -> str:
    """``float``, ``int | None``, ``list[str]``, ``one of: PACK, SPREAD`` for a field's annotation."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of: " + ", ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def flow(value) -> str:
    """A value as ``--print-config`` prints it (YAML flow style)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True)
    return text.removesuffix("\n...\n").strip()


def cell(text: str) -> str:
    """Text for a Markdown table cell: ``|`` escaped, ``<`` and ``>`` escaped outside code spans."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", "\\|"))
        else:
            out.append(part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|"))
    return "".join(out)


def code_cell(text: str) -> str:
    """A value as a code span in a table cell (backticks doubled where the value has one)."""
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def key_rows(prefix: str, model, values: dict) -> list[str]:
    from pydantic import BaseModel

    from rayseq.config.overrides import value_range

    rows = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for key, value in values.items():
        field = type(model).model_fields.get(key)
        if field is None or isinstance(getattr(model, key, None), BaseModel):  # a section: its own table
            continue
        dotted = f"{prefix}.{key}" if prefix else key
        kind = type_name(field.annotation) + (f", {bounds}" if (bounds := value_range(field)) else "")
        rows.append(f'| <a id="{dotted}"></a>`{dotted}` | {cell(kind)} | '
                    f"{code_cell(flow(value))} | {cell(field.description or '')} |")
    return rows


# ------------------------------------------------------------------------------------------------ config keys


@cache
def default_config():
    from rayseq.config import build_config, config_to_dict

    cfg = build_config(None, [])
    return cfg, config_to_dict(cfg)


@cache
def section_config(section: str, name: str):
    """(config, its dict) of a run with ``<section>.name=name``: with the other defaults, else beside the first
    built-in that accepts it (an algorithm that needs references on chitchat; the oracle task with SeqGAN; the reward
    model with its preference pairs, which have no MLE stage)."""
    from rayseq.config import ConfigError, build_config, config_to_dict

    for other in ([], ["task.name=chitchat"], ["task.name=oracle"], ["algo.name=seqgan"], ["env.name=guess_number"],
                  ["task.name=preferences", "train.pretrain_iters=0"],
                  ["algo.name=reward_model", "train.pretrain_iters=0"]):
        if other and other[0].startswith(f"{section}."):  # the other section's choice only
            continue
        try:
            cfg = build_config(None, [f"{section}.name={name}", *other])
        except ConfigError:
            continue
        return cfg, config_to_dict(cfg)
    raise RuntimeError(f"no built-in combination accepts {section}.name={name}")


def keys_table(section: str, name: str, anchors: bool = False) -> str:
    """The table of the ``algo.*`` or ``task.*`` keys that algorithm or task ``name`` reads; ids
    ``<section>.<name>.<key>`` on the reference page, none on an algorithm's own page (the keys as a run names
    them)."""
    cfg, data = section_config(section, name)
    rows = key_rows(f"{section}.{name}" if anchors else section, getattr(cfg, section), data[section])
    if not anchors:
        rows = [re.sub(r'<a id="[^"]*"></a>', "", r) for r in rows]
    return "\n".join(rows) + "\n"


def config_reference() -> str:
    from rayseq.config import ALGOS, TASKS

    cfg, data = default_config()
    out = [
        "# Configuration keys",
        "",
        "Every key a run reads, with its type, its default and what it does, generated from the same typed "
        "declarations that `python -m rayseq.train --print-config` prints (see "
        "[Configuration](../concepts/configuration.md) for how files, overrides and per-algorithm keys combine). "
        "Keys are set as `key=value` on the command line, in an experiment file (`--config FILE`), or as a Tune "
        "search dimension. An unknown key, a bad value, or a key the chosen algorithm or task does not read stops "
        "the run before anything starts, naming the key.",
        "",
        "The defaults below are those of the default run (`task.name=counting`, `algo.name=ppo_dynamic`); the "
        "`algo.*` and `task.*` tables list each algorithm's and task's own keys with the values a run of it "
        "resolves (an algorithm's own defaults included).",
        "",
        "## Run",
        "",
        *key_rows("", cfg, {k: v for k, v in data.items() if not isinstance(v, dict)}),
        "",
    ]
    for section in RUN_SECTIONS:
        # a section the default run leaves out of its config (disc: SeqGAN's discriminator) from a run that has it
        src_cfg, src = next((c, d) for c, d in (default_config(), section_config("algo", "seqgan"),
                                                section_config("task", "env")) if section in d)
        model = getattr(src_cfg, section)
        doc = " ".join((type(model).__doc__ or "").split())
        if src is data:
            note = []
        elif section == "env":
            note = ["Read only by a run with `env.name` (its rollouts are episodes, its task `env`: "
                    "[Agents in environments](../guides/environments.md)); defaults as a `guess_number` run resolves "
                    "them.", ""]
        else:
            note = ["Read only by the algorithms that use it; defaults as a `seqgan` run resolves them.", ""]
        out += [f"## {section}", "", *([cell(doc), ""] if doc else []), *note,
                *key_rows(section, model, src[section]), ""]
    out += ["## algo", "",
            "`algo.name` picks the algorithm of the RL stage ([Algorithms](../algorithms/index.md)); each reads "
            "`name`, `lr` and `max_grad_norm` and the keys of its own below. In an experiment file shared by several "
            "algorithms, `algo: {grpo: {kl_coef: 0.02}}` sets a key for one algorithm only (its id below, "
            "`algo.grpo.kl_coef`).", ""]
    for name in ALGOS:
        out += [f"### {name}", "", keys_table("algo", name, anchors=True), ""]
    out += ["## task", "", "`task.name` picks the task: its data, reward and evaluation.", ""]
    for name in TASKS:
        out += [f"### {name}", "", keys_table("task", name, anchors=True), ""]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------ command lines


def help_text(module: str, argv: list[str]) -> str:
    """``python -m module *argv`` run in this process (its real parser), its standard output."""
    buf, old_argv, old_columns = io.StringIO(), sys.argv, os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "110"
    sys.argv = [module, *argv]
    try:
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.argv = old_argv
        if old_columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old_columns
    return buf.getvalue()


def run_book(module: str) -> str:
    import importlib

    mod = importlib.import_module(f"{module}.__main__" if module == "rayseq.data" else module)
    return textwrap.dedent(mod.__doc__ or "").strip()


def cli_reference() -> str:
    out = ["# Command lines", "",
           "Each command's `--help`, as its parser prints it, and the run book of its module. The installed console "
           "scripts are the same commands: `rayseq-train` is `python -m rayseq.train`, and so on.", ""]
    seen = set()
    for title, module, argv in CLIS:
        out += [f"## {title}", "", "```text", help_text(module, argv).rstrip(), "```", ""]
        if module not in seen:
            seen.add(module)
            out += ["Run book (the module's docstring):", "", "```text", run_book(module), "```", ""]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------ HTTP API


@cache
def openapi_schema() -> dict:
    from rayseq.serving.app import api

    return api.openapi()


def schema_type(s: dict, components: dict) -> str:
    if "$ref" in s:
        return s["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in s:
        return " | ".join(schema_type(x, components) for x in s["anyOf"])
    if "enum" in s:
        return "one of: " + ", ".join(json.dumps(v) for v in s["enum"])
    if "const" in s:
        return json.dumps(s["const"])
    t = s.get("type", "any")
    if t == "array":
        return f"array of {schema_type(s.get('items', {}), components)}"
    return "null" if t == "null" else t


def constraints(s: dict) -> str:
    names = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<",
             "minLength": "length ≥", "maxLength": "length ≤", "minItems": "items ≥", "maxItems": "items ≤"}
    found = [f"{sym} {s[k]}" for k, sym in names.items() if k in s]
    for alt in s.get("anyOf", []):
        found += [f"{sym} {alt[k]}" for k, sym in names.items() if k in alt]
    return ", ".join(found)


def model_table(name: str, components: dict) -> list[str]:
    s = components[name]
    out = [f"### {name}", ""]
    if s.get("description"):
        out += [cell(s["description"]), ""]
    required = set(s.get("required", []))
    out += ["| field | type | required | default | constraints | description |",
            "| --- | --- | --- | --- | --- | --- |"]
    for field, p in s.get("properties", {}).items():
        default = code_cell(json.dumps(p["default"])) if "default" in p else ""
        out.append(f"| `{field}` | {cell(schema_type(p, components))} | {'yes' if field in required else ''} | "
                   f"{default} | {cell(constraints(p))} | {cell(p.get('description', ''))} |")
    return out + [""]


def http_reference() -> str:
    schema = openapi_schema()
    components = schema.get("components", {}).get("schemas", {})
    out = ["# HTTP API", "",
           f"The routes of the serving app ({schema['info']['title']} {schema['info']['version']}), generated from "
           "its OpenAPI schema (`rayseq.serving.app`); a running server shows the same at `/docs`, and the schema "
           "itself is [openapi.json](openapi.json). How to start a server and what each parameter does: "
           "[Serve and the OpenAI API](../guides/serve.md).", "",
           "Every error is a 4xx or 5xx with the body `{\"error\": {\"message\", \"type\", \"param\"}}`. With an API "
           "key (`RAYSEQ_API_KEY` or `--api-key`) the `/v1/*` routes need `Authorization: Bearer KEY` or "
           "`X-API-Key: KEY`. `GET /` is the chat page.", "", "## Routes", ""]
    used = []
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            out += [f"### `{method.upper()} {path}`", ""]
            if op.get("description"):
                out += [cell(op["description"]), ""]
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                name = schema_type(body, components)
                used.append(name)
                out += [f"Request body: [`{name}`](#{name.lower()}).", ""]
            for status, resp in op.get("responses", {}).items():
                content = resp.get("content", {}).get("application/json", {}).get("schema")
                what = schema_type(content, components) if content else ""
                if what in components:
                    used.append(what)
                    what = f"[`{what}`](#{what.lower()})"
                out.append(f"- {status}: {resp.get('description', '')}" + (f" — {what}" if what and what != "any"
                                                                               else ""))
            out.append("")
    out += ["## Schemas", ""]
    for name in components:
        out += model_table(name, components)
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------ results


def result_files() -> list[Path]:
    """The committed kinds of files under benchmarks/results: reports, findings, plots, JSON; not the runs a
    benchmark leaves there or its ``*_quick*`` smoke outputs."""
    keep = {".md", ".png", ".json", ".svg", ".csv"}
    return sorted(p for p in RESULTS.rglob("*") if p.is_file() and p.suffix in keep and "_quick" not in p.name
                  and "runs" not in p.relative_to(RESULTS).parts)
