"""The size evaluator: files on disk and weights by element type for ONNX, OpenVINO IR, safetensors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core.artifact import ModelArtifact
from evaluators.size import MIB, Size

# the tiny model's constant tensors: embedding [50, 8] and weight [8, 8] float32, one, pad_value
# (float32 scalars), last_axis (one int64)
TINY_FLOAT32 = (50 * 8 + 8 * 8 + 2) * 4
TINY_INT64 = 8


def size(model: ModelArtifact, ctx) -> dict[str, float]:
    return Size().evaluate(model, ctx).values


def test_onnx_files_and_weights_by_dtype(make_model, make_ctx) -> None:
    model = make_model().artifact
    result = Size().evaluate(model, make_ctx())
    on_disk = (model.path / "model.onnx").stat().st_size
    assert result.values["file_bytes"] == on_disk
    assert result.values["file_mb"] == pytest.approx(on_disk / MIB)
    assert result.values["weights_bytes"] == TINY_FLOAT32 + TINY_INT64
    weights = result.details["weights"]
    assert weights["bytes_by_dtype"] == {"float32": TINY_FLOAT32, "int64": TINY_INT64}
    assert weights["tensors_by_dtype"] == {"float32": 4, "int64": 1}
    assert weights["external_files"] == []


def test_external_data_is_counted_without_being_loaded(tmp_path, make_model, make_ctx) -> None:
    source = make_model().artifact
    folder = tmp_path / "external"
    folder.mkdir()
    proto = onnx.load(str(source.model_file))
    onnx.save_model(proto, str(folder / "model.onnx"), save_as_external_data=True, location="weights.bin", size_threshold=64)
    model = ModelArtifact.from_folder("onnx", folder)
    result = Size().evaluate(model, make_ctx())
    assert result.values["weights_bytes"] == TINY_FLOAT32 + TINY_INT64
    assert result.details["weights"]["external_files"] == ["weights.bin"]
    total = (folder / "model.onnx").stat().st_size + (folder / "weights.bin").stat().st_size
    assert result.values["file_bytes"] == total
    assert result.values["file_bytes"] > (folder / "model.onnx").stat().st_size + TINY_FLOAT32 - 400


def test_constants_subgraphs_and_typed_fields_are_counted(tmp_path, make_ctx) -> None:
    half = numpy_helper.from_array(np.zeros((4, 4), np.float16), "half")
    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.zeros(10, np.int8), "c"))],
        "branch",
        [],
        [helper.make_tensor_value_info("c", TensorProto.INT8, [10])],
    )
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])  # float_data, not raw bytes
    graph = helper.make_graph(
        [
            helper.make_node("If", ["flag"], ["out"], then_branch=branch, else_branch=branch),
            helper.make_node("Identity", ["half"], ["h"]),
            helper.make_node("Identity", ["typed"], ["t"]),
        ],
        "g",
        [helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [
            helper.make_tensor_value_info("out", TensorProto.INT8, [10]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT16, [4, 4]),
            helper.make_tensor_value_info("t", TensorProto.FLOAT, [3]),
        ],
        initializer=[half, typed],
    )
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(folder / "model.onnx"))
    weights = Size().evaluate(ModelArtifact.from_folder("onnx", folder), make_ctx()).details["weights"]
    assert weights["bytes_by_dtype"] == {"float16": 32, "float32": 12, "int8": 20}


def write_ir(folder: Path, layers: list[tuple[str, int, int]], bin_bytes: int) -> ModelArtifact:
    folder.mkdir(parents=True, exist_ok=True)
    body = "".join(
        f'<layer id="{i}" name="c{i}" type="Const" version="opset1"><data element_type="{et}" shape="1" offset="{offset}" size="{size}"/></layer>'
        for i, (et, offset, size) in enumerate(layers)
    )
    (folder / "model.xml").write_text(f'<?xml version="1.0"?><net name="m" version="11"><layers>{body}</layers></net>')
    (folder / "model.bin").write_bytes(b"\0" * bin_bytes)
    return ModelArtifact.from_folder("openvino", folder)


def test_openvino_ir_constants_by_element_type_shared_regions_once(tmp_path, make_ctx) -> None:
    model = write_ir(tmp_path / "ir", [("f32", 0, 400), ("i8", 400, 100), ("f32", 0, 400), ("u4", 512, 50)], 600)
    result = Size().evaluate(model, make_ctx())
    assert result.values["weights_bytes"] == 550
    assert result.details["weights"]["bytes_by_dtype"] == {"f32": 400, "i8": 100, "u4": 50}
    assert result.details["weights"]["bin_bytes"] == 600
    assert result.values["file_bytes"] == 600 + (tmp_path / "ir" / "model.xml").stat().st_size


def test_a_real_openvino_conversion_keeps_the_weight_bytes(tmp_path, make_model, make_ctx) -> None:
    ov = pytest.importorskip("openvino")
    source = make_model().artifact
    folder = tmp_path / "ov"
    folder.mkdir()
    ov.save_model(ov.convert_model(str(source.model_file)), str(folder / "model.xml"), compress_to_fp16=False)
    result = Size().evaluate(ModelArtifact.from_folder("openvino", folder), make_ctx())
    assert result.details["weights"]["bytes_by_dtype"].get("f32", 0) >= (50 * 8 + 8 * 8) * 4


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * offset)


def test_a_hugging_face_folder_reads_safetensors_headers(tmp_path, make_ctx) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    write_safetensors(folder / "model.safetensors", {"a": ("F32", [4, 4], 64), "b": ("BF16", [8], 16)})
    result = Size().evaluate(ModelArtifact(format="hf", path=folder, digest="0" * 64), make_ctx())
    assert result.values["weights_bytes"] == 80
    assert result.details["weights"]["bytes_by_dtype"] == {"bf16": 16, "f32": 64}
    assert result.values["file_bytes"] == sum(f.stat().st_size for f in folder.iterdir())


def test_a_format_without_readable_weights_reports_files_only(tmp_path, make_ctx) -> None:
    folder = tmp_path / "torch"
    folder.mkdir()
    (folder / "factory.json").write_text("{}")
    values = size(ModelArtifact(format="torch", path=folder, digest="0" * 64), make_ctx())
    assert set(values) == {"file_bytes", "file_mb"}
    assert values["file_bytes"] == 2


def test_an_unreadable_onnx_file_is_an_evaluation_error(tmp_path, make_ctx) -> None:
    from engine.core.errors import EvaluationError

    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"\xff\xfe not protobuf")
    with pytest.raises(EvaluationError, match="cannot read the ONNX model"):
        Size().evaluate(ModelArtifact.from_folder("onnx", folder), make_ctx())
