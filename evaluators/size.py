"""Size: bytes on disk of a model, and bytes of its weights by element type.

ONNX weights are read from the graph (initializers, Constant nodes, subgraphs and functions)
without loading external data: their sizes come from the external data references. OpenVINO IR
weights are read from the ``Const`` layers of the .xml (offset and size into the .bin);
safetensors weights from their header. onnx is imported inside the function that reads ONNX, never
at module import: the engine imports this module at validate time.
"""

from __future__ import annotations

import json
import logging
import math
import struct
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import EvaluationError
from engine.core.evaluator import EvalContext, Evaluator, EvaluatorConfig, MetricResult
from engine.core.hashing import iter_files

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact

logger = logging.getLogger(__name__)

MIB = 2**20

#: bits per element of ONNX tensor element types, by TensorProto.DataType name (STRING varies)
_ONNX_BITS = {
    "FLOAT": 32, "UINT8": 8, "INT8": 8, "UINT16": 16, "INT16": 16, "INT32": 32, "INT64": 64, "BOOL": 8,
    "FLOAT16": 16, "DOUBLE": 64, "UINT32": 32, "UINT64": 64, "COMPLEX64": 64, "COMPLEX128": 128, "BFLOAT16": 16,
    "FLOAT8E4M3FN": 8, "FLOAT8E4M3FNUZ": 8, "FLOAT8E5M2": 8, "FLOAT8E5M2FNUZ": 8, "FLOAT8E8M0": 8,
    "UINT4": 4, "INT4": 4, "FLOAT4E2M1": 4, "UINT2": 2, "INT2": 2, "FLOAT6E2M3": 6, "FLOAT6E3M2": 6,
}  # fmt: skip
_ONNX_NAMES = {"FLOAT": "float32", "DOUBLE": "float64"}


class Size(Evaluator):
    """``file_bytes`` (every file of the model), ``file_mb`` (the same in MiB, 2**20 bytes) and,
    where the format tells, ``weights_bytes``: the bytes of the weights alone, with a split by
    element type in the details. Formats whose weights cannot be read return no weights_bytes."""

    name = "size"
    summary = "Bytes on disk of the model's files, and bytes of its weights by element type (ONNX, OpenVINO IR, safetensors)."
    version = "1"
    metrics = ("file_bytes", "file_mb", "weights_bytes")
    opens_session = False  # it reads files: the engine adds ``load`` where nothing else opens one

    class Config(EvaluatorConfig):
        pass

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        path = Path(model.path)
        if not path.exists():
            raise EvaluationError(f"the model's files are not at {path}")
        weights: dict[str, Any] | None
        extra_files: list[Path] = []
        if model.format == "onnx":
            weights = onnx_weights(model.model_file)
            extra_files = [model.model_file.parent / name for name in weights["external_files"]]
            missing = [f.name for f in extra_files if not f.is_file()]
            if missing:  # a model without its weights: no size to report, and no runtime can load it
                raise EvaluationError(f"the model's external data file(s) {', '.join(missing)} are missing")
        elif model.format == "openvino":
            xml = model.model_file
            weights = openvino_weights(xml)
            extra_files = [xml.with_suffix(".bin")]
        else:
            weights = safetensors_weights(path)
        files = {f.resolve() for f in iter_files(path)}
        files |= {f.resolve() for f in extra_files if f.is_file()}
        file_bytes = sum(f.stat().st_size for f in files)
        values = {"file_bytes": float(file_bytes), "file_mb": file_bytes / MIB}
        details: dict[str, Any] = {"format": model.format, "files": len(files), "largest_files": _largest(files, path)}
        if weights is not None:
            values["weights_bytes"] = float(weights["bytes"])
            details["weights"] = weights
        logger.debug("size of %s: %d bytes on disk", model.digest[:12], file_bytes)
        return MetricResult(values=values, details=details)


def _largest(files: set[Path], root: Path, count: int = 5) -> dict[str, int]:
    base = root if root.is_dir() else root.parent
    ranked = sorted(files, key=lambda f: (-f.stat().st_size, str(f)))[:count]
    return {(str(f.relative_to(base.resolve())) if f.is_relative_to(base.resolve()) else str(f)): f.stat().st_size for f in ranked}


class _Tally:
    def __init__(self) -> None:
        self.bytes: dict[str, int] = defaultdict(int)
        self.tensors: dict[str, int] = defaultdict(int)

    def add(self, dtype: str, size: int) -> None:
        self.bytes[dtype] += size
        self.tensors[dtype] += 1

    def summary(self, **extra: Any) -> dict[str, Any]:
        return {
            "bytes": sum(self.bytes.values()),
            "bytes_by_dtype": dict(sorted(self.bytes.items())),
            "tensors_by_dtype": dict(sorted(self.tensors.items())),
            **extra,
        }


def onnx_weights(model_file: Path) -> dict[str, Any]:
    """Bytes of every constant tensor of an ONNX model by element type, external data included
    (by the sizes its references give; the data itself is never loaded)."""
    try:
        import onnx
    except ImportError as error:
        from engine.core.errors import MissingDependency

        raise MissingDependency("onnx", "the size evaluator on ONNX models") from error
    try:
        model = onnx.load(str(model_file), load_external_data=False)
    except Exception as error:  # protobuf's decode errors have no common base worth naming
        raise EvaluationError(f"cannot read the ONNX model {model_file}: {type(error).__name__}: {error}") from error
    tally = _Tally()
    external: set[str] = set()

    def tensor(t: Any) -> None:
        type_name = onnx.TensorProto.DataType.Name(t.data_type)
        tally.add(_ONNX_NAMES.get(type_name, type_name.lower()), _onnx_tensor_bytes(onnx, t, type_name, model_file, external))

    def nodes(items: Any) -> None:
        for node in items:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR:
                    tensor(attribute.t)
                elif attribute.type == onnx.AttributeProto.SPARSE_TENSOR:
                    tensor(attribute.sparse_tensor.values)
                    tensor(attribute.sparse_tensor.indices)
                elif attribute.type == onnx.AttributeProto.GRAPH:
                    graph(attribute.g)
                elif attribute.type == onnx.AttributeProto.GRAPHS:
                    for sub in attribute.graphs:
                        graph(sub)

    def graph(g: Any) -> None:
        for t in g.initializer:
            tensor(t)
        for sparse in g.sparse_initializer:
            tensor(sparse.values)
            tensor(sparse.indices)
        nodes(g.node)

    graph(model.graph)
    for function in model.functions:
        nodes(function.node)
    return tally.summary(external_files=sorted(external))


def _onnx_tensor_bytes(onnx: Any, t: Any, type_name: str, model_file: Path, external: set[str]) -> int:
    """The bytes of one ONNX tensor; the external data files it names are added to ``external``."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        info = {entry.key: entry.value for entry in t.external_data}
        location = model_file.parent / info.get("location", "")
        external.add(info.get("location", ""))
        if "length" in info:
            return int(info["length"])
        return max(0, location.stat().st_size - int(info.get("offset", 0))) if location.is_file() else 0
    if t.raw_data:
        return len(t.raw_data)
    if t.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in t.string_data)
    return math.ceil(math.prod(t.dims) * _ONNX_BITS.get(type_name, 8) / 8)


def openvino_weights(xml: Path) -> dict[str, Any]:
    """Bytes of the ``Const`` layers of an OpenVINO IR by element type (each region of the .bin
    counted once, however many layers share it), and the size of the .bin."""
    try:
        root = ElementTree.parse(xml).getroot()
    except (ElementTree.ParseError, OSError) as error:
        raise EvaluationError(f"cannot read the OpenVINO IR {xml}: {error}") from error
    tally = _Tally()
    seen: set[tuple[int, int]] = set()
    for layer in root.iter("layer"):
        if layer.get("type") != "Const":
            continue
        data = layer.find("data")
        if data is None or data.get("size") is None:
            continue
        region = (int(data.get("offset", "0")), int(data.get("size", "0")))
        if region in seen:
            continue
        seen.add(region)
        tally.add(data.get("element_type", "unknown"), region[1])
    binary = xml.with_suffix(".bin")
    return tally.summary(bin_bytes=binary.stat().st_size if binary.is_file() else None)


def safetensors_weights(root: Path) -> dict[str, Any] | None:
    """Bytes of the tensors of the ``*.safetensors`` files under ``root`` by dtype, read from
    their headers; None when there are none."""
    files = sorted(root.rglob("*.safetensors")) if root.is_dir() else ([root] if root.suffix == ".safetensors" else [])
    if not files:
        return None
    tally = _Tally()
    for file in files:
        try:
            with open(file, "rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(length))
        except (OSError, struct.error, ValueError) as error:
            raise EvaluationError(f"cannot read the safetensors header of {file}: {error}") from error
        for name, info in header.items():
            if name != "__metadata__":
                start, stop = info["data_offsets"]
                tally.add(str(info["dtype"]).lower(), int(stop) - int(start))
    return tally.summary(files=[str(f.relative_to(root)) if root.is_dir() else f.name for f in files])
