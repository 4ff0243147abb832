"""Isolated environments: a virtual environment per requirement set, for targets and steps that
need packages the main environment cannot hold (``onnxruntime-openvino`` replaces the
``onnxruntime`` module, an old Intel Neural Compressor pins old libraries).

One environment per (sorted normalized requirements, Python major.minor, platform tag); its key
is the sha256 of those (``EnvironmentSpec.key``). It lives in ``<store>/envs/<key>/``, or in
``$KILN_ENVS_DIR/<key>/`` (several stores, or a test session, share one). ``uv`` builds it:
``uv venv --python <this interpreter> DIR`` then ``uv pip install --python DIR/bin/python REQS``.

Kiln is importable there without reinstalling its stack: a ``.pth`` file in the environment's
site-packages appends the folder holding ``engine/`` and then the main environment's
site-packages (through ``site.addsitedir``, so their own ``.pth`` files apply too). Python reads
the environment's own site-packages first, so what the requirements installed shadows the main
environment (``onnxruntime-openvino``'s ``onnxruntime`` wins over the main ``onnxruntime``) and
everything else (pydantic, numpy, onnx, Kiln) comes from the main environment. uv does not look
through the ``.pth`` file, so a requirement's own dependencies are installed into the
environment too and shadow the main environment's copies.

Building is once per key across runs: a file lock (engine.store.locks) keeps two runs from building the
same environment, and ``kiln-env.json`` (requirements, python, platform, the frozen package list,
build time) is written atomically as the last step. An environment without a valid marker is
removed and rebuilt from scratch. A target in an environment is checked there, not here:
``python -m engine.execute.environments probe TARGET.json`` builds the target in the environment and
prints its availability and fingerprint (with the environment's library versions) as JSON.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from engine.core.config import EnvironmentSpec
from engine.core.errors import KilnError
from engine.core.target import Availability
from engine.store.locks import job_lock
from engine.workflow.resolve.model import BuiltEnvironment, ResolvedWorkflow

log = logging.getLogger("kiln.environments")

MARKER = "kiln-env.json"
PTH = "_kiln_main_environment.pth"
#: the constraints a build was pinned to (``ensure``'s ``pins``), kept beside its marker
PINS = "kiln-pins.txt"
#: a build holding its lock longer than this is taken for dead
BUILD_TIMEOUT_S = 3600.0
PROBE_TIMEOUT_S = 300.0


def envs_dir(store_root: Path) -> Path:
    """Where environments live: ``$KILN_ENVS_DIR``, else ``<store>/envs``."""
    configured = os.environ.get("KILN_ENVS_DIR")
    return Path(configured).expanduser().resolve() if configured else store_root / "envs"


def kiln_root() -> Path:
    """The folder holding the ``engine`` package."""
    return Path(__file__).resolve().parent.parent


def _python_of(folder: Path) -> Path:
    return folder / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def _uv() -> str:
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found:
        return found
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found]

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        raise KilnError("building an environment needs uv (pip install uv)") from None


def _describe(spec: EnvironmentSpec) -> str:
    return ", ".join(spec.requirements)


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(temporary, path)


def read_marker(spec: EnvironmentSpec, folder: Path) -> dict[str, Any] | None:
    """The environment's marker when it says the environment is complete and is this one."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("key") != spec.key() or marker.get("requirements") != list(spec.requirements):
        return None
    if not isinstance(marker.get("freeze"), str) or not _python_of(folder).exists():
        return None
    return marker


def frozen_versions(freeze: str) -> dict[str, str]:
    """``name==version`` lines of a frozen package list, by normalized name (other lines, such as
    ``-e`` or direct references, name no version and are left out)."""
    from packaging.utils import canonicalize_name

    versions = {}
    for line in freeze.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and name and not name.startswith(("-", "#")):
            versions[canonicalize_name(name)] = version.split(";")[0].strip()
    return dict(sorted(versions.items()))


def _built(spec: EnvironmentSpec, folder: Path, marker: dict[str, Any]) -> BuiltEnvironment:
    return BuiltEnvironment(
        key=spec.key(),
        requirements=tuple(spec.requirements),
        python=str(_python_of(folder)),
        packages=hashlib.sha256(marker["freeze"].encode()).hexdigest(),
        versions=tuple(frozen_versions(marker["freeze"]).items()),
    )


def existing(spec: EnvironmentSpec, root: Path) -> BuiltEnvironment | None:
    """The environment if it is built (nothing is built here)."""
    folder = root / spec.key()
    marker = read_marker(spec, folder)
    return _built(spec, folder, marker) if marker is not None else None


def failed_requirement(stderr: str, requirements: list[str] | tuple[str, ...]) -> str | None:
    """Which requirement uv's error names (its resolver says ``Because X was not found`` or
    ``there is no version of X``); None when it names none of them."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    text = stderr.lower()
    for requirement in requirements:
        if requirement.lower() in text:
            return requirement
    for requirement in requirements:
        name = canonicalize_name(Requirement(requirement).name)
        if name in text.replace("_", "-") or name.replace("-", "_") in text:
            return requirement
    return None


def _uv_message(stderr: str) -> str:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip() and not line.startswith("Using Python")]
    return " ".join(lines[-6:])


def _uv_env() -> dict[str, str]:
    """uv looks for wheels where pip does: ``PIP_FIND_LINKS`` becomes ``UV_FIND_LINKS`` unless that is
    set (a machine's CPU build of torch lies there; without it uv takes PyPI's CUDA build)."""
    env = dict(os.environ)
    if env.get("PIP_FIND_LINKS") and not env.get("UV_FIND_LINKS"):
        env["UV_FIND_LINKS"] = env["PIP_FIND_LINKS"]
    return env


def _run(command: list[str], what: str, spec: EnvironmentSpec, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False, env=env)
    if done.returncode != 0:
        message = _uv_message(done.stderr or done.stdout)
        failed = failed_requirement(done.stderr, spec.requirements) if what == "install" else None
        which = f"requirement '{failed}' could not be installed" if failed else f"uv {what} failed ({_describe(spec)})"
        raise KilnError(f"building environment {spec.key()[:12]} failed: {which}: {message}")
    return done


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def _main_site_dirs() -> list[str]:
    import site

    dirs = list(site.getsitepackages())
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and Path(user).is_dir():
        dirs.append(user)
    return dirs


def _build(spec: EnvironmentSpec, folder: Path, pins: dict[str, str] | None = None) -> None:
    uv = _uv()
    shutil.rmtree(folder, ignore_errors=True)  # a half-built environment is rebuilt from scratch
    folder.parent.mkdir(parents=True, exist_ok=True)
    _run([uv, "venv", "--quiet", "--python", sys.executable, str(folder)], "venv", spec)
    python = _python_of(folder)
    constraints: list[str] = []
    if pins:  # the versions another machine's build froze to (engine.execute.node_env)
        (folder / PINS).write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())), encoding="utf-8")
        constraints = ["--constraint", str(folder / PINS)]
    _run([uv, "pip", "install", "--python", str(python), *spec.requirements, *constraints], "install", spec, _uv_env())
    freeze = _run([uv, "pip", "freeze", "--python", str(python)], "pip freeze", spec).stdout
    lines = [str(kiln_root())] + [f"import site; site.addsitedir({d!r})" for d in _main_site_dirs()]
    (_site_packages(python) / PTH).write_text("\n".join(lines) + "\n", encoding="utf-8")
    marker = {
        "key": spec.key(),
        "requirements": list(spec.requirements),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "python_executable": sys.executable,
        "platform": sysconfig.get_platform(),
        "freeze": freeze,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _write_json_atomic(folder / MARKER, marker)


def ensure(spec: EnvironmentSpec, root: Path, hooks: Any = None, pins: dict[str, str] | None = None) -> BuiltEnvironment:
    """The environment of ``spec`` under ``root``, built first unless its marker is there.
    ``hooks`` (engine.execute.hooks.Hooks) hears ``environment_started``/``environment_done``.
    ``pins`` (name: version) constrain a build to the versions another build froze to (a node
    building what the driver built), so both freeze alike (a pinned version the index no longer
    has fails the build, naming it)."""
    key = spec.key()
    folder = root / key
    marker = read_marker(spec, folder)
    if marker is not None:
        return _built(spec, folder, marker)
    root.mkdir(parents=True, exist_ok=True)
    with job_lock(root / ".locks", key, BUILD_TIMEOUT_S):
        marker = read_marker(spec, folder)  # again under the lock: another run may have built it and let go since the first look
        if marker is None:
            log.info("building environment %s (%s)…", key[:12], _describe(spec))
            if hooks is not None:
                hooks.environment_started(key, spec.requirements)
            started = time.perf_counter()
            _build(spec, folder, pins)
            seconds = time.perf_counter() - started
            log.info("environment %s built in %.1f s", key[:12], seconds)
            if hooks is not None:
                hooks.environment_done(key, seconds)
            marker = read_marker(spec, folder)
            if marker is None:
                raise KilnError(f"environment {key[:12]} was built but its marker {folder / MARKER} is not valid")
    return _built(spec, folder, marker)


# -- targets in environments ----------------------------------------------------------------------
def environment_library_versions(names: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    """Versions of the distributions that provide what ``import NAME`` loads here: a package
    installed under another name that provides the module (``onnxruntime-openvino`` provides
    ``onnxruntime``) and comes first on the path reports its own version."""
    from importlib import metadata

    providers = metadata.packages_distributions()
    versions: dict[str, str | None] = {}
    for name in names:
        module = name.replace("-", "_")
        candidates = providers.get(module) or [name]
        try:
            versions[name] = metadata.version(candidates[0])
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _probe_here(runtime: str, config: dict[str, Any]) -> dict[str, Any]:
    """Run inside the environment: the target's availability and fingerprint."""
    from engine import registry

    cls = registry.load("targets", runtime)
    target = cls(cls.Config(**config))
    availability = target.availability()
    fingerprint = target.fingerprint()
    fingerprint["libraries"] = environment_library_versions(cls.libraries)
    return {"ok": availability.ok, "reason": availability.reason, "fingerprint": fingerprint}


def probe(built: BuiltEnvironment, runtime: str, config: dict[str, Any]) -> tuple[Availability, dict[str, Any] | None]:
    """The target checked inside its environment: availability, and the fingerprint (None when
    the environment could not say)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    document = json.dumps({"runtime": runtime, "config": config})
    try:
        done = subprocess.run(
            [built.python, "-m", "engine.execute.environments", "probe", document],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env=env,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Availability(False, f"checking the target in environment {built.key[:12]} timed out"), None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " ".join((done.stderr or "").strip().splitlines()[-3:])
        return Availability(False, f"checking the target in environment {built.key[:12]} failed: {tail}"), None
    fingerprint = answer["fingerprint"]
    fingerprint["environment"] = {"packages": built.packages}
    return Availability(bool(answer["ok"]), answer.get("reason") or ""), fingerprint


def specs(resolved: ResolvedWorkflow) -> dict[str, EnvironmentSpec]:
    """The environments the workflow's targets and steps declare, by key."""
    found: dict[str, EnvironmentSpec] = {}
    for entry in resolved.targets.values():
        environment = getattr(entry.instance.config, "environment", None)
        if environment is not None:
            found.setdefault(environment.key(), environment)
    for step in resolved.steps.values():
        if step.environment is not None:
            found.setdefault(step.environment.key(), step.environment)
    return found


def prepare(resolved: ResolvedWorkflow, store_root: Path, build: bool, hooks: Any = None) -> list[str]:
    """Build (``build``) or find the workflow's environments and check its targets that live in
    one inside it. Fills ``resolved.environments`` and the entries' availability and
    fingerprint; returns the notes on environments not built yet (``engine validate``/``plan``)."""
    root = envs_dir(store_root)
    notes = []
    for key, spec in specs(resolved).items():
        built = ensure(spec, root, hooks) if build else existing(spec, root)
        if built is None:
            notes.append(f"{spec.not_built()}: {_describe(spec)}")
            continue
        resolved.environments[key] = built
    for entry in resolved.targets.values():
        environment = getattr(entry.instance.config, "environment", None)
        built = resolved.environments.get(environment.key()) if environment is not None else None
        if built is not None:
            entry.availability, entry.fingerprint = probe(built, entry.cls.runtime, entry.instance.config.to_json())
    return notes


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "probe":
        print('usage: python -m engine.execute.environments probe \'{"runtime": ..., "config": {...}}\'', file=sys.stderr)
        return 2
    request = json.loads(argv[1])
    print(json.dumps(_probe_here(request["runtime"], request["config"])))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
