"""Isolated environments: requirement validation, keys, real builds with uv (PyPI), and jobs
running with an environment's python."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import engine_cmd, tiny_workflow, write_workflow
from pydantic import ValidationError

from engine.core.config import EnvironmentSpec
from engine.core.errors import InputError, KilnError
from engine.execute.environments import MARKER, ensure, environment_library_versions, existing, failed_requirement
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow

OV_EP = ["onnxruntime-openvino==1.24.1"]


class Heard:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def environment_started(self, key: str, requirements: list[str]) -> None:
        self.calls.append(("started", key))

    def environment_done(self, key: str, seconds: float) -> None:
        self.calls.append(("done", key))


# -- schema ---------------------------------------------------------------------------------------
def test_requirements_are_normalized_and_sorted():
    spec = EnvironmentSpec(requirements=["Six == 1.16.0", "onnxruntime_openvino==1.24.1"])
    assert spec.requirements == ["onnxruntime-openvino==1.24.1", "six==1.16.0"]


def test_a_bad_requirement_is_a_workflow_error_naming_its_key_path(tmp_path, tiny_onnx):
    target = {"id": "ov", "runtime": "onnxruntime", "environment": {"requirements": ["six==1.16.0", "not a requirement!!"]}}
    path = write_workflow(tmp_path, tiny_workflow(tiny_onnx, targets=[target]))
    with pytest.raises(InputError) as caught:
        load_workflow(path)
    text = str(caught.value)
    assert "targets[0].environment.requirements[1]" in text
    assert "not a requirement!!" in text and "PEP 508" in text


def test_a_bad_step_requirement_is_a_workflow_error(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["environment"] = {"requirements": ["six>>1"]}
    with pytest.raises(InputError) as caught:
        load_workflow(write_workflow(tmp_path, workflow))
    assert "steps[0].environment.requirements[0]" in str(caught.value)


def test_environment_takes_requirements_only():
    with pytest.raises(ValidationError):
        EnvironmentSpec(requirements=["six"], python="3.12")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        EnvironmentSpec(requirements=[])


def test_a_target_without_environment_keeps_its_config_json(tmp_path, tiny_onnx):
    resolved = load_workflow(write_workflow(tmp_path, tiny_workflow(tiny_onnx)))
    instance = resolved.targets["cpu"].instance
    assert "environment" not in instance.config.to_json()
    assert "environment" not in instance.fingerprint()["options"]


# -- keys -----------------------------------------------------------------------------------------
def test_the_key_ignores_order_and_spelling_but_not_the_python_version():
    one = EnvironmentSpec(requirements=["six==1.16.0", "onnxruntime-openvino==1.24.1"])
    two = EnvironmentSpec(requirements=["onnxruntime_openvino==1.24.1", "Six==1.16.0"])
    assert one.key() == two.key()
    assert one.key(python="3.12") != one.key(python="3.11")
    assert one.key(platform="win-amd64") != one.key(platform="linux-x86_64")
    assert EnvironmentSpec(requirements=["six==1.17.0"]).key() != EnvironmentSpec(requirements=["six==1.16.0"]).key()


def test_uv_errors_name_the_requirement():
    stderr = (
        "error: No solution found when resolving dependencies\n  cause: Because kiln-no-such-package-zz was not found in the "
        "package registry and you require kiln-no-such-package-zz, we can conclude that your requirements are unsatisfiable."
    )
    assert failed_requirement(stderr, ["six==1.16.0", "kiln-no-such-package-zz"]) == "kiln-no-such-package-zz"
    stderr = "  cause: Because there is no version of six==99.0 and you require six==99.0, we can conclude ..."
    assert failed_requirement(stderr, ["onnx==1.0", "six==99.0"]) == "six==99.0"


# -- real builds (PyPI) ---------------------------------------------------------------------------
def test_a_failed_build_names_the_requirement(tmp_path):
    spec = EnvironmentSpec(requirements=["six==1.16.0", "kiln-no-such-package-zz==1.0"])
    with pytest.raises(KilnError) as caught:
        ensure(spec, tmp_path / "envs")
    text = str(caught.value)
    assert "requirement 'kiln-no-such-package-zz==1.0' could not be installed" in text
    assert "not found in the package registry" in text
    assert existing(spec, tmp_path / "envs") is None  # no marker: not taken for built


def test_a_small_environment_is_built_once_and_rebuilt_without_its_marker(envs_dir):
    spec = EnvironmentSpec(requirements=["six==1.16.0"])
    heard = Heard()
    built = ensure(spec, envs_dir, heard)
    marker = json.loads((envs_dir / spec.key() / MARKER).read_text())
    assert marker["requirements"] == ["six==1.16.0"] and "six==1.16.0" in marker["freeze"]
    again = Heard()
    assert ensure(spec, envs_dir, again) == built
    assert again.calls == []  # the marker is there: nothing built
    (envs_dir / spec.key() / MARKER).unlink()
    assert existing(spec, envs_dir) is None
    rebuilt = Heard()
    assert ensure(spec, envs_dir, rebuilt).python == built.python
    assert [kind for kind, _ in rebuilt.calls] == ["started", "done"]
    out = subprocess.run(
        [built.python, "-c", "import six, engine, pydantic; print(six.__version__, six.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    version, where = out.stdout.split()
    assert version == "1.16.0" and where.startswith(str(envs_dir))


def test_the_ov_environment_has_openvino_ep_and_kiln(ov_ep_env):
    code = (
        "import json, onnxruntime, engine, pydantic, numpy;"
        "from engine.execute.environments import environment_library_versions as v;"
        "print(json.dumps({'version': onnxruntime.__version__, 'providers': onnxruntime.get_available_providers(),"
        " 'libraries': v(['onnxruntime'])}))"
    )
    out = subprocess.run([str(ov_ep_env), "-c", code], capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["version"] == "1.24.1"
    assert "OpenVINOExecutionProvider" in found["providers"]
    assert found["libraries"] == {"onnxruntime": "1.24.1"}
    assert environment_library_versions(["onnxruntime"])["onnxruntime"] != "1.24.1"  # the main one here


# -- engine run / validate / plan -----------------------------------------------------------------
def _ov_workflow(tiny_onnx: Path, requirements: list[str]) -> dict[str, Any]:
    workflow = tiny_workflow(tiny_onnx)
    workflow["targets"] = [
        {"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1},
        {"id": "ov", "runtime": "onnxruntime", "intra_op_threads": 1, "environment": {"requirements": requirements}},
    ]
    workflow["evaluate"][1]["config"].update({"runs": 5, "warmup": 1, "quiet_wait_s": 0})
    return workflow


def _cli(*args: str, envs: Path) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [*engine_cmd(), *args], capture_output=True, text=True, timeout=600, env={**os.environ, "KILN_ENVS_DIR": str(envs)}
    )


def test_validate_and_plan_do_not_build_environments(tmp_path, tiny_onnx):
    path = write_workflow(tmp_path, _ov_workflow(tiny_onnx, OV_EP))
    key = EnvironmentSpec(requirements=OV_EP).key()
    envs = tmp_path / "envs"
    done = _cli("validate", str(path), envs=envs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"environment {key[:12]} not built yet (built by engine run)" in done.stdout
    done = _cli("plan", str(path), "--store", str(tmp_path / "store"), envs=envs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"environment {key[:12]} not built yet (built by engine run)" in done.stdout
    assert not envs.exists() or not any(envs.iterdir())


def test_a_failed_build_stops_the_run_with_exit_2(tmp_path, tiny_onnx):
    path = write_workflow(tmp_path, _ov_workflow(tiny_onnx, ["kiln-no-such-package-zz"]))
    done = _cli("run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out"), envs=tmp_path / "envs")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "requirement 'kiln-no-such-package-zz' could not be installed" in done.stderr
    assert "Traceback" not in done.stderr
    assert "building environment" in done.stdout


def test_jobs_of_a_target_in_an_environment_run_there(tmp_path, tiny_onnx, ov_ep_env, envs_dir, monkeypatch):
    path = write_workflow(tmp_path, _ov_workflow(tiny_onnx, OV_EP))
    done = _cli("run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out"), envs=envs_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "building environment" not in done.stdout  # the fixture built it
    records = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    versions = {
        (record["target"], record["evaluations"]["latency"]["details"]["session"]["onnxruntime_version"])
        for record in records
        if record["state"] == "complete"
    }
    main = environment_library_versions(["onnxruntime"])["onnxruntime"]
    assert versions == {("cpu", main), ("ov", "1.24.1")}
    # the target's fingerprint in the keys names the environment's library and its packages
    resolved = load_workflow(path)
    from engine.execute.environments import prepare

    monkeypatch.setenv("KILN_ENVS_DIR", str(envs_dir))
    prepare(resolved, tmp_path / "store", build=False)
    fingerprint = resolved.targets["ov"].fingerprint
    assert fingerprint is not None and fingerprint["libraries"] == {"onnxruntime": "1.24.1"}
    assert fingerprint["environment"]["packages"] and fingerprint["options"]["environment"] == {"requirements": OV_EP}
    assert resolved.targets["ov"].availability.ok


def test_a_step_with_an_environment_runs_its_pass_there(tmp_path, tiny_onnx, test_plugins, envs_dir, monkeypatch):
    monkeypatch.setenv("KILN_ENVS_DIR", str(envs_dir))
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [{"id": "where", "pass": "where", "environment": {"requirements": ["six==1.16.0"]}}]
    workflow["evaluate"] = workflow["evaluate"][:1]
    workflow["select"] = {"objective": {"metric": "fidelity.cosine_mean", "goal": "max"}}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    report = run_workflow(resolved, Store(tmp_path / "store"))
    (job,) = [state for state in report.jobs.values() if state.record]
    spec = EnvironmentSpec(requirements=["six==1.16.0"])
    assert job.record["details"] == {"prefix": str(envs_dir / spec.key()), "six": "1.16.0"}
    assert job.record["key_doc"]["environment"]["requirements"] == ["six==1.16.0"]
    assert job.record["key_doc"]["environment"]["packages"] == resolved.environments[spec.key()].packages
