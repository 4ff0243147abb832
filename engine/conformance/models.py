"""The tiny models the conformance checks run on, which plugin tests use too: built in memory, no
download."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_onnx_model(folder: Path) -> Path:
    """A small float model (MatMul with a 64x64 weight, Add, Relu) saved as ``folder/model.onnx``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "weight")
    bias = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "bias")
    nodes = [
        helper.make_node("MatMul", ["x", "weight"], ["h"], name="matmul"),
        helper.make_node("Add", ["h", "bias"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [weight, bias],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, str(folder / "model.onnx"))
    return folder / "model.onnx"


def tiny_encoder(hidden: int = 32, vocab: int = 1000, seed: int = 0) -> Any:
    """A tiny text encoder as an ``onnx.ModelProto`` (checked, not saved): input_ids,
    attention_mask [batch, sequence] -> Gather(embeddings) -> MatMul -> Add -> Relu -> MatMul ->
    last_hidden_state [batch, sequence, hidden], masked positions zeroed. Plugin tests run on it."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "embeddings"),
        numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32) * 0.1, "b1"),
        numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "last_axis"),
    ]
    nodes = [
        helper.make_node("Gather", ["embeddings", "input_ids"], ["embedded"]),
        helper.make_node("MatMul", ["embedded", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("MatMul", ["h3", "w2"], ["h4"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last_axis"], ["mask_3d"]),
        helper.make_node("Mul", ["h4", "mask_3d"], ["last_hidden_state"]),
    ]
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"]) for name in ("input_ids", "attention_mask")]
    output = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden])
    graph = helper.make_graph(nodes, "tiny_encoder", inputs, [output], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-tests")
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model
