"""Small real models, datasets and contexts shared by the OpenVINO / NNCF pass tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import transformers
from onnx import TensorProto, helper, numpy_helper

from engine.conformance import tiny_encoder
from engine.core import ModelArtifact, PassContext
from engine.core.data import Dataset
from engine.core.evaluator import EvalContext, MetricResult

TINY_BERT = {
    "vocab_size": 100,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
HIDDEN = 32


def make_ctx(root: Path, datasets: dict[str, Dataset] | None = None, measure: Any = None, step: str = "step") -> PassContext:
    ctx = PassContext(
        step_id=step,
        workdir=root / "work",
        output_dir=root / "out",
        datasets={name: (lambda data=data: data) for name, data in (datasets or {}).items()},
        measure=measure,
    )
    ctx.workdir.mkdir(parents=True)
    ctx.output_dir.mkdir(parents=True)
    return ctx


def save_onnx_folder(model: onnx.ModelProto, folder: Path) -> ModelArtifact:
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def mlp_onnx(folder: Path, seed: int = 0) -> ModelArtifact:
    """x [batch, 8] float32 -> MatMul -> Add -> Relu -> MatMul -> y [batch, 4]; also relu_out [batch, 16]."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
        helper.make_node("Add", ["h1", "b1"], ["h2"], name="bias1"),
        helper.make_node("Relu", ["h2"], ["relu_out"], name="relu"),
        helper.make_node("MatMul", ["relu_out", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("relu_out", TensorProto.FLOAT, ["batch", 16]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-tests")
    model.ir_version = 10
    return save_onnx_folder(model, folder)


def mlp_reference(folder: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The MLP in float64 numpy."""
    weights = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in onnx.load(str(folder / "model.onnx")).graph.initializer}
    relu = np.maximum(x.astype(np.float64) @ weights["w1"] + weights["b1"], 0)
    return relu @ weights["w2"], relu


def tiny_encoder_onnx(folder: Path, hidden: int = HIDDEN, vocab: int = 1000, seed: int = 0) -> ModelArtifact:
    """input_ids, attention_mask [batch, sequence] -> Gather -> MatMul -> Add -> Relu -> MatMul,
    masked -> last_hidden_state [batch, sequence, hidden] (``engine.conformance.tiny_encoder``)."""
    model = tiny_encoder(hidden, vocab, seed)
    return save_onnx_folder(model, folder)


def tiny_bert_folder(folder: Path) -> Path:
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(**TINY_BERT)).save_pretrained(folder)
    return folder


def export_tiny_bert(root: Path) -> ModelArtifact:
    """A random-weight 2-layer BERT exported to ONNX by the torch_export pass."""
    from passes.export.torch_export import TorchExport

    folder = tiny_bert_folder(root / "hf")
    return TorchExport()(ModelArtifact.from_folder("hf", folder), make_ctx(root / "export")).model


def tiny_bert_ir(root: Path) -> ModelArtifact:
    """The tiny BERT as OpenVINO IR (openvino_convert), for the NNCF passes."""
    from passes.openvino.convert import OpenVinoConvert

    return OpenVinoConvert()(export_tiny_bert(root / "bert"), make_ctx(root / "ir")).model


def text_dataset(
    samples: int, sequence: int = 16, vocab: int = TINY_BERT["vocab_size"], seed: int = 0, token_types: bool = True
) -> Dataset:
    """Random token ids, padding at the end of every other sample."""
    rng = np.random.default_rng(seed)
    mask = np.ones((samples, sequence), dtype=np.int64)
    mask[::2, sequence - sequence // 4 :] = 0
    inputs = {"input_ids": rng.integers(0, vocab, (samples, sequence), dtype=np.int64), "attention_mask": mask}
    if token_types:
        inputs["token_type_ids"] = np.zeros((samples, sequence), dtype=np.int64)
    return Dataset(inputs=inputs)


def masked_cosine(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Mean over samples of the cosine of the unpadded positions (float64)."""
    cosines = []
    for row in range(a.shape[0]):
        keep = mask[row] != 0
        x, y = a[row][keep].astype(np.float64).ravel(), b[row][keep].astype(np.float64).ravel()
        cosines.append(float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))))
    return float(np.mean(cosines))


def run_model(target: Any, model: ModelArtifact, data: Dataset) -> tuple[np.ndarray, dict[str, Any]]:
    """First output of ``model`` on every sample of ``data`` (batch 1), stacked; session details."""
    session = target.open_session(model)
    names = [spec.name for spec in session.inputs]
    outputs = [session.run({name: batch[name] for name in names})[0] for batch in data.batches(1)]
    details = dict(session.details)
    session.close()
    return np.concatenate(outputs), details


def fidelity_measure(
    target: Any, reference: ModelArtifact, data: Dataset, workdir: Path, calls: list[str] | None = None
) -> Callable[[str, ModelArtifact], MetricResult]:
    """A ``ctx.measure`` like the engine's: the fidelity evaluator on ``target`` against ``reference``."""
    from evaluators.fidelity import Fidelity

    workdir.mkdir(parents=True, exist_ok=True)

    def measure(evaluation: str, model: ModelArtifact) -> MetricResult:
        if evaluation != "fidelity":
            raise KeyError(evaluation)
        if calls is not None:
            calls.append(model.digest)
        ctx = EvalContext(target=target, workdir=workdir, reference=reference, datasets={"data": lambda: data})
        return Fidelity(Fidelity.Config(data="data")).evaluate(model, ctx)

    return measure
