"""split_model and compose_models on a small stacked MLP built here (mask and scale before the
layers, a skip connection across layers, a head after them): the parts run in sequence give the
original outputs, and composing them back gives the original model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from genai_models import TinyGenai
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from engine.core import ModelArtifact, PassContext, PassError, PassResult
from passes.graph.compose_models import ComposeModels
from passes.graph.split_model import SplitModel

WIDTH = 16
LAYER_BYTES = WIDTH * WIDTH * 4  # each layer's MatMul weight, float32
HEAD_BYTES = WIDTH * 4 * 4


def _mlp(layers: int) -> onnx.ModelProto:
    """x * mask -> h0; per layer: relu(h @ W_i) * scale + h; the last layer also adds h0; then
    logits = h @ W_head and the last hidden state, both outputs."""
    rng = np.random.default_rng(0)
    weights = {f"model.layers.{i}.fc.weight": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) / 4 for i in range(layers)}
    weights["head.weight"] = rng.standard_normal((WIDTH, 4)).astype(np.float32)
    scale = numpy_helper.from_array(np.array(0.5, np.float32))
    nodes = [
        helper.make_node("Mul", ["x", "mask"], ["h0"], name="/embed/Mul"),
        helper.make_node("Constant", [], ["scale"], name="/embed/Constant", value=scale),
    ]
    hidden = "h0"
    for i in range(layers):
        prefix = f"/model/layers.{i}"
        nodes += [
            helper.make_node("MatMul", [hidden, f"model.layers.{i}.fc.weight"], [f"{prefix}/mm"], name=f"{prefix}/fc/MatMul"),
            helper.make_node("Relu", [f"{prefix}/mm"], [f"{prefix}/act"], name=f"{prefix}/act/Relu"),
            helper.make_node("Mul", [f"{prefix}/act", "scale"], [f"{prefix}/scaled"], name=f"{prefix}/Mul"),
            helper.make_node("Add", [f"{prefix}/scaled", hidden], [f"{prefix}/out"], name=f"{prefix}/Add"),
        ]
        hidden = f"{prefix}/out"
    nodes += [
        helper.make_node("Add", [hidden, "h0"], ["last_hidden"], name="/model/norm/Add"),
        helper.make_node("MatMul", ["last_hidden", "head.weight"], ["logits"], name="/lm_head/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", WIDTH]) for name in ("x", "mask")],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("last_hidden", TensorProto.FLOAT, ["batch", WIDTH]),
        ],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _artifact(root: Path, layers: int) -> ModelArtifact:
    folder = root / "source"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(_mlp(layers), str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def _split(root: Path, layers: int, **config: object) -> PassResult:
    ctx = PassContext(step_id="split", workdir=root / "work", output_dir=root / "parts")
    return SplitModel(SplitModel.Config(**config))(_artifact(root, layers), ctx)


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((3, WIDTH)).astype(np.float32), "mask": (rng.random((3, WIDTH)) > 0.2).astype(np.float32)}


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _run_parts(folder: Path) -> dict[str, np.ndarray]:
    """The parts in the manifest's order, each fed what its inputs name."""
    manifest = json.loads((folder / "split.json").read_text())
    values = dict(_feeds())
    for entry in manifest["parts"]:
        session = _session(folder / entry["file"])
        assert [value.name for value in session.get_inputs()] == entry["inputs"]
        results = session.run(entry["outputs"], {name: values[name] for name in entry["inputs"]})
        values.update(zip(entry["outputs"], results, strict=True))
    return {name: values[name] for name in manifest["outputs"]}


def _reference(root: Path) -> dict[str, np.ndarray]:
    session = _session(root / "source" / "model.onnx")
    return dict(zip(["logits", "last_hidden"], session.run(["logits", "last_hidden"], _feeds()), strict=True))


def _check_parts(result: PassResult, root: Path, count: int) -> dict:
    folder = Path(result.model.path)
    manifest = json.loads((folder / "split.json").read_text())
    assert result.model.format == "onnx_parts"
    assert len(manifest["parts"]) == count == result.details["parts"]
    available = set(manifest["inputs"])
    for entry in manifest["parts"]:
        part = onnx.load(str(folder / entry["file"]))
        onnx.checker.check_model(part, full_check=True)
        assert [value.name for value in part.graph.input] == entry["inputs"]
        assert set(entry["inputs"]) <= available, "a part reads a value no earlier part computes"
        assert part.graph.node, "an empty part"
        available |= set(entry["outputs"])
    expected = _reference(root)
    got = _run_parts(folder)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)
    return manifest


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize(("layers", "num_splits", "expected"), [(4, 2, [[0, 1], [2, 3]]), (5, 3, [[0, 1], [2, 3], [4]])])
def test_split_by_layer_count(tmp_path: Path, layers: int, num_splits: int, expected: list) -> None:
    manifest = _check_parts(_split(tmp_path, layers, num_splits=num_splits), tmp_path, num_splits)
    assert [entry["layers"] for entry in manifest["parts"]] == expected
    # the skip connection from before the layers crosses into the last part
    assert "h0" in manifest["parts"][-1]["inputs"]


def test_embeddings_and_head_get_parts_of_their_own(tmp_path: Path) -> None:
    manifest = _check_parts(_split(tmp_path, 4, num_splits=2, unique_embeds_lm_head_splits=True), tmp_path, 4)
    assert [entry["layers"] for entry in manifest["parts"]] == [[], [0, 1], [2, 3], []]
    assert manifest["parts"][-1]["outputs"] == ["last_hidden", "logits"]


def test_split_by_assignments(tmp_path: Path) -> None:
    assignments = {"model.layers.0": 0, "model.layers.1": 1, "model.layers.2": 1, "lm_head": 2}
    manifest = _check_parts(_split(tmp_path, 3, split_assignments=assignments), tmp_path, 3)
    assert [entry["layers"] for entry in manifest["parts"]] == [[0], [1, 2], []]


# a few bytes over whole layers: the scale constant, copied into every part, counts too
@pytest.mark.parametrize(
    ("budget", "count"), [(2 * LAYER_BYTES + HEAD_BYTES + 8, 3), (3 * LAYER_BYTES + 8, 3), (4 * LAYER_BYTES + HEAD_BYTES, 2)]
)
def test_split_by_memory_budget(tmp_path: Path, budget: int, count: int) -> None:
    result = _split(tmp_path, 6, max_part_bytes=budget)
    manifest = _check_parts(result, tmp_path, count)
    assert all(entry["weight_bytes"] <= budget for entry in manifest["parts"])
    assert sum(len(entry["layers"]) for entry in manifest["parts"]) == 6


def test_budget_below_one_layer_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PassError, match=r"layer 0 holds 1028 bytes of weights, more than max_part_bytes=1000"):
        _split(tmp_path, 3, max_part_bytes=1000)


def test_more_splits_than_layers_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PassError, match="num_splits=4 but the model has 3 layers"):
        _split(tmp_path, 3, num_splits=4)


@pytest.mark.parametrize(
    "config", [{}, {"num_splits": 2, "max_part_bytes": 10}, {"max_part_bytes": 10, "unique_embeds_lm_head_splits": True}]
)
def test_config_takes_one_way_to_split(config: dict) -> None:
    with pytest.raises(ValidationError):
        SplitModel.Config(**config)


@pytest.mark.parametrize("num_splits", [2, 3])
def test_compose_gives_the_original_model(tmp_path: Path, num_splits: int) -> None:
    parts = _split(tmp_path, 6, num_splits=num_splits).model
    ctx = PassContext(step_id="compose", workdir=tmp_path / "work2", output_dir=tmp_path / "composed")
    result = ComposeModels(ComposeModels.Config())(parts, ctx)
    assert result.model.format == "onnx"
    composed = onnx.load(str(result.model.model_file))
    onnx.checker.check_model(composed, full_check=True)
    original = onnx.load(str(tmp_path / "source" / "model.onnx"))
    assert len(composed.graph.node) == len(original.graph.node)  # the constant copied into each part is kept once
    assert [value.name for value in composed.graph.input] == ["x", "mask"]
    got = _session(result.model.model_file).run(["logits", "last_hidden"], _feeds())
    for value, expected in zip(got, _reference(tmp_path).values(), strict=True):
        np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-6)


def test_genai_decoder_split_into_a_pipeline(tiny_genai: TinyGenai, tmp_path: Path) -> None:
    """A genai decoder split in two: genai_config.json becomes a decoder-pipeline over the parts,
    and ONNX Runtime GenAI generates the same tokens from it as from the whole decoder."""
    from decoder_passes import NEW_TOKENS, PROMPT, og_greedy

    ctx = PassContext(step_id="split", workdir=tmp_path / "work", output_dir=tmp_path / "parts")
    result = SplitModel(SplitModel.Config(num_splits=2))(tiny_genai.fp32, ctx)
    folder = Path(result.model.path)
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["type"] == "decoder-pipeline"
    stages = config["model"]["decoder"]["pipeline"][0]
    assert [stage["filename"] for stage in stages.values()] == ["model_0.onnx", "model_1.onnx"]
    expected = og_greedy(tiny_genai.fp32.path, PROMPT, NEW_TOKENS, ignore_eos=True)
    assert og_greedy(folder, PROMPT, NEW_TOKENS, ignore_eos=True) == expected
