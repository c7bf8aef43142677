"""Static checks of the deployment files: cluster/ (Ray cluster launcher, KubeRay, runtime_env), docker/, .dockerignore.

Fast and offline: no docker engine, no cloud, no Kubernetes API, no Ray runtime is started. What can be
checked without them is checked against the real thing where it is installed — Ray's own launcher schema
and ``validate_config``, Ray's runtime_env fields and working_dir packer, rayseq's own CLI parser and
config validation — and against the repository (files, modules, versions in pyproject.toml). Contracts only:
what Ray, Kubernetes or Docker would reject or get wrong; the wording of the headers and literal tags are the
files' own business.
"""

from __future__ import annotations

import ast
import copy
import importlib.metadata
import importlib.util
import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "cluster"
DOCKER = REPO / "docker"
LAUNCHER_CONFIGS = ["cluster/aws.yaml", "cluster/gcp.yaml"]
RAYJOB = "cluster/kuberay-rayjob.yaml"
RAYSERVICE = "cluster/kuberay-rayservice.yaml"
RUNTIME_ENV = "cluster/runtime_env.yaml"
DOCKERFILES = {"docker/Dockerfile": "cpu", "docker/Dockerfile.gpu": "gpu"}
IMAGE_DIR = "/home/ray/rayseq"  # where the cluster configs and the images put the repository


# ----------------------------------------------------------------------------------------------- helpers


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _dependency_spec(name: str) -> SpecifierSet:
    for dep in _pyproject()["project"]["dependencies"]:
        m = re.fullmatch(rf"{name}(\[[^\]]*\])?\s*(.*)", dep.strip())
        if m:
            return SpecifierSet(m.group(2))
    raise AssertionError(f"pyproject.toml has no dependency {name}")


def _ray_version() -> str:
    return importlib.metadata.version("ray")


def _ray_package_dir() -> Path:
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.submodule_search_locations, "ray is not installed"
    return Path(next(iter(spec.submodule_search_locations)))


def _load(rel: str) -> dict:
    return yaml.safe_load((REPO / rel).read_text())


def _docs(rel: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((REPO / rel).read_text()) if d is not None]


def _one(rel: str, kind: str) -> dict:
    docs = [d for d in _docs(rel) if d.get("kind") == kind]
    assert len(docs) == 1, f"{rel}: expected one {kind}, found {len(docs)}"
    return docs[0]


def _deploy_files() -> list[Path]:
    files = [p for d in (CLUSTER, DOCKER) for p in sorted(d.rglob("*")) if p.is_file()]
    return files + [REPO / ".dockerignore"]


def _command_text(path: Path) -> str:
    """The file's text with comment markers removed and backslash continuations joined."""
    lines = [line.strip().lstrip("#").strip() for line in path.read_text().splitlines()]
    return re.sub(r"\\\n\s*", " ", "\n".join(lines))


def _check_module(module: str) -> None:
    """The module exists in this repository (not merely somewhere on sys.path)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"module {module} not found"
    assert spec.origin and Path(spec.origin).resolve().is_relative_to(REPO), (
        f"{module} resolves to {spec.origin}, outside the repository {REPO}"
    )


def _repo_path(p: str) -> Path:
    """A path as a deployment file writes it (repo-relative, or under the image's copy) in this checkout."""
    if p == IMAGE_DIR or p.startswith(IMAGE_DIR + "/"):
        p = p[len(IMAGE_DIR) :].lstrip("/") or "."
    return REPO / p


# ------------------------------------------------------------------------------------ Dockerfile parser


@dataclass(frozen=True)
class Instruction:
    cmd: str  # upper case
    value: str  # the rest of the instruction, continuations joined
    line: int

    @property
    def exec_form(self) -> list[str]:
        """JSON (exec) form arguments, [] when the instruction is in shell form."""
        try:
            value = json.loads(self.value)
        except json.JSONDecodeError:
            return []
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else []


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions of a Dockerfile: comments and blank lines dropped, backslash continuations joined
    (comment lines inside a continuation are skipped, as Docker does)."""
    out: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not parts and (not line or line.startswith("#")):
            continue
        if parts and line.startswith("#"):
            continue
        if not parts:
            start = n
        if line.endswith("\\"):
            parts.append(line[:-1].strip())
            continue
        parts.append(line)
        joined = " ".join(p for p in parts if p)
        parts = []
        cmd, _, value = joined.partition(" ")
        out.append(Instruction(cmd.upper(), value.strip(), start))
    assert not parts, "Dockerfile ends inside a line continuation"
    return out


# ------------------------------------------------------------------- python -m commands in the deploy files

_PY_M = re.compile(r"\bpython3?\s+-m\s+([A-Za-z_][\w.]*)([^\n]*)")
_CUT = re.compile(r"`|&&|;|\||#|\)|\"|'")


@dataclass(frozen=True)
class PyCommand:
    source: str
    module: str
    args: tuple[str, ...] | None  # None: not checkable offline (shell variables, placeholders)


def _python_m_commands() -> list[PyCommand]:
    found = []
    for path in _deploy_files():
        rel = str(path.relative_to(REPO))
        text = _command_text(path)
        for m in _PY_M.finditer(text):
            rest = _CUT.split(m.group(2), maxsplit=1)[0]
            args = tuple(shlex.split(rest))
            if any("$" in a or "<" in a or "REGISTRY" in a for a in args):
                args = None
            found.append(PyCommand(rel, m.group(1), args))
        if path.name.startswith("Dockerfile"):
            for ins in parse_dockerfile(path.read_text()):
                if ins.cmd in ("CMD", "ENTRYPOINT") and ins.exec_form[:2] == ["python", "-m"]:
                    found.append(PyCommand(rel, ins.exec_form[2], tuple(ins.exec_form[3:])))
    return found


def test_deploy_files_reference_the_training_entry_point():
    modules = {c.module for c in _python_m_commands()}
    assert "rayseq.train" in modules, f"no `python -m rayseq.train` in cluster/ or docker/ (found {sorted(modules)})"


@pytest.mark.parametrize("module", sorted({c.module for c in _python_m_commands()}))
def test_python_m_modules_exist_in_repo(module):
    _check_module(module)


def _train_commands():
    return [c for c in _python_m_commands() if c.module == "rayseq.train" and c.args is not None]


@pytest.mark.parametrize("command", _train_commands(), ids=lambda c: f"{c.source}:{' '.join(c.args)[:60]}")
def test_train_commands_are_valid_rayseq_configs(command):
    """Every `python -m rayseq.train ...` in the deploy files parses and resolves to a valid run config."""
    from rayseq.config import ConfigError
    from rayseq.train import load_config, parse_args

    try:
        args = parse_args(list(command.args))
    except SystemExit as exc:  # argparse rejected the arguments
        pytest.fail(f"{command.source}: python -m rayseq.train {' '.join(command.args)}: bad arguments ({exc})")
    config = None
    if args.config:
        path = _repo_path(args.config)
        assert path.is_file(), f"{command.source}: --config {args.config} does not exist in the repository"
        config = str(path)
    try:
        load_config(config, args.overrides)
    except ConfigError as exc:
        pytest.fail(f"{command.source}: {' '.join(command.args)}: {exc}")


_PATH_REFS = [
    re.compile(r"--config[ =](\S+)"),
    re.compile(r"--runtime-env[ =](\S+)"),
    re.compile(r"(?:docker build|kubectl apply|kubectl delete)\b[^\n]*?\s-f\s+(\S+)"),
    re.compile(r"\bray (?:up|down|attach|dashboard|exec|rsync-up|rsync-down|get-head-ip|monitor)\s+(?:-y\s+)?(\S+)"),
]


def _path_references(patterns=tuple(_PATH_REFS)) -> list[tuple[str, str]]:
    refs = []
    for path in _deploy_files():
        text = _command_text(path)
        for rx in patterns:
            for m in rx.finditer(text):
                ref = m.group(1).strip("\"'`,")
                if ref.startswith(("~", "$", "-", "/")) or "REGISTRY" in ref:
                    continue
                if "/" not in ref and not re.search(r"\.(ya?ml|toml|py)$", ref):
                    continue  # prose ("ray up stops with ..."), not a path
                refs.append((str(path.relative_to(REPO)), ref))
    return refs


@pytest.mark.parametrize("rx", _PATH_REFS, ids=["--config", "--runtime-env", "-f", "ray-cli"])
def test_path_reference_patterns_find_commands(rx):
    """Each kind of command (--config, --runtime-env, docker build/kubectl -f, ray up ...) is found in the files,
    so that the check below really covers it."""
    assert _path_references([rx]), f"no command in cluster/ or docker/ matches {rx.pattern}"


@pytest.mark.parametrize("source,ref", _path_references(), ids=lambda x: x)
def test_referenced_paths_exist_in_repo(source, ref):
    assert _repo_path(ref).exists(), f"{source} references {ref}, which does not exist in the repository"


# --------------------------------------------------------------------------------------------- all YAML


@pytest.mark.parametrize("rel", sorted(str(p.relative_to(REPO)) for p in CLUSTER.rglob("*.y*ml")))
def test_cluster_yaml_parses(rel):
    docs = _docs(rel)
    assert docs, f"{rel} is empty"
    for doc in docs:
        assert isinstance(doc, dict) and doc, f"{rel}: every document must be a non-empty mapping"


def test_expected_cluster_files_present():
    for rel in [*LAUNCHER_CONFIGS, RAYJOB, RAYSERVICE, RUNTIME_ENV]:
        assert (REPO / rel).is_file(), f"{rel} is missing"


# ---------------------------------------------------------------------------------- Ray cluster launcher


@pytest.fixture(scope="module")
def launcher_schema() -> dict:
    return json.loads((_ray_package_dir() / "autoscaler" / "ray-schema.json").read_text())


@pytest.mark.parametrize("rel", LAUNCHER_CONFIGS)
def test_launcher_config_matches_ray_schema(rel, launcher_schema):
    import jsonschema

    jsonschema.validate(_load(rel), launcher_schema)
    # the schema is strict (additionalProperties: false), so a misspelt field is caught — check it is
    bad = _load(rel)
    bad["setup_command"] = bad.pop("setup_commands")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, launcher_schema)


@pytest.mark.parametrize("rel", LAUNCHER_CONFIGS)
def test_launcher_config_passes_ray_validate_config(rel):
    """What `ray up` runs before it contacts the cloud: fill in the provider defaults, then validate."""
    try:
        from ray.autoscaler._private.util import prepare_config, validate_config
    except ImportError as exc:
        pytest.skip(f"ray.autoscaler._private.util not importable in this Ray ({exc})")
    config = prepare_config(copy.deepcopy(_load(rel)))
    validate_config(config)  # raises on an invalid config
    assert config["provider"]["type"] in ("aws", "gcp")
    assert config["head_node_type"] in config["available_node_types"]


_AWS_INSTANCES = {  # vCPU, GPUs
    "m5.large": (2, 0),
    "m5.xlarge": (4, 0),
    "m5.2xlarge": (8, 0),
    "g5.xlarge": (4, 1),
    "g5.2xlarge": (8, 1),
    "g4dn.xlarge": (4, 1),
    "g4dn.2xlarge": (8, 1),
}


def _machine(provider: str, node_config: dict) -> tuple[int, int] | None:
    if provider == "aws":
        return _AWS_INSTANCES.get(node_config.get("InstanceType", ""))
    m = re.fullmatch(r"[a-z0-9]+-(?:standard|highmem|highcpu)-(\d+)", node_config.get("machineType", ""))
    if not m:
        return None
    gpus = sum(a.get("acceleratorCount", 0) for a in node_config.get("guestAccelerators", []))
    return int(m.group(1)), gpus


@pytest.mark.parametrize("rel", LAUNCHER_CONFIGS)
def test_launcher_node_types(rel):
    cfg = _load(rel)
    provider = cfg["provider"]["type"]
    types = cfg["available_node_types"]
    head = cfg["head_node_type"]
    assert head in types
    assert types[head]["resources"].get("GPU", 0) == 0, "the head node is the CPU node"
    gpu_types = [name for name, t in types.items() if name != head and t["resources"].get("GPU", 0) >= 1]
    assert gpu_types, f"{rel}: no GPU worker node type"
    for name in gpu_types:
        assert types[name].get("min_workers", 0) == 0, f"{name}: GPU workers must scale from zero"
        assert types[name].get("max_workers", cfg["max_workers"]) <= cfg["max_workers"]
    assert cfg["idle_timeout_minutes"] > 0
    for name, t in types.items():
        machine = _machine(provider, t["node_config"])
        if machine is not None:  # declared resources must be what the machine has
            cpus, gpus = machine
            assert t["resources"].get("CPU", cpus) == cpus, f"{name}: CPU resource differs from the machine"
            assert t["resources"].get("GPU", 0) == gpus, f"{name}: GPU resource differs from the machine"
        if provider == "gcp" and t["node_config"].get("guestAccelerators"):
            scheduling = {k: v for item in (t["node_config"].get("scheduling") or []) for k, v in item.items()}
            assert scheduling.get("onHostMaintenance") == "TERMINATE", f"{name}: GPU VMs must TERMINATE"


_RAY_IMAGE = re.compile(r"rayproject/ray:(\d+\.\d+\.\d+)-(py\d+)-(cpu|gpu)")


def test_rayproject_images_pinned_to_installed_ray():
    """A cluster runs the Ray the project pins (the client and the cluster must run one Ray version)."""
    version = _ray_version()
    assert Version(version) in _dependency_spec("ray"), f"installed ray {version} outside pyproject's range"
    seen = []
    for path in _deploy_files():
        for m in _RAY_IMAGE.finditer(path.read_text()):
            seen.append(m.group(0))
            assert m.group(1) == version, f"{path.name}: {m.group(0)} is not Ray {version}"
    assert seen, "no rayproject/ray image referenced"


@pytest.mark.parametrize("rel", LAUNCHER_CONFIGS)
def test_launcher_gpu_workers_get_the_gpu_image(rel):
    """GPU worker nodes run a CUDA (-gpu) image; the CPU head a -cpu one."""
    docker = _load(rel)["docker"]
    head, worker = _RAY_IMAGE.fullmatch(docker["head_image"]), _RAY_IMAGE.fullmatch(docker["worker_image"])
    assert head and worker, f"{rel}: head and worker images must be rayproject/ray images"
    assert (head.group(3), worker.group(3)) == ("cpu", "gpu"), f"{rel}: the GPU workers need the -gpu image"


def _torch_pins(text: str) -> list[str]:
    return re.findall(r"torch==([\w.+]+)", text)


@pytest.mark.parametrize("rel", LAUNCHER_CONFIGS)
def test_launcher_syncs_and_installs_the_repo(rel):
    cfg = _load(rel)
    mounts = cfg["file_mounts"]
    assert mounts.get(IMAGE_DIR) == ".", f"{rel}: file_mounts must sync the repository (.) to {IMAGE_DIR}"
    setup = "\n".join(cfg["setup_commands"])
    installs = re.findall(r"pip install(?: -q)? -e (\S+)", setup)
    assert installs, f"{rel}: setup_commands do not pip install -e the package"
    for target in installs:
        assert mounts.get(target) == ".", f"{rel}: installs {target}, which file_mounts does not sync"
    assert (REPO / "pyproject.toml").is_file()  # "." is an installable project when run from the root
    pins = _torch_pins(setup)
    assert pins, f"{rel}: torch is not pinned before `pip install -e` (would pull the newest CUDA build)"
    for pin in pins:
        assert Version(pin) in _dependency_spec("torch"), f"{rel}: torch=={pin} outside pyproject's range"
    assert "download.pytorch.org/whl/cpu" in setup, f"{rel}: the CPU head needs the CPU torch wheel"
    assert setup.index("torch==") < setup.index("pip install -q -e"), "torch must be installed first"


@pytest.mark.parametrize("rel", LAUNCHER_CONFIGS)
def test_launcher_start_commands_and_token_auth(rel):
    cfg = _load(rel)
    head, worker = cfg["head_start_ray_commands"], cfg["worker_start_ray_commands"]
    assert head[0] == "ray stop" and worker[0] == "ray stop"
    head_start = next(c for c in head if "ray start" in c)
    worker_start = next(c for c in worker if "ray start" in c)
    for flag in ("--head", "--port=6379", "--autoscaling-config=~/ray_bootstrap_config.yaml"):
        assert flag in head_start.split(), f"{rel}: head start lacks {flag}"
    assert "--address=$RAY_HEAD_IP:6379" in worker_start.split()
    for cmd in (head_start, worker_start):
        assert "RAY_AUTH_MODE=token" in cmd, f"{rel}: ray start without token authentication"
    token_mounts = [remote for remote, local in cfg["file_mounts"].items() if local == "~/.ray/auth_token"]
    assert token_mounts == ["/home/ray/.ray/auth_token"], f"{rel}: the local token must be mounted for ray start"


# ------------------------------------------------------------------------------------------------ KubeRay

_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?")
_SCALE = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_SCALE.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40})
_RAYSEQ_IMAGE = re.compile(r"(?:[^\s/]+/)*rayseq:(\d+\.\d+\.\d+)-(cpu|gpu)")


def _quantity(value) -> float:
    m = _QUANTITY.fullmatch(str(value))
    assert m, f"not a Kubernetes quantity: {value!r}"
    return float(m.group(1)) * _SCALE[m.group(2)]


@pytest.mark.parametrize("rel", [RAYJOB, RAYSERVICE])
def test_kuberay_documents(rel):
    expected = {"RayJob": "ray.io/v1", "RayService": "ray.io/v1", "PersistentVolumeClaim": "v1"}
    kinds = []
    for doc in _docs(rel):
        assert doc.get("kind") in expected, f"{rel}: unexpected kind {doc.get('kind')}"
        assert doc.get("apiVersion") == expected[doc["kind"]], f"{rel}: {doc['kind']} apiVersion"
        name = doc.get("metadata", {}).get("name", "")
        assert _DNS1123.fullmatch(name) and len(name) <= 63, f"{rel}: bad metadata.name {name!r}"
        assert isinstance(doc.get("spec"), dict)
        kinds.append(doc["kind"])
    assert ("RayJob" if rel == RAYJOB else "RayService") in kinds


def _cluster_specs() -> list[tuple[str, dict]]:
    return [
        (RAYJOB, _one(RAYJOB, "RayJob")["spec"]["rayClusterSpec"]),
        (RAYSERVICE, _one(RAYSERVICE, "RayService")["spec"]["rayClusterConfig"]),
    ]


def _groups(spec: dict) -> list[tuple[str, dict]]:
    return [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec.get("workerGroupSpecs", [])]


def _gpus(container: dict) -> float:
    return _quantity(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))


@pytest.mark.parametrize("rel,spec", _cluster_specs(), ids=[RAYJOB, RAYSERVICE])
def test_ray_cluster_spec(rel, spec):
    assert spec.get("rayVersion") == _ray_version(), f"{rel}: rayVersion is not the installed Ray"
    assert spec.get("authOptions", {}).get("mode") == "token", f"{rel}: token authentication not enabled"
    assert "headGroupSpec" in spec and spec.get("workerGroupSpecs"), f"{rel}: needs a head and worker groups"
    names = [name for name, _ in _groups(spec)]
    assert len(names) == len(set(names)), f"{rel}: duplicate groupName"
    for name, group in _groups(spec):
        params = group["rayStartParams"]
        assert isinstance(params, dict)
        for key, value in params.items():  # map[string]string in the CRD: 0 or true would be rejected
            assert isinstance(value, str), f"{rel} {name}: rayStartParams.{key} must be a string"
        if name != "head":
            lo, hi = group["minReplicas"], group["maxReplicas"]
            assert 0 <= lo <= group.get("replicas", lo) <= hi, f"{rel} {name}: replicas outside [min, max]"
        pod = group["template"]["spec"]
        volumes = {v["name"] for v in pod.get("volumes", [])}
        assert pod["containers"], f"{rel} {name}: no containers"
        for c in pod["containers"]:
            m = _RAYSEQ_IMAGE.fullmatch(c["image"])
            assert m, f"{rel} {name}: image {c['image']} is not a rayseq image built from docker/"
            assert (m.group(2) == "gpu") == (_gpus(c) > 0), f"{rel} {name}: -gpu image iff nvidia.com/gpu limit"
            requests, limits = c["resources"]["requests"], c["resources"]["limits"]
            for res in ("cpu", "memory"):
                assert _quantity(requests[res]) <= _quantity(limits[res]), f"{rel} {name}: {res} request > limit"
            if "nvidia.com/gpu" in limits or "nvidia.com/gpu" in requests:
                assert _quantity(requests.get("nvidia.com/gpu", 0)) == _gpus(c), f"{rel} {name}: GPU request != limit"
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{rel} {name}: volumeMount {mount['name']} has no volume"
        if name == "head":
            ports = {p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
            assert {6379, 8265} <= ports, f"{rel}: head must expose GCS 6379 and dashboard 8265"


def _mount_paths(group: dict) -> list[str]:
    return [m["mountPath"] for c in group["template"]["spec"]["containers"] for m in c.get("volumeMounts", [])]


def _claims(group: dict) -> set[str]:
    vols = group["template"]["spec"].get("volumes", [])
    return {v["persistentVolumeClaim"]["claimName"] for v in vols if "persistentVolumeClaim" in v}


def _under(path: str, mounts: list[str]) -> bool:
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


def test_rayjob_trains_onto_a_volume():
    job = _one(RAYJOB, "RayJob")["spec"]
    assert job["shutdownAfterJobFinishes"] is True
    tokens = shlex.split(job["entrypoint"])
    assert tokens[:3] == ["python", "-m", "rayseq.train"], "the RayJob runs python -m rayseq.train"
    assert "--config" in tokens
    run_dir = next((t.split("=", 1)[1] for t in tokens if t.startswith("run_dir=")), None)
    assert run_dir and run_dir.startswith("/"), "run_dir= must be an absolute path on a volume"
    cluster = job["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert _under(run_dir, _mount_paths(head)), f"run_dir {run_dir} is not on a volume of the head (the driver)"
    pvcs = {d["metadata"]["name"] for d in _docs(RAYJOB) if d["kind"] == "PersistentVolumeClaim"}
    assert _claims(head) and _claims(head) <= pvcs, "the head's claim must be defined in the same file"
    gpu_groups = [g for g in cluster["workerGroupSpecs"] if max(map(_gpus, g["template"]["spec"]["containers"])) >= 1]
    assert gpu_groups, "the RayJob needs a GPU worker group (nvidia.com/gpu limit)"
    runtime_env = yaml.safe_load(job["runtimeEnvYAML"])
    assert runtime_env.get("working_dir") == IMAGE_DIR, "working_dir must be the code baked into the image"


def _serve_config() -> dict:
    raw = _one(RAYSERVICE, "RayService")["spec"]["serveConfigV2"]
    assert isinstance(raw, str), "serveConfigV2 is a YAML string (use |)"
    return yaml.safe_load(raw)


def test_rayservice_serve_config():
    config = _serve_config()
    apps = config["applications"]
    assert apps, "no Serve application"
    assert len({a["name"] for a in apps}) == len(apps)
    workers = _one(RAYSERVICE, "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    worker_mounts = [p for g in workers for p in _mount_paths(g)]
    pvcs = {d["metadata"]["name"] for d in _docs(RAYJOB) if d["kind"] == "PersistentVolumeClaim"}
    for app in apps:
        assert re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", app["import_path"]), app["import_path"]
        assert app["route_prefix"].startswith("/")
        checkpoint = app.get("args", {}).get("checkpoint")
        assert checkpoint, f"{app['name']}: args.checkpoint missing"
        assert _under(checkpoint, worker_mounts), f"{checkpoint} is not on a volume of the worker groups (replicas)"
    assert all(_claims(g) <= pvcs for g in workers), "the RayService mounts a claim the RayJob file does not define"


@pytest.mark.parametrize("import_path", [a["import_path"] for a in _serve_config()["applications"]])
def test_serve_import_path_resolves(import_path):
    module, attr = import_path.split(":")
    _check_module(module)
    origin = importlib.util.find_spec(module).origin
    tree = ast.parse(Path(origin).read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert attr in names, f"{module} defines no top-level {attr}"


# ---------------------------------------------------------------------------------------------- runtime_env


def _runtime_envs() -> list[tuple[str, dict]]:
    envs = [(RUNTIME_ENV, _load(RUNTIME_ENV))]
    envs.append((f"{RAYJOB} runtimeEnvYAML", yaml.safe_load(_one(RAYJOB, "RayJob")["spec"]["runtimeEnvYAML"])))
    for app in _serve_config()["applications"]:
        if "runtime_env" in app:
            envs.append((f"{RAYSERVICE} {app['name']}.runtime_env", app["runtime_env"]))
    return envs


@pytest.mark.parametrize("source,env", _runtime_envs(), ids=[s for s, _ in _runtime_envs()])
def test_runtime_env_is_valid_for_ray(source, env):
    from ray.runtime_env import RuntimeEnv

    unknown = set(env) - set(RuntimeEnv.known_fields)
    assert not unknown, f"{source}: unknown runtime_env fields {sorted(unknown)} (Ray ignores them silently)"
    local = dict(env)
    if "working_dir" in local:  # Ray checks a local working_dir exists: map it to this checkout
        wd = local["working_dir"]
        assert wd in (".", IMAGE_DIR), f"{source}: working_dir {wd} is neither the repo (.) nor the image's copy"
        local["working_dir"] = str(REPO)
    RuntimeEnv(**local)  # Ray's own type checks (env_vars must be Dict[str, str], ...)
    assert not {"pip", "uv", "conda"} & set(env), f"{source}: nodes already have the dependencies (no pip/uv/conda)"
    assert env.get("env_vars", {}).get("OMP_NUM_THREADS") == "1"


# Files that must reach neither a job's working_dir upload nor a Docker image.
NEVER_SHIPPED = (
    ".git/HEAD",
    "runs/counting/checkpoints/ckpt_100.pt",
    "runs/counting/metrics.parquet",
    "benchmarks/results/runs/a/summary.json",
    ".venv/bin/python",
    "rayseq/__pycache__/train.cpython-311.pyc",
    "model.pt",
)


def test_runtime_env_working_dir_upload():
    """What `ray job submit --runtime-env cluster/runtime_env.yaml --working-dir .` would upload, using Ray's packer."""
    try:
        from ray._private.runtime_env.packaging import PACKAGE_SIZE_WARNING, _dir_travel, _get_excludes
    except ImportError as exc:
        pytest.skip(f"Ray's working_dir packer moved ({exc})")
    env = _load(RUNTIME_ENV)
    assert env["working_dir"] == "."
    excluded = _get_excludes(REPO, env["excludes"])
    for path in (*NEVER_SHIPPED, ".venv-ci/lib/site.py"):
        assert excluded(REPO / path), f"runtime_env excludes do not drop {path}"
    files: list[Path] = []
    # the excludes above hold on their own; the upload itself also honours .gitignore, as Ray does by default
    _dir_travel(REPO, [excluded], lambda p: files.append(p) if p.is_file() else None, include_gitignore=True)
    rels = {str(p.relative_to(REPO)) for p in files}
    for needed in ("pyproject.toml", "rayseq/train.py", "rayseq/config/schema.py", "tune_configs/counting.yaml"):
        assert needed in rels, f"{needed} would not be uploaded"
    total = sum(p.stat().st_size for p in files)
    assert total < PACKAGE_SIZE_WARNING, f"working_dir upload of {total / 2**20:.0f} MiB: exclude more"


# ------------------------------------------------------------------------------------------------- Docker


_KNOWN_INSTRUCTIONS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}  # fmt: skip


def _substitute(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), value)


def _instructions(rel: str) -> list[Instruction]:
    return parse_dockerfile((REPO / rel).read_text())


def _copy_sources(ins: Instruction) -> list[str]:
    tokens = ins.exec_form or shlex.split(ins.value)
    tokens = [t for t in tokens if not t.startswith("--")]
    return tokens[:-1]


def test_dockerfile_parser_handles_continuations_and_forms():
    text = (
        "# syntax=docker/dockerfile:1\nFROM a:b\n"
        "RUN echo 1 \\\n  # inner comment\n  && echo 2\n"
        'CMD ["python", "-m", "x"]\n'
    )
    ins = parse_dockerfile(text)
    assert [(i.cmd, i.line) for i in ins] == [("FROM", 2), ("RUN", 3), ("CMD", 6)]
    assert ins[1].value == "echo 1 && echo 2"
    assert ins[2].exec_form == ["python", "-m", "x"] and ins[1].exec_form == []


@pytest.mark.parametrize("rel,flavor", DOCKERFILES.items())
def test_dockerfile_base_image_pinned(rel, flavor):
    ins = _instructions(rel)
    unknown = {i.cmd for i in ins} - _KNOWN_INSTRUCTIONS
    assert not unknown, f"{rel}: unknown instructions {unknown}"
    froms = [i for i in ins if i.cmd == "FROM"]
    assert len(froms) == 1, f"{rel}: expected a single-stage build"
    assert all(i.cmd == "ARG" for i in ins[: ins.index(froms[0])]), "only ARG may precede FROM"
    base = _RAY_IMAGE.fullmatch(froms[0].value)
    assert base, f"{rel}: FROM {froms[0].value} is not a rayproject/ray image"
    ray = _ray_version()
    assert (base.group(1), base.group(3)) == (ray, flavor), f"{rel}: FROM is not the {flavor} image of Ray {ray}"


@pytest.mark.parametrize("rel", DOCKERFILES)
def test_dockerfile_copy_sources_exist_in_context(rel):
    """The build context is the repository root; every COPY source must be there and not .dockerignored."""
    rules = _dockerignore_rules(REPO / ".dockerignore")
    ins = _instructions(rel)
    copied: list[str] = []
    for i in ins:
        if i.cmd in ("COPY", "ADD") and "--from" not in i.value:
            for src in _copy_sources(i):
                assert (REPO / src).exists(), f"{rel}:{i.line}: COPY source {src} not in the build context"
                assert not docker_excluded(src.rstrip("/"), rules), f"{rel}:{i.line}: {src} is .dockerignored"
                copied.append(src.rstrip("/"))
    install = next(n for n, i in enumerate(ins) if i.cmd == "RUN" and re.search(r"pip install .*-e \.", i.value))
    before = {src for i in ins[:install] if i.cmd == "COPY" for src in (s.rstrip("/") for s in _copy_sources(i))}
    readme = _pyproject()["project"].get("readme")
    for needed in ("pyproject.toml", "rayseq", readme):
        assert needed in before, f"{rel}: {needed} must be copied before `pip install -e .`"
    assert {"tune_configs", "serve"} <= set(copied)


@pytest.mark.parametrize("rel,flavor", DOCKERFILES.items())
def test_dockerfile_runtime_contract(rel, flavor):
    ins = _instructions(rel)
    users = [i.value for i in ins if i.cmd == "USER"]
    assert users and users[-1] == "ray", f"{rel}: must run as the base image's non-root user ray"
    workdirs = [i.value for i in ins if i.cmd == "WORKDIR"]
    assert workdirs and workdirs[-1] == IMAGE_DIR
    cmd = [i for i in ins if i.cmd == "CMD"][-1].exec_form
    assert cmd[:2] == ["python", "-m"] and len(cmd) >= 3, f"{rel}: CMD must be exec form python -m MODULE"
    _check_module(cmd[2])
    args = {}
    for i in ins:
        if i.cmd == "ARG":
            name, _, default = i.value.partition("=")
            args[name] = default
    runs = [(n, _substitute(i.value, args)) for n, i in enumerate(ins) if i.cmd == "RUN"]
    torch_runs = [(n, v) for n, v in runs if _torch_pins(v)]
    assert len(torch_runs) == 1, f"{rel}: torch must be installed in one RUN, pinned"
    n_torch, torch_run = torch_runs[0]
    for pin in _torch_pins(torch_run):
        assert Version(pin) in _dependency_spec("torch"), f"{rel}: torch=={pin} outside pyproject's range"
    cpu_index = "--index-url https://download.pytorch.org/whl/cpu" in torch_run
    assert cpu_index == (flavor == "cpu"), f"{rel}: {flavor} image needs the {'CPU' if cpu_index else 'CUDA'} wheel"
    n_install = next(n for n, v in runs if re.search(r"pip install .*-e \.", v))
    assert n_torch < n_install, f"{rel}: torch must be installed before rayseq (else pip picks its own torch)"


# ---------------------------------------------------------------------------------------------- .dockerignore


def _docker_pattern(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif c == "*":
            out, i = out + "[^/]*", i + 1
        elif c == "?":
            out, i = out + "[^/]", i + 1
        elif c == "[":
            end = pattern.index("]", i)
            body = pattern[i + 1 : end]
            out, i = out + "[" + ("^" + body[1:] if body.startswith(("!", "^")) else body) + "]", end + 1
        else:
            out, i = out + re.escape(c), i + 1
    return re.compile(out)


def _dockerignore_rules(path: Path) -> list[tuple[bool, re.Pattern]]:
    rules = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = posixpath.normpath(line.lstrip("!").strip().lstrip("/"))
        rules.append((negate, _docker_pattern(pattern)))
    return rules


def docker_excluded(relpath: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    """Docker's rule: a path is excluded when the last pattern matching it or one of its parents excludes."""
    parts = relpath.split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    excluded = False
    for negate, rx in rules:
        if any(rx.fullmatch(p) for p in prefixes):
            excluded = not negate
    return excluded


def test_dockerignore_excludes_what_must_not_reach_the_image():
    rules = _dockerignore_rules(REPO / ".dockerignore")
    for path in (*NEVER_SHIPPED, ".venv-ci/bin/python", "tune_configs/old.pt"):
        assert docker_excluded(path, rules), f".dockerignore does not exclude {path}"
    # and keeps every file the Dockerfiles copy
    for top in ("pyproject.toml", "README.md", "rayseq", "tune_configs", "serve"):
        paths = [REPO / top] if (REPO / top).is_file() else sorted((REPO / top).rglob("*"))
        for p in paths:
            rel = str(p.relative_to(REPO))
            if p.is_file() and "__pycache__" not in rel:
                assert not docker_excluded(rel, rules), f".dockerignore drops {rel}, which the image needs"


def test_dockerignore_matcher_follows_docker_semantics():
    rules = _dockerignore_rules_from(["runs", "**/*.pt", "!keep.pt", "docs/*.md"])
    assert docker_excluded("runs/a/b", rules) and not docker_excluded("x/runs/a", rules)
    assert docker_excluded("a/b/c.pt", rules) and not docker_excluded("keep.pt", rules)
    assert docker_excluded("docs/a.md", rules) and not docker_excluded("docs/sub/a.md", rules)


def _dockerignore_rules_from(lines: list[str]) -> list[tuple[bool, re.Pattern]]:
    return [(ln.startswith("!"), _docker_pattern(posixpath.normpath(ln.lstrip("!")))) for ln in lines]


def test_no_divergent_dockerignore_under_docker():
    """Docker reads the context root's .dockerignore; a differing copy under docker/ would mislead (or,
    as docker/Dockerfile*.dockerignore under BuildKit, silently replace it)."""

    def patterns(p: Path) -> list[str]:
        return [ln.strip() for ln in p.read_text().splitlines() if ln.strip() and not ln.strip().startswith("#")]

    root = patterns(REPO / ".dockerignore")
    for other in sorted(DOCKER.glob("*dockerignore")):
        assert patterns(other) == root, f"{other.relative_to(REPO)} differs from the root .dockerignore"


def test_serve_dir_has_a_tracked_file():
    """COPY serve/ fails on a fresh clone if serve/ is empty (git does not keep empty directories)."""
    assert any(p.is_file() for p in (REPO / "serve").iterdir()), "serve/ needs a file (e.g. .gitkeep)"
