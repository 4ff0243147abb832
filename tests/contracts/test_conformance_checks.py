"""The conformance checks catch what they claim to: plugins registered the way a third party's
are (here through KILN_PLUGINS, which the registry reads like entry points) pass or fail."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ConfigDict

from engine import conformance, registry
from engine.core import Categorical, ModelArtifact, Pass, PassConfig, PassContext, PassResult


class GoodPass(Pass):
    name = "conformance_good"
    summary = "copies the model"
    accepts = ("onnx",)
    produces = "onnx"
    search_space = {"flag": Categorical((True, False))}

    class Config(PassConfig):
        flag: bool = False

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        (Path(ctx.output_dir) / "model.onnx").write_bytes(model.model_file.read_bytes())
        return PassResult(model=ModelArtifact.from_folder("onnx", Path(ctx.output_dir)))


class LooseConfig(GoodPass):
    name = "conformance_loose"

    class Config(PassConfig):
        model_config = ConfigDict(extra="allow")
        flag: bool = False


class WrongSpace(GoodPass):
    name = "conformance_wrong_space"
    search_space = {"missing": Categorical((1, 2))}


class Nondeterministic(GoodPass):
    name = "conformance_nondeterministic"

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        (Path(ctx.output_dir) / "model.onnx").write_bytes(model.model_file.read_bytes() + os.urandom(8))
        return PassResult(model=ModelArtifact.from_folder("onnx", Path(ctx.output_dir)))


class Misnamed(GoodPass):
    name = "conformance_other_name"


PLUGINS = {
    "conformance_good": "GoodPass",
    "conformance_loose": "LooseConfig",
    "conformance_wrong_space": "WrongSpace",
    "conformance_nondeterministic": "Nondeterministic",
    "conformance_misnamed": "Misnamed",
}


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    entries = ",".join(f"passes:{name}={__name__}:{cls}" for name, cls in PLUGINS.items())
    monkeypatch.setenv("KILN_PLUGINS", entries)
    registry._index.cache_clear()
    registry.load.cache_clear()
    yield
    monkeypatch.delenv("KILN_PLUGINS")
    registry._index.cache_clear()
    registry.load.cache_clear()


def test_a_conforming_plugin_passes_every_check() -> None:
    assert ("passes", "conformance_good") in conformance.plugins({"passes": ["conformance_good"]})
    conformance.check_metadata("passes", "conformance_good")
    conformance.check_config_json("passes", "conformance_good")
    conformance.check_unknown_keys("passes", "conformance_good")
    conformance.check_search_space("passes", "conformance_good")
    conformance.check_deterministic("conformance_good")


def test_each_broken_contract_is_caught() -> None:
    with pytest.raises(AssertionError, match="accepts the unknown config key"):
        conformance.check_unknown_keys("passes", "conformance_loose")
    with pytest.raises(AssertionError, match="searches 'missing', which its config does not have"):
        conformance.check_search_space("passes", "conformance_wrong_space")
    with pytest.raises(AssertionError, match="different bytes"):
        conformance.check_deterministic("conformance_nondeterministic")
    with pytest.raises(AssertionError, match="names itself 'conformance_other_name'"):
        conformance.check_metadata("passes", "conformance_misnamed")


def test_one_call_gives_the_test_functions() -> None:
    tests = conformance.conformance_tests(only={"passes": ["conformance_good"]}, deterministic={"conformance_good": None})
    assert set(tests) == {"test_metadata", "test_config_json", "test_unknown_keys", "test_search_space", "test_deterministic"}
