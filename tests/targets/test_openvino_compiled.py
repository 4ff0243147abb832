"""OpenVINO's compiled models kept in the target cache (targets.openvino_compiled): a second
session imports the blob, a blob whose bytes changed or that was never stamped is removed and
compiled again, large models and targets without a cache compile every time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core.artifact import ModelArtifact
from engine.core.hashing import sha256_file
from targets import openvino_compiled
from targets.openvino import OpenVinoTarget

X = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)


def mlp(folder: Path) -> ModelArtifact:
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        initializer=[numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    folder.mkdir(parents=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def target(cache: Path | None) -> OpenVinoTarget:
    made = OpenVinoTarget(OpenVinoTarget.Config(id="ov", runtime="openvino", device="CPU", inference_num_threads=1))
    made.cache_dir = cache
    return made


def run(model: ModelArtifact, cache: Path | None) -> np.ndarray:
    session = target(cache).open_session(model)
    try:
        assert "CACHE_DIR" not in session.details["compile_config"]  # a store path, not a setting to deploy with
        return session.run({"x": X})[0]
    finally:
        session.close()


def blobs(cache: Path, model: ModelArtifact) -> list[Path]:
    return sorted(p for p in (cache / "compiled" / model.digest).iterdir() if p.name != openvino_compiled.STAMP)


def stamp(cache: Path, model: ModelArtifact) -> dict[str, dict]:
    return json.loads((cache / "compiled" / model.digest / openvino_compiled.STAMP).read_text())


@pytest.fixture
def model(tmp_path: Path) -> ModelArtifact:
    return mlp(tmp_path / "model")


def test_a_second_session_imports_the_stamped_blob(model: ModelArtifact, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = run(model, cache)
    (blob,) = blobs(cache, model)
    written = blob.stat().st_mtime_ns
    assert set(stamp(cache, model)) == {blob.name}
    again = run(model, cache)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(first, run(model, None), rtol=1e-5, atol=1e-6)
    assert blobs(cache, model) == [blob] and blob.stat().st_mtime_ns == written  # imported, not written again


def test_a_blob_whose_bytes_changed_is_compiled_again(model: ModelArtifact, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    expected = run(model, cache)
    (blob,) = blobs(cache, model)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    tampered = sha256_file(blob)
    np.testing.assert_array_equal(run(model, cache), expected)
    (blob,) = blobs(cache, model)
    assert sha256_file(blob) == stamp(cache, model)[blob.name]["sha256"] != tampered


def test_a_file_never_stamped_is_removed(model: ModelArtifact, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    run(model, cache)
    stray = cache / "compiled" / model.digest / "left_by_a_crash.blob"
    stray.write_bytes(b"half a blob")
    run(model, cache)
    assert not stray.exists() and stray.name not in stamp(cache, model)


def test_large_models_and_targets_without_a_cache_compile_every_time(
    model: ModelArtifact, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(model, None)
    monkeypatch.setattr(openvino_compiled, "MAX_BYTES", 16)
    run(model, tmp_path / "cache")
    assert not (tmp_path / "cache" / "compiled").exists()
