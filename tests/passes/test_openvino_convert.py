"""openvino_convert on real models: ONNX (an MLP, a tiny encoder, a tiny BERT export), a Hugging
Face folder and a PyTorch factory; parity, static shapes, FP16 weights, precision hints, digests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import openvino as ov
import pytest
from openvino_models import HIDDEN, export_tiny_bert, make_ctx, mlp_onnx, text_dataset, tiny_bert_folder, tiny_encoder_onnx

from engine.core import ModelArtifact, PassError
from passes.openvino.convert import OpenVinoConvert
from targets.openvino import OpenVinoTarget, model_precision_hint

CNN_FACTORY = """
import torch


def build():
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5)
    )
    return module, {"input": torch.randn(2, 3, 6, 6)}
"""


def convert(model: ModelArtifact, root: Path, **options: object):
    return OpenVinoConvert(OpenVinoConvert.Config(**options))(model, make_ctx(root))


def target(**options: object) -> OpenVinoTarget:
    return OpenVinoTarget(OpenVinoTarget.Config(id="ov", runtime="openvino", **options))


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the engine runs passes with cwd = workdir


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    return tiny_encoder_onnx(tmp_path_factory.mktemp("encoder"))


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    return export_tiny_bert(tmp_path_factory.mktemp("bert"))


def test_onnx_conversion_matches_onnxruntime(encoder: ModelArtifact, tmp_path: Path) -> None:
    result = convert(encoder, tmp_path)
    assert result.details["parity"]["against"] == "onnxruntime"
    assert 0 <= result.details["parity"]["max_abs_diff"] < 1e-5
    data = text_dataset(4, vocab=1000, token_types=False)
    feeds = {name: array for name, array in data.inputs.items()}
    (expected,) = onnxruntime.InferenceSession(str(encoder.model_file), providers=["CPUExecutionProvider"]).run(None, feeds)
    actual = target().open_session(result.model).run(feeds)[0]
    np.testing.assert_allclose(actual, expected, atol=1e-5)


def test_output_folder_holds_only_the_ir_and_io_names_are_kept(encoder: ModelArtifact, tmp_path: Path) -> None:
    result = convert(encoder, tmp_path)
    assert sorted(p.name for p in result.model.path.iterdir()) == ["model.bin", "model.xml"]
    assert result.model.format == "openvino"
    assert result.model.attrs["inputs"] == ["input_ids", "attention_mask"]
    assert result.model.attrs["outputs"] == ["last_hidden_state"]
    assert result.details["inputs"][0] == {"name": "input_ids", "dtype": "int64", "shape": [None, None]}


def test_static_input_shapes_are_applied(encoder: ModelArtifact, tmp_path: Path) -> None:
    result = convert(encoder, tmp_path, input_shapes={"input_ids": [1, 16], "attention_mask": [1, 16]})
    session = target().open_session(result.model)
    assert [spec.shape for spec in session.inputs] == [(1, 16), (1, 16)]
    assert session.outputs[0].shape == (1, 16, HIDDEN)
    assert result.details["reshaped"] == {"input_ids": [1, 16], "attention_mask": [1, 16]}
    assert result.details["parity"]["cases"] == [{"input_ids": [1, 16], "attention_mask": [1, 16]}]


def test_minus_one_keeps_a_dim_dynamic(encoder: ModelArtifact, tmp_path: Path) -> None:
    result = convert(encoder, tmp_path, input_shapes={"input_ids": [1, -1], "attention_mask": [1, -1]})
    assert [i["shape"] for i in result.details["inputs"]] == [[1, None], [1, None]]


def test_unknown_input_in_input_shapes_is_a_pass_error_listing_the_inputs(encoder: ModelArtifact, tmp_path: Path) -> None:
    with pytest.raises(PassError, match=r"names inputs \['ids'\].*\['input_ids', 'attention_mask'\]"):
        convert(encoder, tmp_path, input_shapes={"ids": [1, 16]})


def test_wrong_rank_in_input_shapes_is_a_pass_error(encoder: ModelArtifact, tmp_path: Path) -> None:
    with pytest.raises(PassError, match=r"input_shapes\['input_ids'\] has 3 dims; the input has 2"):
        convert(encoder, tmp_path, input_shapes={"input_ids": [1, 16, 2]})


def test_zero_dims_are_rejected_by_the_config() -> None:
    with pytest.raises(ValueError, match="each dim is a size >= 1, or -1"):
        OpenVinoConvert.Config(input_shapes={"x": [0, 4]})


def test_compress_to_fp16_halves_the_weights_file(encoder: ModelArtifact, tmp_path: Path) -> None:
    fp32 = convert(encoder, tmp_path / "fp32")
    fp16 = convert(encoder, tmp_path / "fp16", compress_to_fp16=True)
    bin32, bin16 = (r.details["file_bytes"]["model.bin"] for r in (fp32, fp16))
    assert bin16 < 0.55 * bin32
    assert fp16.details["weight_bytes"].get("f16", 0) > 0.9 * fp32.details["weight_bytes"]["f32"] / 2
    assert fp16.details["parity"]["max_abs_diff"] < 1e-5  # the conversion, checked with FP32 weights
    assert fp16.details["parity"]["fp16_weights_max_abs_diff"] > fp16.details["parity"]["max_abs_diff"]
    assert any("weights stored in FP16" in note for note in fp16.notes)


def test_precision_hint_is_carried_in_the_files_and_applied_by_the_target(encoder: ModelArtifact, tmp_path: Path) -> None:
    f32 = convert(encoder, tmp_path / "f32", inference_precision_hint="f32")
    bf16 = convert(encoder, tmp_path / "bf16", inference_precision_hint="bf16")
    assert f32.model.digest != bf16.model.digest
    assert f32.model.model_file.with_suffix(".bin").read_bytes() == bf16.model.model_file.with_suffix(".bin").read_bytes()
    assert model_precision_hint(ov.Core().read_model(str(bf16.model.model_file))) == "bf16"
    details = target().open_session(bf16.model).details
    assert (details["model_precision_hint"], details["precision_hint_source"]) == ("bf16", "model")


def test_no_hint_writes_none_and_the_target_runs_it_at_f32(encoder: ModelArtifact, tmp_path: Path) -> None:
    result = convert(encoder, tmp_path)
    assert model_precision_hint(ov.Core().read_model(str(result.model.model_file))) is None
    assert target().open_session(result.model).details["inference_precision_hint"] == "f32"


def test_converting_twice_in_one_process_gives_the_same_bytes(bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    first = convert(bert_onnx, tmp_path / "a")
    second = convert(bert_onnx, tmp_path / "b")
    assert first.model.digest == second.model.digest
    assert first.model.model_file.read_bytes() == second.model.model_file.read_bytes()


def test_converting_in_a_fresh_process_gives_the_same_digest(bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    here = convert(bert_onnx, tmp_path / "here")
    script = (
        "import sys\nfrom pathlib import Path\nfrom engine.core import ModelArtifact, PassContext\n"
        "from passes.openvino.convert import OpenVinoConvert\n"
        "root = Path(sys.argv[2]); ctx = PassContext(step_id='s', workdir=root / 'w', output_dir=root / 'o')\n"
        "ctx.workdir.mkdir(parents=True); ctx.output_dir.mkdir(parents=True)\n"
        "print(OpenVinoConvert()(ModelArtifact.from_folder('onnx', Path(sys.argv[1])), ctx).model.digest)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(bert_onnx.path), str(tmp_path / "there")], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == here.model.digest


def test_tiny_bert_onnx_converts_with_parity(bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    result = convert(bert_onnx, tmp_path)
    assert result.details["parity"]["max_abs_diff"] < 1e-4
    assert [case["input_ids"] for case in result.details["parity"]["cases"]] == [[2, 16], [1, 9]]
    assert result.details["op_counts"]["MatMul"] >= 12


def test_parity_above_tolerance_fails_the_pass_with_figures(bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    with pytest.raises(PassError, match=r"OpenVINO \(f32\) and onnxruntime differ by up to \S+ on output last_hidden_state"):
        convert(bert_onnx, tmp_path, parity_tolerance=1e-12)


def test_token_ids_beyond_the_vocabulary_are_explained(bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    with pytest.raises(PassError, match=r"onnxruntime failed on the parity feeds.*see parity_int_high"):
        convert(bert_onnx, tmp_path, parity_int_high=5000)


def test_outputs_option_is_refused_for_onnx(encoder: ModelArtifact, tmp_path: Path) -> None:
    with pytest.raises(PassError, match="outputs applies to PyTorch and Hugging Face inputs"):
        convert(encoder, tmp_path, outputs=["last_hidden_state"])


def test_hugging_face_folder_converts_with_parity_against_torch(tmp_path: Path) -> None:
    folder = tiny_bert_folder(tmp_path / "hf")
    result = convert(ModelArtifact.from_folder("hf", folder), tmp_path / "ov")
    assert result.details["parity"]["against"] == "torch"
    assert result.details["parity"]["max_abs_diff"] < 1e-4
    assert [i["name"] for i in result.details["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert result.details["outputs"] == [{"name": "last_hidden_state", "dtype": "float32", "shape": [None, None, HIDDEN]}]
    # the PyTorch frontend names the model and its Result from process-wide counters: made reproducible
    assert convert(ModelArtifact.from_folder("hf", folder), tmp_path / "again").model.digest == result.model.digest


def test_torch_factory_converts_keeping_static_axes(tmp_path: Path) -> None:
    factory = tmp_path / "cnn.py"
    factory.write_text(CNN_FACTORY)
    model = ModelArtifact(format="torch", path=factory, digest="x" * 64, attrs={"function": "build"})
    result = convert(model, tmp_path / "ov")
    assert result.details["inputs"] == [{"name": "input", "dtype": "float32", "shape": [None, 3, 6, 6]}]
    assert result.details["outputs"] == [{"name": "output", "dtype": "float32", "shape": [None, 5]}]
    assert result.details["parity"]["max_abs_diff"] < 1e-5
    assert result.details["op_counts"]["Convolution"] == 1


def test_ir_input_is_rewritten_with_a_new_hint(encoder: ModelArtifact, tmp_path: Path) -> None:
    ir = convert(encoder, tmp_path / "ir").model
    again = convert(ir, tmp_path / "again", inference_precision_hint="f16")
    assert again.details["parity"]["against"] == "the input IR"
    assert again.details["parity"]["max_abs_diff"] == 0.0
    assert model_precision_hint(ov.Core().read_model(str(again.model.model_file))) == "f16"


def test_mlp_with_two_outputs_keeps_their_order(tmp_path: Path) -> None:
    result = convert(mlp_onnx(tmp_path / "mlp"), tmp_path / "ov")
    assert [o["name"] for o in result.details["outputs"]] == ["y", "relu_out"]
    assert [o["name"] for o in result.details["parity"]["outputs"]] == ["y", "relu_out"]


def test_passes_send_no_telemetry_and_print_nothing(encoder: ModelArtifact, tmp_path: Path) -> None:
    # outside pytest (as in an engine worker), openvino.convert_model and nncf would consent to
    # usage statistics by default and write a client id under ~/intel; the passes decline
    script = (
        "import sys\nfrom pathlib import Path\nfrom engine.core import ModelArtifact, PassContext\n"
        "from passes.openvino.convert import OpenVinoConvert\nfrom passes.openvino.nncf_compress_weights import NncfCompressWeights\n"
        "root = Path(sys.argv[2])\n"
        "def ctx(name):\n"
        "    c = PassContext(step_id=name, workdir=root / name / 'w', output_dir=root / name / 'o')\n"
        "    c.workdir.mkdir(parents=True); c.output_dir.mkdir(parents=True); return c\n"
        "ir = OpenVinoConvert()(ModelArtifact.from_folder('onnx', Path(sys.argv[1])), ctx('convert')).model\n"
        "NncfCompressWeights()(ir, ctx('compress'))\n"
        "import openvino_telemetry\n"
        "sys.stderr.write(f\"consent={getattr(openvino_telemetry.Telemetry, '_SingletonMetaClass__single_instance').consent}\")\n"
    )
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(encoder.path), str(tmp_path / "runs")], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout == ""
    assert "consent=False" in done.stderr
    assert not (home / "intel").exists()
