"""graph_surgery on the smallest graph that holds each surgeon's pattern: the rewrite happened
(op types, names, dims afterwards) and, where the surgeon claims equivalence, onnxruntime gives
the same outputs before and after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from engine.core import ModelArtifact, PassContext, PassError, PassResult
from passes.graph.graph_surgery import GraphSurgery

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


def _model(
    nodes: list, inputs: list, outputs: list, weights: dict[str, np.ndarray] | None = None, opsets: dict[str, int] | None = None
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in (weights or {}).items()])
    imports = [helper.make_opsetid(domain, version) for domain, version in {"": 17, **(opsets or {})}.items()]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _io(name: str, shape: list, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _surgery(root: Path, model: onnx.ModelProto, *surgeries: dict[str, Any], **config: Any) -> PassResult:
    folder = root / "in"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    (root / "work").mkdir(parents=True, exist_ok=True)
    ctx = PassContext(step_id="surgery", workdir=root / "work", output_dir=root / "out")
    cfg = GraphSurgery.Config(surgeries=list(surgeries), **config)
    return GraphSurgery(cfg)(ModelArtifact.from_folder("onnx", folder), ctx)


def _out(result: PassResult) -> onnx.ModelProto:
    return onnx.load(str(result.model.model_file))


def _ops(result: PassResult) -> list[str]:
    return [node.op_type for node in _out(result).graph.node]


def _run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _same_outputs(root: Path, result: PassResult, feeds: dict[str, np.ndarray], **tolerance: float) -> None:
    before, after = _run(root / "in" / "model.onnx", feeds), _run(result.model.model_file, feeds)
    for old, new in zip(before, after, strict=True):
        np.testing.assert_allclose(new, old, **({"rtol": 1e-5, "atol": 1e-5} | tolerance))


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


X = RNG.standard_normal((3, 4)).astype(np.float32)
W = RNG.standard_normal((4, 5)).astype(np.float32)
B = RNG.standard_normal(5).astype(np.float32)


# -- configuration ---------------------------------------------------------------------------------
def test_unknown_surgeon_is_a_validation_error_with_a_suggestion() -> None:
    with pytest.raises(ValidationError, match="unknown surgeon 'GemmToMatmulAd'; did you mean 'GemmToMatMulAdd'"):
        GraphSurgery.Config(surgeries=[{"surgeon": "GemmToMatmulAd"}])


def test_olive_surgeon_kiln_lacks_is_refused_as_not_implemented() -> None:
    with pytest.raises(ValidationError, match="'ReplaceErfWithTanh' \\(an Olive surgeon\\) is not implemented"):
        GraphSurgery.Config(surgeries=[{"surgeon": "ReplaceErfWithTanh"}])


def test_bad_option_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="use_large"):
        GraphSurgery.Config(surgeries=[{"surgeon": "RemoveRopeMultiCache", "use_large": True}])
    with pytest.raises(ValidationError, match="dim_idx"):
        GraphSurgery.Config(surgeries=[{"surgeon": "RenameOutputDims", "output_idx": 0, "dim_idx": -1, "dim_name": "n"}])
    with pytest.raises(ValidationError, match="pair up"):
        GraphSurgery.Config(surgeries=[{"surgeon": "RenameInputs", "old_names": ["a", "b"], "new_names": ["c"]}])


def test_surgeon_names_ignore_case_as_olive_does() -> None:
    cfg = GraphSurgery.Config(surgeries=[{"surgeon": "gemmtomatmuladd"}])
    assert cfg.surgeries[0].surgeon == "GemmToMatMulAdd"


def test_absent_pattern_is_reported_and_fails_when_required(tmp_path: Path) -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", [3, 4])], [_io("y", [3, 4])])
    result = _surgery(tmp_path / "a", model, {"surgeon": "GemmToMatMulAdd"})
    assert result.details["surgeries"] == {"GemmToMatMulAdd": "not applied: no Gemm in the graph"}
    with pytest.raises(PassError, match="require_applied: GemmToMatMulAdd: not applied: no Gemm"):
        _surgery(tmp_path / "b", model, {"surgeon": "GemmToMatMulAdd"}, require_applied=True)
    with pytest.raises(PassError, match="require_applied"):
        _surgery(tmp_path / "c", model, {"surgeon": "GemmToMatMulAdd", "require_applied": True})


# -- Gemm / MatMul ---------------------------------------------------------------------------------
def test_gemm_to_matmul_add_transposes_a_constant_weight_and_matches(tmp_path: Path) -> None:
    gemm = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)
    model = _model([gemm], [_io("x", [3, 4])], [_io("y", [3, 5])], {"w": W.T.copy(), "b": B})
    result = _surgery(tmp_path, model, {"surgeon": "GemmToMatMulAdd"})
    assert _ops(result) == ["MatMul", "Add"]
    assert [o.name for o in _out(result).graph.output] == ["y"]
    assert result.details["surgeries"] == {"GemmToMatMulAdd": "applied: 1 rewrite"}
    _same_outputs(tmp_path, result, {"x": X})


def test_gemm_with_alpha_is_left_and_says_why(tmp_path: Path) -> None:
    gemm = helper.make_node("Gemm", ["x", "w", "b"], ["y"], alpha=2.0)
    result = _surgery(tmp_path, _model([gemm], [_io("x", [3, 4])], [_io("y", [3, 5])], {"w": W, "b": B}), {"surgeon": "GemmToMatMulAdd"})
    assert _ops(result) == ["Gemm"]
    assert "alpha" in result.details["surgeries"]["GemmToMatMulAdd"]


def test_matmul_add_to_gemm_reshapes_a_3d_input_and_matches(tmp_path: Path) -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["b", "m"], ["y"])]
    model = _model(nodes, [_io("x", [2, 3, 4])], [_io("y", [2, 3, 5])], {"w": W, "b": B})
    result = _surgery(tmp_path, model, {"surgeon": "MatMulAddToGemm"})
    assert _ops(result) == ["Reshape", "Gemm", "Reshape"]
    _same_outputs(tmp_path, result, {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)})


def test_reciprocal_mul_to_div_matches(tmp_path: Path) -> None:
    nodes = [helper.make_node("Reciprocal", ["d"], ["r"]), helper.make_node("Mul", ["r", "x"], ["y"])]
    model = _model(nodes, [_io("x", [3, 4]), _io("d", [3, 4])], [_io("y", [3, 4])])
    result = _surgery(tmp_path, model, {"surgeon": "ReciprocalMulToDiv"})
    assert _ops(result) == ["Div"]
    _same_outputs(tmp_path, result, {"x": X, "d": RNG.uniform(0.5, 2, (3, 4)).astype(np.float32)})


def test_matmul_add_relu_reshapes_after_the_relu(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    model = _model(nodes, [_io("x", [2, 3, 4])], [_io("y", [2, 3, 5])], {"w": W, "b": B})
    result = _surgery(tmp_path, model, {"surgeon": "MatMulAddToGemm"})
    assert _ops(result) == ["Reshape", "Gemm", "Relu", "Reshape"]
    _same_outputs(tmp_path, result, {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)})


# -- normalizations --------------------------------------------------------------------------------
def test_pow_reduce_sum_pow_div_becomes_lp_norm_and_matches(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=1),
        helper.make_node("Pow", ["s", "half"], ["n"]),
        helper.make_node("Div", ["x", "n"], ["y"]),
    ]
    weights = {"two": np.array(2.0, np.float32), "half": np.array(0.5, np.float32), "axes": np.array([-1], np.int64)}
    result = _surgery(tmp_path, _model(nodes, [_io("x", [3, 4])], [_io("y", [3, 4])], weights), {"surgeon": "PowReduceSumPowDiv2LpNorm"})
    assert _ops(result) == ["LpNormalization"]
    _same_outputs(tmp_path, result, {"x": X})


def test_lp_norm_over_another_axis_is_not_rewritten(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes"], ["s"], keepdims=1),
        helper.make_node("Pow", ["s", "half"], ["n"]),
        helper.make_node("Div", ["x", "n"], ["y"]),
    ]
    weights = {"two": np.array(2.0, np.float32), "half": np.array(0.5, np.float32), "axes": np.array([0], np.int64)}
    result = _surgery(tmp_path, _model(nodes, [_io("x", [3, 4])], [_io("y", [3, 4])], weights), {"surgeon": "PowReduceSumPowDiv2LpNorm"})
    assert "LpNormalization" not in _ops(result)
    assert "does not reduce the last axis" in result.details["surgeries"]["PowReduceSumPowDiv2LpNorm"]


def test_simplified_layer_norm_becomes_l2_norm_times_scaled_weight(tmp_path: Path) -> None:
    gamma = RNG.uniform(0.5, 1.5, 4).astype(np.float32)
    nodes = [
        helper.make_node(
            "SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["h", "", "", "sum"], domain="com.microsoft", epsilon=1e-12
        ),
        helper.make_node("SimplifiedLayerNormalization", ["sum", "gamma"], ["y"], axis=-1, epsilon=1e-12),
    ]
    model = _model(
        nodes, [_io("x", [3, 4]), _io("skip", [3, 4])], [_io("h", [3, 4]), _io("y", [3, 4])], {"gamma": gamma}, {"com.microsoft": 1}
    )
    result = _surgery(tmp_path, model, {"surgeon": "SimplifiedLayerNormToL2Norm"})
    assert sorted(_ops(result)) == ["Add", "LpNormalization", "LpNormalization", "Mul", "Mul"]
    assert result.details["surgeries"] == {"SimplifiedLayerNormToL2Norm": "applied: 2 rewrites"}
    # the shared weight is scaled once, into one new initializer
    assert [t.name for t in _out(result).graph.initializer] == ["gamma_l2norm"]
    _same_outputs(tmp_path, result, {"x": X, "skip": RNG.standard_normal((3, 4)).astype(np.float32)}, rtol=1e-4)


# -- embeddings ------------------------------------------------------------------------------------
def _decoder(table: np.ndarray, head: np.ndarray) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["h"], name="/model/embed_tokens/Gather"),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "lm"], ["logits"], name="/lm_head/MatMul"),
    ]
    vocab = table.shape[0]
    inputs = [_io("input_ids", ["batch", "seq"], TensorProto.INT64)]
    return _model(nodes, inputs, [_io("logits", ["batch", "seq", vocab])], {"embed": table, "lm": head})


TABLE = RNG.standard_normal((10, 32)).astype(np.float32)
IDS = np.array([[1, 4, 9], [0, 2, 2]], np.int64)


def test_tie_word_embeddings_reads_the_table_once_and_matches(tmp_path: Path) -> None:
    result = _surgery(tmp_path, _decoder(TABLE, TABLE.T.copy()), {"surgeon": "TieWordEmbeddings"})
    out = _out(result)
    assert [t.name for t in out.graph.initializer if t.dims == [10, 32]] == ["embed"]
    assert "Gemm" in _ops(result) and "MatMul" not in _ops(result)
    assert [o.name for o in out.graph.output] == ["logits"]
    _same_outputs(tmp_path, result, {"input_ids": IDS})


def test_tie_word_embeddings_refuses_different_weights(tmp_path: Path) -> None:
    result = _surgery(tmp_path, _decoder(TABLE, TABLE.T + 1), {"surgeon": "TieWordEmbeddings"})
    assert (
        result.details["surgeries"]["TieWordEmbeddings"]
        == "not applied: the LM head's weight is not the transposed embedding table (weights differ)"
    )


def test_quantize_embedding_int8_then_share_with_an_nbits_lm_head(tmp_path: Path) -> None:
    first = _surgery(tmp_path / "q", _decoder(TABLE, TABLE.T.copy()), {"surgeon": "QuantizeEmbeddingInt8"})
    assert "com.microsoft:GatherBlockQuantized" in first.details["op_delta"]
    after = _run(first.model.model_file, {"input_ids": IDS})[0]
    before = _run(tmp_path / "q" / "in" / "model.onnx", {"input_ids": IDS})[0]
    np.testing.assert_allclose(after, before, atol=0.2)  # INT8 blocks: a small quantization error
    # an lm_head MatMulNBits (4 bits, any weights) is replaced by an 8-bit one over the embedding's table
    model = _out(first)
    weight = numpy_helper.from_array(np.zeros((10, 1, 16), np.uint8), "lm_q")
    scales = numpy_helper.from_array(np.ones(10, np.float32), "lm_scales")
    model.graph.initializer.extend([weight, scales])
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    nbits = helper.make_node(
        "MatMulNBits",
        [matmul.input[0], "lm_q", "lm_scales"],
        ["logits"],
        name="/lm_head/MatMulNBits",
        domain="com.microsoft",
        K=32,
        N=10,
        bits=4,
        block_size=32,
    )
    model.graph.node.remove(matmul)
    model.graph.node.append(nbits)
    shared = _surgery(tmp_path / "s", model, {"surgeon": "ShareEmbeddingLmHead"})
    head = next(n for n in _out(shared).graph.node if n.op_type == "MatMulNBits")
    assert helper.get_attribute_value(next(a for a in head.attribute if a.name == "bits")) == 8
    assert "lm_q" not in {t.name for t in _out(shared).graph.initializer}
    tied = _run(shared.model.model_file, {"input_ids": IDS})[0]
    np.testing.assert_allclose(tied, before, atol=0.5)  # the head is the (quantized) transposed table


# -- renames ---------------------------------------------------------------------------------------
def test_renames_of_inputs_and_dims(tmp_path: Path) -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", [1, 4])], [_io("y", [1, 4])])
    result = _surgery(
        tmp_path,
        model,
        {"surgeon": "RenameInputs", "old_names": ["x"], "new_names": ["pixels"]},
        {"surgeon": "RenameInputDims", "input_name": "pixels", "dim_idx": 0, "dim_name": "batch"},
        {"surgeon": "RenameOutputDims", "output_idx": 0, "dim_idx": 0, "dim_name": "batch"},
    )
    graph = _out(result).graph
    assert graph.input[0].name == "pixels" and graph.node[0].input[0] == "pixels"
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert _run(result.model.model_file, {"pixels": np.ones((3, 4), np.float32)})[0].shape == (3, 4)


def test_rename_of_a_missing_output_fails(tmp_path: Path) -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_io("x", [1, 4])], [_io("y", [1, 4])])
    with pytest.raises(PassError, match="output_idx 2 is out of range"):
        _surgery(tmp_path, model, {"surgeon": "RenameOutputDims", "output_idx": 2, "dim_idx": 0, "dim_name": "n"})


# -- cleanups --------------------------------------------------------------------------------------
def test_deduplicate_nodes_keeps_the_first_producer_and_matches(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Cast", ["x"], ["c"], to=F, name="a"),
        helper.make_node("Cast", ["x"], ["c"], to=F, name="b"),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    model = _model(nodes, [_io("x", [3, 4])], [_io("y", [3, 4])])
    result = _surgery(tmp_path, model, {"surgeon": "DeduplicateNodes"})
    assert [n.name for n in _out(result).graph.node if n.op_type == "Cast"] == ["a"]
    assert result.details["surgeries"] == {"DeduplicateNodes": "applied: 1 rewrite"}
    expected = np.maximum(X, 0)
    np.testing.assert_allclose(_run(result.model.model_file, {"x": X})[0], expected)


def _if_model(branch_initializers: list[onnx.TensorProto]) -> onnx.ModelProto:
    then = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"])], "then", [], [_io("t", [4])], branch_initializers)
    other = helper.make_graph([helper.make_node("Sub", ["x", "w2"], ["e"])], "else", [], [_io("e", [4])])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)
    return _model([node], [_io("cond", [], TensorProto.BOOL), _io("x", [4])], [_io("y", [4])], {"w2": np.ones(4, np.float32)})


def test_deduplicate_subgraph_initializers_and_matches(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.full(4, 3.0, np.float32), "w")
    result = _surgery(tmp_path, _if_model([w, w]), {"surgeon": "DeduplicateSubgraphInitializers"})
    branch = next(a.g for a in _out(result).graph.node[0].attribute if a.name == "then_branch")
    assert [t.name for t in branch.initializer] == ["w"]
    feeds = {"cond": np.array(True), "x": np.arange(4, dtype=np.float32)}
    np.testing.assert_allclose(_run(result.model.model_file, feeds)[0], np.arange(4) + 3.0)


def test_remove_memcpy_bypasses_copies_and_keeps_output_names(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("MemcpyToHost", ["x"], ["xc"], domain="com.microsoft"),
        helper.make_node("Relu", ["xc"], ["r"]),
        helper.make_node("MemcpyFromHost", ["r"], ["y"], domain="com.microsoft"),
    ]
    model = _model(nodes, [_io("x", [3, 4])], [_io("y", [3, 4])], opsets={"com.microsoft": 1})
    result = _surgery(tmp_path, model, {"surgeon": "RemoveMemcpy"})
    assert _ops(result) == ["Relu"]
    assert [o.name for o in _out(result).graph.output] == ["y"]
    np.testing.assert_allclose(_run(result.model.model_file, {"x": X})[0], np.maximum(X, 0))


# -- decoders --------------------------------------------------------------------------------------
def _cache_branch(size: str, rows: int) -> onnx.GraphProto:
    cos, sin = np.cos(np.arange(rows * 2).reshape(rows, 2) / 7), np.sin(np.arange(rows * 2).reshape(rows, 2) / 7)
    nodes = [
        helper.make_node("Constant", [], [f"cos_cache_{size}"], value=numpy_helper.from_array(cos.astype(np.float32))),
        helper.make_node("Constant", [], [f"sin_cache_{size}"], value=numpy_helper.from_array(sin.astype(np.float32))),
    ]
    return helper.make_graph(nodes, size, [], [_io(f"cos_cache_{size}", [rows, 2]), _io(f"sin_cache_{size}", [rows, 2])])


def test_remove_rope_multi_cache_keeps_one_cache_and_matches_for_short_sequences(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Greater", ["total", "limit"], ["long"]),
        helper.make_node("If", ["long"], ["cos", "sin"], then_branch=_cache_branch("large", 16), else_branch=_cache_branch("small", 8)),
        helper.make_node("RotaryEmbedding", ["x", "position_ids", "cos", "sin"], ["y"], domain="com.microsoft", num_heads=1),
    ]
    inputs = [_io("x", [1, 3, 4]), _io("position_ids", [1, 3], TensorProto.INT64), _io("total", [], TensorProto.INT64)]
    model = _model(nodes, inputs, [_io("y", [1, 3, 4])], {"limit": np.array(8, np.int64)}, {"com.microsoft": 1})
    result = _surgery(tmp_path, model, {"surgeon": "RemoveRopeMultiCache"})
    assert _ops(result) == ["RotaryEmbedding"]
    assert list(_out(result).graph.node[0].input[2:]) == ["cos_cache_single", "sin_cache_single"]
    feeds = {"x": RNG.standard_normal((1, 3, 4)).astype(np.float32), "position_ids": np.array([[0, 1, 2]]), "total": np.array(3)}
    _same_outputs(tmp_path, result, feeds)


def test_attention_mask_becomes_sequence_length_inputs(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("ReduceSum", ["attention_mask", "one"], ["lengths"], keepdims=1),
        helper.make_node("Sub", ["lengths", "one"], ["past"]),
        helper.make_node("Cast", ["past"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one_scalar"], ["total"], axis=0),
        helper.make_node("Cast", ["total"], ["total_sequence_length"], to=TensorProto.INT32),
        helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", "", "", "seqlens_k", "total_sequence_length"],
            ["y", "", ""],
            domain="com.microsoft",
            num_heads=1,
            kv_num_heads=1,
        ),
    ]
    inputs = [_io("q", [1, 3, 4]), _io("k", [1, 3, 4]), _io("v", [1, 3, 4]), _io("attention_mask", [1, "total"], TensorProto.INT64)]
    weights = {"one": np.array([1], np.int64), "one_scalar": np.array(1, np.int64)}
    model = _model(nodes, inputs, [_io("y", [1, 3, 4])], weights, {"com.microsoft": 1})
    result = _surgery(tmp_path, model, {"surgeon": "AttentionMaskToSequenceLengths"})
    graph = _out(result).graph
    assert _ops(result) == ["GroupQueryAttention"]
    assert [i.name for i in graph.input] == ["total_seq_len", "past_seq_len", "q", "k", "v"]
    assert list(graph.node[0].input[5:7]) == ["past_seq_len", "total_seq_len"]


def test_replace_attention_mask_value_only_in_mask_constants(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "mask"], ["m"]), helper.make_node("MatMul", ["m", "w"], ["y"])]
    mask = np.array([0, -3.4e38, 0, -3.4e38], np.float32)
    weight = np.full((4, 4), -3.4e38, np.float32)
    model = _model(nodes, [_io("x", [3, 4])], [_io("y", [3, 4])], {"mask": mask, "w": weight})
    result = _surgery(tmp_path, model, {"surgeon": "ReplaceAttentionMaskValue", "replacement": -1e4})
    values = {t.name: numpy_helper.to_array(t) for t in _out(result).graph.initializer}
    np.testing.assert_array_equal(values["mask"], [0, -1e4, 0, -1e4])
    assert values["w"].min() < -3e38  # a MatMul weight is never a mask
    assert result.details["surgeries"] == {"ReplaceAttentionMaskValue": "applied: 1 rewrite"}


def _nbits(g_idx: np.ndarray) -> onnx.ModelProto:
    weights = {
        "b": RNG.integers(0, 255, (2, 1, 16)).astype(np.uint8),
        "scales": np.array([0.1, 0.2], np.float32),
        "g_idx": g_idx,
    }
    node = helper.make_node(
        "MatMulNBits", ["a", "b", "scales", "", "g_idx"], ["y"], domain="com.microsoft", K=32, N=2, bits=4, block_size=32
    )
    return _model([node], [_io("a", [3, 32])], [_io("y", [3, 2])], weights, {"com.microsoft": 1})


def test_remove_identity_gidx_from_matmul_nbits_and_matches(tmp_path: Path) -> None:
    result = _surgery(tmp_path, _nbits(np.zeros(32, np.int32)), {"surgeon": "RemoveGidxFromMatMulNBits"})
    assert "g_idx" not in {t.name for t in _out(result).graph.initializer}
    assert "g_idx" not in _out(result).graph.node[0].input
    _same_outputs(tmp_path, result, {"a": RNG.standard_normal((3, 32)).astype(np.float32)})


def test_shuffled_gidx_is_kept(tmp_path: Path) -> None:
    g_idx = np.zeros(32, np.int32)
    g_idx[3] = 1
    result = _surgery(tmp_path, _nbits(g_idx), {"surgeon": "RemoveGidxFromMatMulNBits"})
    assert "g_idx" in _out(result).graph.node[0].input
    assert result.details["surgeries"]["RemoveGidxFromMatMulNBits"] == "not applied: 1 g_idx inputs are not the identity grouping"


def test_packed_attention_becomes_a_loop_of_multi_head_attention(tmp_path: Path) -> None:
    node = helper.make_node("PackedAttention", ["q", "k", "v", "cu_seqlens"], ["y"], domain="custom", scale=0.5, num_heads=2)
    inputs = [_io(name, [1, 2, 5, 4]) for name in "qkv"] + [_io("cu_seqlens", [3], TensorProto.INT32)]
    model = _model([node], inputs, [_io("y", [1, 5, 2, 4])], opsets={"custom": 1})
    result = _surgery(tmp_path, model, {"surgeon": "PackedAttentionToLoopMHA"})
    assert "Loop" in _ops(result) and "PackedAttention" not in _ops(result)
    q, k, v = (RNG.standard_normal((1, 2, 5, 4)).astype(np.float32) for _ in range(3))
    got = _run(result.model.model_file, {"q": q, "k": k, "v": v, "cu_seqlens": np.array([0, 2, 5], np.int32)})[0]
    expected = np.zeros((1, 5, 2, 4), np.float32)
    for start, end in ((0, 2), (2, 5)):  # each segment attends to itself only
        scores = np.einsum("hsd,htd->hst", q[0, :, start:end], k[0, :, start:end]) * 0.5
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        expected[0, start:end] = np.einsum("hst,htd->shd", weights, v[0, :, start:end])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
