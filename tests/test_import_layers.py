"""Imports point down the layers and nothing imports in a circle (docs/concepts/index.md).

    entry points (train, tune, serve, __main__)
      -> tuning/, serving/, envs/
      -> distributed/
      -> algos/
      -> math: models/ losses/ rewards/ tasks/ data/
      -> foundations: config types checkpoint registry seeding storage runlog vocab

Every static import in ``rayseq/`` counts, at any depth: an import inside a function is how a cycle hides (it
works until someone moves it to the top). ``rayseq.registry`` resolves names to classes with importlib at run
time, deliberately not a static import, so the built-in algorithms and tasks it names are not edges: configs
validate names through it without importing torch-heavy modules.

A module may import any module of a lower layer, any module of its own package (subpackage of ``rayseq``, or
top-level module) as long as the modules form no cycle, and across packages of one layer only the edges listed in
:data:`SIDEWAYS`. :data:`FORBIDDEN` rules out downward edges the design excludes. A new package or top-level
module fails until it is given a layer in :data:`LAYERS`. The orchestration layer uses the algorithms only through
their generic protocols: of ``rayseq.algos`` it imports the package and :data:`GENERIC_ALGOS`, never one
algorithm's module (:func:`single_algorithm_imports`). The checker's own tests run it on small fake trees.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FOUNDATIONS, MATH, ALGOS, DISTRIBUTED, SERVICES, ENTRY = range(6)
LAYER_NAMES = ("foundations", "math", "algos", "distributed", "tuning/serving/envs", "entry points")

# package (a subpackage or a top-level module of rayseq) -> its layer; a module belongs to the longest key that
# is it or a parent of it
LAYERS = {
    "rayseq": FOUNDATIONS,  # the package's __init__: the version string
    "rayseq.config": FOUNDATIONS,
    "rayseq.types": FOUNDATIONS,
    "rayseq.checkpoint": FOUNDATIONS,
    "rayseq.registry": FOUNDATIONS,
    "rayseq.reward_protocol": FOUNDATIONS,  # the two reward-function protocols (rayseq's, TRL's): registry checks them
    "rayseq.seeding": FOUNDATIONS,
    "rayseq.storage": FOUNDATIONS,  # RunStore: run directories on local disk or pyarrow.fs URIs
    "rayseq.runlog": FOUNDATIONS,  # metrics.parquet and JSON of a run, written through storage
    "rayseq.vocab": FOUNDATIONS,
    "rayseq.models": MATH,
    "rayseq.losses": MATH,
    "rayseq.rewards": MATH,
    "rayseq.tasks": MATH,
    "rayseq.data": MATH,
    "rayseq.algos": ALGOS,
    # what rollout workers and serving sample with (the policy's own loop, vLLM): on the models, below their users
    "rayseq.engines": ALGOS,
    # episodes in environments: what rollout workers run for a run with env.name, and its task (beside the engines)
    "rayseq.episodes": ALGOS,
    "rayseq.distributed": DISTRIBUTED,
    "rayseq.tuning": SERVICES,
    "rayseq.serving": SERVICES,
    "rayseq.envs": SERVICES,  # Ray RLlib's side, as tuning/ is Tune's and serving/ Serve's: tasks as environments
    "rayseq.train": ENTRY,
    "rayseq.tune": ENTRY,
    "rayseq.serve": ENTRY,
    "rayseq.export": ENTRY,  # python -m rayseq.export: a trained policy as a Hugging Face / safetensors folder
    "rayseq.data.__main__": ENTRY,  # python -m rayseq.data
}

# the only imports between different packages of one layer (importer, imported)
SIDEWAYS = {
    ("rayseq.checkpoint", "rayseq.storage"),  # checkpoints are written through RunStore
    ("rayseq.checkpoint", "rayseq.config"),  # train.init_from compares configs as this version reads them
    ("rayseq.checkpoint", "rayseq.registry"),  # ... and asks the algorithm which of its own keys shape its weights
    ("rayseq.runlog", "rayseq.storage"),
    ("rayseq.config", "rayseq.registry"),  # configs validate algorithm, task and reward names
    ("rayseq.registry", "rayseq.reward_protocol"),  # reward functions are checked against their protocol
    ("rayseq.tasks", "rayseq.data"),  # pairs/chitchat read prepared datasets, tokenize, detokenize
    ("rayseq.tasks", "rayseq.models"),  # the oracle task samples its oracle LSTM
    ("rayseq.tasks", "rayseq.rewards"),  # task rewards, BLEU, the configured reward
    ("rayseq.rewards", "rayseq.data"),  # rewards on text: tokenize, detokenize
    ("rayseq.rewards", "rayseq.models"),  # Monte-Carlo search runs the generator's decoder
    ("rayseq.episodes", "rayseq.algos"),  # the episode sampler is a rollout sampler (algos/sampling.py's protocol)
    ("rayseq.episodes", "rayseq.engines"),  # evaluation plays episodes with the policy's own decoding loop
}

# downward imports the layers would allow but the design excludes (importer, imported): serving loads a checkpoint
# read-only (models, vocab, tokenisation), never the training machinery
FORBIDDEN = {("rayseq.serving", p) for p in ("rayseq.distributed", "rayseq.algos", "rayseq.tasks", "rayseq.rewards",
                                             "rayseq.losses")}

# the modules of rayseq.algos that name no single algorithm: what rayseq.distributed may import of the algorithms (with
# the package itself, whose make_algo builds the configured one); one algorithm's module is reached only through them
GENERIC_ALGOS = {"rayseq.algos.common", "rayseq.algos.iteration", "rayseq.algos.parallel", "rayseq.algos.regularizers",
                 "rayseq.algos.reward_refresh",  # a refreshed reward model, whatever the algorithm
                 "rayseq.algos.sampling"}


def module_name(path: Path, root: Path) -> str:
    """``root/rayseq/data/__init__.py`` -> ``rayseq.data``; ``root/rayseq/train.py`` -> ``rayseq.train``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def static_imports(root: Path, package: str = "rayseq") -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports statically, at any depth of its source (inside functions,
    under ``if TYPE_CHECKING``). ``from p import name`` is an edge to ``p.name`` when that is a module, else to
    ``p``; relative imports are resolved; an import of a name that is no module lands on its nearest parent."""
    files = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    modules = set(files)

    def known(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    graph = {}
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            edges |= {known(t) for t in targets if t == package or t.startswith(package + ".")}
        graph[mod] = edges - {mod}
    return graph


def package_of(module: str, layers: dict[str, int]) -> str | None:
    """The longest key of ``layers`` that is ``module`` or a parent of it (None: the module has no layer). The top
    package's key (``rayseq``) is its ``__init__`` only: a new top-level module must be given its own layer."""
    keys = [k for k in layers if module == k or ("." in k and module.startswith(k + "."))]
    return max(keys, key=len) if keys else None


def violations(graph: dict[str, set[str]], layers: dict[str, int], sideways=frozenset(), forbidden=frozenset(),
               names=LAYER_NAMES) -> list[str]:
    """Every import that does not point down (or sideways as allowed), and every module without a layer."""
    found = []
    for mod in sorted(graph):
        a = package_of(mod, layers)
        if a is None:
            found.append(f"{mod}: no layer (add its package to LAYERS)")
            continue
        for dep in sorted(graph[mod]):
            b = package_of(dep, layers)
            if b is None or a == b:
                continue  # dep's own "no layer" is reported as a module; within a package only cycles matter
            la, lb = layers[a], layers[b]
            if (a, b) in forbidden:
                found.append(f"{mod} imports {dep}: {a} must never import {b}")
            elif la < lb:
                found.append(f"{mod} imports {dep}: {names[la]} ({a}) must not import {names[lb]} ({b})")
            elif la == lb and (a, b) not in sideways:
                found.append(f"{mod} imports {dep}: {a} -> {b} is not an allowed edge within {names[la]}")
    return found


def single_algorithm_imports(graph: dict[str, set[str]], importer: str = "rayseq.distributed",
                             algos: str = "rayseq.algos", generic=frozenset(GENERIC_ALGOS)) -> list[str]:
    """Every import by ``importer`` (a package: it and its modules) of a module of ``algos`` other than the package
    itself and its ``generic`` modules (or their submodules)."""
    found = []
    for mod in sorted(graph):
        if mod != importer and not mod.startswith(importer + "."):
            continue
        for dep in sorted(graph[mod]):
            if dep.startswith(algos + ".") and not any(dep == g or dep.startswith(g + ".") for g in generic):
                found.append(f"{mod} imports {dep}: {importer} uses {algos} only through its generic modules")
    return found


def package_graph(graph: dict[str, set[str]], layers: dict[str, int]) -> dict[str, set[str]]:
    """The module graph collapsed onto packages (keys of ``layers``), without self edges."""
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        a = package_of(mod, layers) or mod
        out.setdefault(a, set())
        out[a] |= {b for d in deps if (b := package_of(d, layers) or d) != a}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted: every import cycle."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


# -- the real package -----------------------------------------------------------------------------------------


def test_the_scan_sees_the_package():
    graph = static_imports(ROOT)
    assert len(graph) >= 70 and "rayseq.data.__main__" in graph
    assert "rayseq.algos" in graph["rayseq.distributed.driver.trainer"]
    assert "rayseq.checkpoint" in graph["rayseq.distributed.actors.learner"]  # imported inside a function
    assert "rayseq.data.preparation" in graph["rayseq.tasks.pairs"]  # top level and inside a function
    assert not any(m.startswith(("rayseq.algos.", "rayseq.tasks.")) for m in graph["rayseq.registry"])


def test_imports_point_down_the_layers():
    assert violations(static_imports(ROOT), LAYERS, SIDEWAYS, FORBIDDEN) == []


def test_the_orchestration_imports_no_single_algorithm():
    """rayseq.distributed reaches an algorithm through its generic protocols only (the rollout path and the learner
    ask the algorithm, they do not name it); every generic module named is one that exists."""
    graph = static_imports(ROOT)
    assert GENERIC_ALGOS <= set(graph)
    assert single_algorithm_imports(graph) == []


def test_no_import_cycles_between_modules():
    assert cycles(static_imports(ROOT)) == []


def test_no_import_cycles_between_packages():
    assert cycles(package_graph(static_imports(ROOT), LAYERS)) == []


def test_every_sideways_edge_is_used():
    """An allowed edge nobody uses is a stale rule: delete it, so that the table says what the code does."""
    used = {(a, b) for a, deps in package_graph(static_imports(ROOT), LAYERS).items() for b in deps}
    assert SIDEWAYS - used == set()


# -- the checker on fake trees --------------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, src in {"pkg/__init__.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src))
    return tmp_path


FAKE_LAYERS = {"pkg": 0, "pkg.base": 0, "pkg.math": 1, "pkg.other": 1, "pkg.algos": 2, "pkg.cli": 3}


def test_checker_reads_every_kind_of_import(tmp_path):
    root = _tree(tmp_path, {
        "pkg/base.py": "import os\n",
        "pkg/math/__init__.py": "from pkg.math.ops import f\n",
        "pkg/math/ops.py": "from . import helpers\nfrom .helpers import g\nfrom ..base import X\n",
        "pkg/math/helpers.py": "def g():\n    import pkg.algos.run\n",  # inside a function
        "pkg/algos/__init__.py": "",
        "pkg/algos/run.py": "from pkg.math import f, ops\nimportlib.import_module('pkg.cli')\n",  # a string: no edge
        "pkg/cli.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import base\n",
    })
    graph = static_imports(root, "pkg")
    assert graph == {
        "pkg": set(),
        "pkg.base": set(),
        "pkg.math": {"pkg.math.ops"},
        "pkg.math.ops": {"pkg.math.helpers", "pkg.base"},
        "pkg.math.helpers": {"pkg.algos.run"},
        "pkg.algos": set(),
        "pkg.algos.run": {"pkg.math", "pkg.math.ops"},
        "pkg.cli": {"pkg.base"},
    }


def test_checker_reports_upward_sideways_forbidden_and_unplaced_imports(tmp_path):
    root = _tree(tmp_path, {
        "pkg/base.py": "from pkg.math import x\n",  # up
        "pkg/math.py": "def f():\n    from pkg import other\n",  # sideways, not allowed
        "pkg/other.py": "from pkg.base import y\n",  # down: fine
        "pkg/algos.py": "import pkg.other\n",  # down, but forbidden below
        "pkg/cli.py": "import pkg.algos, pkg.base, pkg.math\n",  # down: fine
        "pkg/stray.py": "import pkg.base\n",  # no layer
    })
    graph = static_imports(root, "pkg")
    assert violations(graph, FAKE_LAYERS, forbidden={("pkg.algos", "pkg.other")}, names=("f", "m", "a", "e")) == [
        "pkg.algos imports pkg.other: pkg.algos must never import pkg.other",
        "pkg.base imports pkg.math: f (pkg.base) must not import m (pkg.math)",
        "pkg.math imports pkg.other: pkg.math -> pkg.other is not an allowed edge within m",
        "pkg.stray: no layer (add its package to LAYERS)",
    ]
    # the same tree with the sideways edge allowed and nothing forbidden: the other two remain
    allowed = violations(graph, FAKE_LAYERS, sideways={("pkg.math", "pkg.other")}, names=("f", "m", "a", "e"))
    assert allowed == [
        "pkg.base imports pkg.math: f (pkg.base) must not import m (pkg.math)",
        "pkg.stray: no layer (add its package to LAYERS)",
    ]


def test_checker_finds_cycles_between_modules_and_between_packages(tmp_path):
    root = _tree(tmp_path, {
        "pkg/base.py": "",
        "pkg/algos/__init__.py": "",
        "pkg/algos/a.py": "from pkg.algos import b\n",
        "pkg/algos/b.py": "def late():\n    from pkg.algos.a import thing\n",  # the cycle hides in a function
        "pkg/algos/c.py": "import pkg.algos.a\n",  # imports into the cycle, is not part of it
        "pkg/math.py": "import pkg.other\n",
        "pkg/other.py": "def f():\n    import pkg.math\n",
    })
    graph = static_imports(root, "pkg")
    assert cycles(graph) == [["pkg.algos.a", "pkg.algos.b"], ["pkg.math", "pkg.other"]]
    assert cycles(package_graph(graph, FAKE_LAYERS)) == [["pkg.math", "pkg.other"]]  # within algos: modules only
    # both directions allowed sideways: no layer violation, and still a cycle
    both = {("pkg.math", "pkg.other"), ("pkg.other", "pkg.math")}
    assert violations(graph, FAKE_LAYERS, sideways=both) == []
    assert cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []


def test_checker_finds_single_algorithm_imports_of_the_orchestration(tmp_path):
    root = _tree(tmp_path, {
        "pkg/algos/__init__.py": "from pkg.algos.one import One\n",
        "pkg/algos/common.py": "",
        "pkg/algos/one.py": "from pkg.algos.common import x\n",
        "pkg/algos/two/__init__.py": "",
        "pkg/algos/two/part.py": "",
        "pkg/dist/__init__.py": "from pkg.algos import One\n",  # the package: fine
        "pkg/dist/worker.py": "from pkg.algos.common import x\ndef f():\n    from pkg.algos.one import y\n",
        "pkg/dist/group.py": "import pkg.algos.two.part\n",  # a module inside one algorithm's package
        "pkg/math.py": "from pkg.algos.one import z\n",  # not the importer the rule is about
    })
    graph = static_imports(root, "pkg")
    found = single_algorithm_imports(graph, "pkg.dist", "pkg.algos", {"pkg.algos.common"})
    assert found == [
        "pkg.dist.group imports pkg.algos.two.part: pkg.dist uses pkg.algos only through its generic modules",
        "pkg.dist.worker imports pkg.algos.one: pkg.dist uses pkg.algos only through its generic modules",
    ]
    # the same tree with every algorithm module declared generic: nothing
    assert single_algorithm_imports(graph, "pkg.dist", "pkg.algos", {"pkg.algos.common", "pkg.algos.one",
                                                                     "pkg.algos.two"}) == []
