"""Fixtures for engine tests: a tiny real ONNX encoder, workflows written to tmp folders, and a
private artifact store per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from engine_helpers import make_tiny_encoder

HERE = Path(__file__).parent


@pytest.fixture
def tiny_onnx(tmp_path: Path) -> Path:
    return make_tiny_encoder(tmp_path / "models" / "tiny.onnx")


@pytest.fixture
def store_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    store = tmp_path / "store"
    monkeypatch.setenv("KILN_STORE", str(store))
    return store


@pytest.fixture
def test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the misbehaving passes of kiln_test_plugins (also in worker processes)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(
        "KILN_PLUGINS",
        "passes:crash=kiln_test_plugins:Crash,passes:sleep=kiln_test_plugins:Sleep,passes:hang=kiln_test_plugins:Hang,passes:boom=kiln_test_plugins:Boom,passes:copy=kiln_test_plugins:Copy,passes:where=kiln_test_plugins:Where,evaluators:placed=kiln_test_plugins:Placed",
    )
    monkeypatch.syspath_prepend(str(HERE))
    from engine import registry

    registry._index.cache_clear()
    registry.load.cache_clear()
    yield
    registry._index.cache_clear()
    registry.load.cache_clear()
