"""Fixtures shared by every test folder (each folder's own conftest adds its own)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from alone import pytest_runtest_protocol  # noqa: F401  (runs the tests marked alone with nothing beside them)
from genai_models import TinyGenai, build

OV_EP_REQUIREMENTS = ["onnxruntime-openvino==1.24.1"]

# Tables follow COLUMNS when piped. GNU readline (loaded under pytest) exports COLUMNS=80 into the
# C environment, where every subprocess the tests start finds it although os.environ does not
# show it: a test's `engine run` would then lay its tables out at 80 columns by accident. The
# tests' processes get an explicit width instead (a test that wants another sets its own).
os.environ["COLUMNS"] = "200"


@pytest.fixture(scope="session")
def envs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the tests' isolated environments live: ``$KILN_ENVS_DIR`` (CI caches it between
    runs), else one folder for the whole test session, so each environment is built once (under
    xdist one folder for all its processes: ``ensure`` locks a build, so the first builds it and
    the others wait and use it)."""
    configured = os.environ.get("KILN_ENVS_DIR")
    if configured:
        return Path(configured)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "envs"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("envs")


@pytest.fixture(scope="session")
def ov_ep_env(envs_dir: Path) -> Path:
    """The python of an environment holding the onnxruntime-openvino wheel (its ``onnxruntime``
    module has the OpenVINO execution provider), with Kiln importable: built once per session."""
    from engine.core.config import EnvironmentSpec
    from engine.execute.environments import ensure

    built = ensure(EnvironmentSpec(requirements=OV_EP_REQUIREMENTS), envs_dir)
    return Path(built.python)


@pytest.fixture(scope="session")
def inc_env(envs_dir: Path) -> Any:
    """The isolated environment the Intel Neural Compressor passes declare (neural-compressor 3.7.1
    with numpy 1.26 and onnx 1.18), with Kiln importable: built once per session (or found in
    ``$KILN_ENVS_DIR``, keyed by its requirements)."""
    from engine.execute.environments import ensure
    from passes.quantize._inc import INC_ENVIRONMENT

    return ensure(INC_ENVIRONMENT, envs_dir)


@pytest.fixture(scope="session")
def quark_env(envs_dir: Path) -> Any:
    """The isolated environment quark_quantize declares (amd-quark 0.13 with onnx 1.22, torch from
    the main environment), with Kiln importable: built once per session (or found in
    ``$KILN_ENVS_DIR``). Tests that need it skip where it cannot be built (no index to install
    from, no C++ compiler for Quark's custom-op library)."""
    import shutil

    from engine.core.errors import KilnError
    from engine.execute.environments import ensure
    from passes.quantize._quark import QUARK_ENVIRONMENT

    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("Quark compiles its custom-op library with a C++ compiler; none here")
    try:
        return ensure(QUARK_ENVIRONMENT, envs_dir)
    except KilnError as error:
        pytest.skip(f"Quark's environment cannot be built here: {error}")


@pytest.fixture(scope="session")
def tiny_genai(tmp_path_factory: pytest.TempPathFactory) -> TinyGenai:
    """Tiny llama decoders exported by the GenAI model builder (fp32, int4, fp32 without a shared
    past/present buffer), built once per test session (the target and evaluator tests share them)."""
    return build(tmp_path_factory.mktemp("genai"))


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face cache of the test's own, offline: HF_HOME and HF_HUB_CACHE point into
    tmp_path, HF_HUB_OFFLINE=1 (for this process and the engine processes it starts), no token.
    Returns the cache folder; lay models out in it with ``hub_cache.make_hub_cache``."""
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_CACHE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return cache
