"""Model formats are registrable: a plugin adds one (a native runtime's plan, say) without SDK edits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.core import FORMATS, ModelArtifact, Pass, PassContext, PassResult, register_format
from engine.core.hashing import sha256_json
from engine.store import records


@pytest.fixture
def plan_format() -> Iterator[str]:
    register_format("test_plan", "model.plan")
    yield "test_plan"
    FORMATS.pop("test_plan", None)


class PlanBuilder(Pass):
    name = "test_plan_builder"
    summary = "Writes a plan file."
    accepts = ("onnx",)
    produces = "test_plan"

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        (ctx.output_dir / "model.plan").write_bytes(b"plan")
        return PassResult(ModelArtifact.from_folder("test_plan", ctx.output_dir))


def test_an_unregistered_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown model format 'test_plan'"):
        ModelArtifact(format="test_plan", path=Path("x"), digest="0" * 64)


def test_a_registered_format_is_a_model_artifact_with_its_model_file(plan_format: str, tmp_path: Path) -> None:
    (tmp_path / "model.plan").write_bytes(b"plan")
    artifact = ModelArtifact.from_folder(plan_format, tmp_path)
    assert artifact.model_file == tmp_path / "model.plan"
    assert ModelArtifact.from_json(artifact.to_json()) == artifact


def test_a_pass_can_produce_a_registered_format(plan_format: str, tmp_path: Path) -> None:
    onnx_dir = tmp_path / "in"
    onnx_dir.mkdir()
    (onnx_dir / "model.onnx").write_bytes(b"onnx")
    out = tmp_path / "out"
    out.mkdir()
    ctx = PassContext(step_id="plan", workdir=tmp_path, output_dir=out)
    result = PlanBuilder()(ModelArtifact.from_folder("onnx", onnx_dir), ctx)
    assert result.model.format == plan_format and result.model.model_file.read_bytes() == b"plan"


def test_a_store_record_of_a_registered_format_is_served(plan_format: str) -> None:
    doc = {"what": "a pass"}
    key = sha256_json(doc)
    record = {"key": key, "key_doc": doc, "kind": "pass", "digest": "a" * 64, "format": plan_format}
    assert records.problem(key, record) is None
    assert "format" in (records.problem(key, {**record, "format": "no_such_format"}) or "")


def test_a_format_is_registered_once_with_one_model_file(plan_format: str) -> None:
    register_format(plan_format, "model.plan")  # the same again: fine
    with pytest.raises(ValueError, match="registered with model file"):
        register_format(plan_format, "other.bin")
    with pytest.raises(ValueError, match="format name"):
        register_format("../escape")
