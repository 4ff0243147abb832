"""Tiny real ONNX models, datasets and tokenizers for the evaluator and data-source tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core.artifact import ModelArtifact
from engine.core.data import Dataset
from engine.core.evaluator import EvalContext
from targets.onnxruntime import OnnxRuntimeTarget

VOCAB = 50
HIDDEN = 8


@dataclass
class TinyModel:
    """An embedding lookup then a projection; ``reference_output`` recomputes it in numpy."""

    artifact: ModelArtifact
    embedding: np.ndarray
    weight: np.ndarray
    pad_value: float

    def reference_output(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        hidden = self.embedding[input_ids].astype(np.float64) @ self.weight.astype(np.float64)
        return hidden + (1 - attention_mask)[..., None] * self.pad_value


def build_tiny_model(
    folder: Path,
    *,
    seed: int = 0,
    noise: float = 0.0,
    pad_value: float = 0.0,
    output_name: str = "last_hidden_state",
    pooled: bool = False,
    fp16_output: bool = False,
) -> TinyModel:
    """input_ids, attention_mask [batch, seq] int64 → Gather(embedding) → MatMul(weight), plus
    ``pad_value`` at the positions where the mask is 0 → ``output_name`` [batch, seq, HIDDEN].
    ``noise`` perturbs the projection (a "candidate" of the seed's model)."""
    rng = np.random.default_rng(seed)
    embedding = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    weight = rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32)
    if noise:
        weight = (weight + noise * np.random.default_rng(seed + 1000).standard_normal(weight.shape)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["embedded"]),
        helper.make_node("MatMul", ["embedded", "weight"], ["projected"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "mask_f"], ["pad_f"]),
        helper.make_node("Unsqueeze", ["pad_f", "last_axis"], ["pad_3d"]),
        helper.make_node("Mul", ["pad_3d", "pad_value"], ["pad_term"]),
        helper.make_node("Add", ["projected", "pad_term"], ["summed" if fp16_output else output_name]),
    ]
    if fp16_output:  # what a float16 conversion without keep_io_types gives
        nodes.append(helper.make_node("Cast", ["summed"], [output_name], to=TensorProto.FLOAT16))
    out_type = TensorProto.FLOAT16 if fp16_output else TensorProto.FLOAT
    outputs = [helper.make_tensor_value_info(output_name, out_type, ["batch", "sequence", HIDDEN])]
    if pooled:
        nodes.append(helper.make_node("ReduceMean", [output_name], ["pooled"], axes=[1], keepdims=0))
        outputs.append(helper.make_tensor_value_info("pooled", out_type, ["batch", HIDDEN]))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        outputs,
        initializer=[
            numpy_helper.from_array(embedding, "embedding"),
            numpy_helper.from_array(weight, "weight"),
            numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
            numpy_helper.from_array(np.array([-1], dtype=np.int64), "last_axis"),
            numpy_helper.from_array(np.array(pad_value, dtype=np.float32), "pad_value"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    return TinyModel(ModelArtifact.from_folder("onnx", folder), embedding, weight, pad_value)


def _token_dataset(samples: int = 6, sequence: int = 10, real: list[int] | None = None, seed: int = 3) -> Dataset:
    """Token ids with an attention mask whose first ``real[i]`` positions are 1 (default: all)."""
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(1, VOCAB, size=(samples, sequence)).astype(np.int64)
    mask = np.ones((samples, sequence), dtype=np.int64)
    for row, length in enumerate(real or []):
        mask[row, length:] = 0
        input_ids[row, length:] = 0
    return Dataset(inputs={"input_ids": input_ids, "attention_mask": mask})


@pytest.fixture
def token_dataset() -> Callable[..., Dataset]:
    """``token_dataset(samples, sequence, real=[lengths])``: token ids and a mask."""
    return _token_dataset


@pytest.fixture
def make_model(tmp_path: Path) -> Callable[..., TinyModel]:
    counter = iter(range(1000))

    def make(**options: object) -> TinyModel:
        return build_tiny_model(tmp_path / f"model{next(counter)}", **options)

    return make


@pytest.fixture
def cpu_target() -> OnnxRuntimeTarget:
    return OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="cpu", runtime="onnxruntime", intra_op_threads=1))


@pytest.fixture
def make_ctx(tmp_path: Path, cpu_target: OnnxRuntimeTarget) -> Callable[..., EvalContext]:
    def make(reference: ModelArtifact | None = None, **datasets: Dataset) -> EvalContext:
        return EvalContext(
            target=cpu_target,
            workdir=tmp_path,
            reference=reference,
            datasets={name: (lambda data=data: data) for name, data in datasets.items()},
        )

    return make


TOKEN_WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away"]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT WordPiece tokenizer with a 15-word vocabulary, built offline."""
    from transformers import BertTokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    vocab = folder / "source-vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *TOKEN_WORDS]) + "\n", encoding="utf-8")
    # transformers 5: BertTokenizerFast is BertTokenizer, whose vocabulary argument is `vocab`;
    # `vocab_file=` is silently ignored and leaves a 5-token vocabulary.
    tokenizer = BertTokenizer(vocab=str(vocab))
    assert len(tokenizer) == 5 + len(TOKEN_WORDS)
    out = folder / "tok"
    tokenizer.save_pretrained(str(out))
    (out / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    return out


def build_classifier(folder: Path, weight: np.ndarray, bias: np.ndarray | None = None, *, output_name: str = "logits") -> ModelArtifact:
    """input [batch, features] float32 → MatMul(weight) (+ bias) → ``output_name`` [batch, classes]:
    a linear classifier whose argmax numpy can predict exactly."""
    weight = np.asarray(weight, dtype=np.float32)
    features, classes = weight.shape
    initializers = [numpy_helper.from_array(weight, "weight")]
    nodes = [helper.make_node("MatMul", ["input", "weight"], ["scores" if bias is not None else output_name])]
    if bias is not None:
        initializers.append(numpy_helper.from_array(np.asarray(bias, dtype=np.float32), "bias"))
        nodes.append(helper.make_node("Add", ["scores", "bias"], [output_name]))
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", classes])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


@pytest.fixture
def make_classifier(tmp_path: Path) -> Callable[..., ModelArtifact]:
    """``make_classifier(weight, bias=None, output_name="logits")``: a linear ONNX classifier."""
    counter = iter(range(1000))

    def make(weight: np.ndarray, bias: np.ndarray | None = None, **options: Any) -> ModelArtifact:
        return build_classifier(tmp_path / f"classifier{next(counter)}", weight, bias, **options)

    return make
