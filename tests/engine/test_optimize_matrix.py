"""`engine optimize DIR --device cpu --precision int8` from a Hugging Face folder alone (config.json
and random weights saved with save_pretrained; no tokenizer files): for the text encoders, vision
models, encoder-decoders and decoders Optimum exports, Kiln exports, quantizes, measures and
chooses (exit 0), and the chosen model loads in ONNX Runtime and keeps the PyTorch model's outputs
(an FP32 choice to float precision, an INT8 one within the bar it was chosen under). Slow: each
architecture is a whole run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from decoders import bare_decoder, torch_logits
from seq2seq_models import tiny_seq2seq

from engine.cli.main import main
from engine.core import ModelArtifact
from tests.vision_models import SIDE, tiny_vision

#: text encoders: (config class, model class)
ENCODERS = {
    "bert": ("BertConfig", "BertModel"),
    "distilbert": ("DistilBertConfig", "DistilBertModel"),
    "roberta": ("RobertaConfig", "RobertaForSequenceClassification"),
}
TEXT = {"vocab_size": 320, "max_position_embeddings": 130}
SIZES = {  # 2 layers, hidden 64, in each family's own names
    "bert": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
    "distilbert": {"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128},
    "roberta": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "pad_token_id": 1},
}
KINDS = {**dict.fromkeys(ENCODERS, "encoder"), **dict.fromkeys(("vit", "resnet", "convnext"), "vision")}
KINDS |= {**dict.fromkeys(("whisper", "t5"), "seq2seq"), **dict.fromkeys(("llama", "phi3", "qwen2", "gemma2"), "decoder")}


def build(folder: Path, family: str) -> Path:
    kind = KINDS[family]
    if kind == "vision":
        return tiny_vision(folder, family)
    if kind == "seq2seq":
        return tiny_seq2seq(folder, family)
    if kind == "decoder":
        return bare_decoder(folder, family)
    import torch
    import transformers

    config_class, model_class = ENCODERS[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**TEXT, **SIZES[family])
    getattr(transformers, model_class)(config).eval().save_pretrained(folder)
    return folder


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def check_onnx(family: str, source: Path, chosen: Path, fp32: bool) -> None:
    """The chosen model.onnx against PyTorch on fresh inputs: equal to float precision (FP32), cosine >= 0.98 (INT8)."""
    import onnxruntime
    import torch
    import transformers

    session = onnxruntime.InferenceSession(str(chosen / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    if KINDS[family] == "vision":
        feeds = {"pixel_values": rng.standard_normal((2, 3, SIDE, SIDE)).astype(np.float32)}
    else:
        ids = rng.integers(3, TEXT["vocab_size"], (2, 16)).astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if family in ("bert", "roberta"):
            feeds["token_type_ids"] = np.zeros_like(ids)
    names = {i.name for i in session.get_inputs()}
    expected_out = session.run(None, {k: v for k, v in feeds.items() if k in names})[0]
    model = getattr(transformers, ENCODERS[family][1] if family in ENCODERS else "AutoModelForImageClassification").from_pretrained(source)
    with torch.no_grad():
        reference = model.eval()(**{k: torch.from_numpy(v) for k, v in feeds.items()})[0].numpy()
    assert expected_out.shape == reference.shape
    if fp32:
        np.testing.assert_allclose(expected_out, reference, atol=2e-4, rtol=1e-3)
    else:
        assert cosine(expected_out, reference) >= 0.98


def check_seq2seq(family: str, source: Path, chosen: Path, fp32: bool) -> None:
    """The chosen encoder and decoder with past, run by Kiln's greedy loop, against PyTorch's greedy tokens."""
    from evaluators._seq2seq import torch_tokens
    from targets.onnxruntime import OnnxRuntimeTarget

    document = json.loads((chosen / "seq2seq.json").read_text())
    rng = np.random.default_rng(5)
    if family == "whisper":
        mel, frames = (int(v) for v in document["input_features"])
        found = [{"input_features": rng.standard_normal((1, mel, frames)).astype(np.float32)} for _ in range(4)]
    else:
        found = [
            {"input_ids": (ids := rng.integers(3, 128, (1, 10)).astype(np.int64)), "attention_mask": np.ones_like(ids)} for _ in range(4)
        ]
    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="cpu", runtime="onnxruntime", intra_op_threads=1))
    session = target.open_session(ModelArtifact.from_folder("seq2seq", chosen))
    try:
        ours = [session.generate_from(item, 6).tokens for item in found]
    finally:
        session.close()
    theirs = torch_tokens(source, document, found, 6)
    if fp32:
        assert [o[: len(t)] for o, t in zip(ours, theirs, strict=True)] == theirs
    else:  # INT8 was chosen with its first step's top token FP32's on at least 95% of the sources
        assert np.mean([o[0] == t[0] for o, t in zip(ours, theirs, strict=True)]) >= 0.75


def check_decoder(source: Path, chosen: Path, fp32: bool) -> None:
    """The chosen GenAI folder's logits after each prefix of a prompt against PyTorch's (its ONNX model loads in ORT too)."""
    import onnxruntime

    from targets.genai import GenaiTarget

    onnxruntime.InferenceSession(str(chosen / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = [int(t) for t in np.random.default_rng(3).integers(1, 320, 12)]
    target = GenaiTarget(GenaiTarget.Config(id="genai", runtime="onnxruntime-genai", device="cpu"))
    session = target.open_session(ModelArtifact.from_folder("genai", chosen))
    try:
        ours = session.logits(ids)
    finally:
        session.close()
    reference = torch_logits(source, ids)
    if fp32:
        np.testing.assert_allclose(ours, reference, atol=1e-3, rtol=1e-3)
    else:
        assert np.mean(ours.argmax(-1) == reference.argmax(-1)) >= 0.75


@pytest.mark.slow
@pytest.mark.parametrize("family", list(KINDS))
def test_engine_optimize_from_the_folder_alone_chooses_a_model_that_keeps_pytorchs_outputs(family: str, tmp_path: Path) -> None:
    source = build(tmp_path / f"tiny-{family}", family)
    assert not any(p.name.startswith(("tokenizer", "vocab", "spiece")) for p in source.iterdir())
    out = tmp_path / "out"
    args = ["optimize", str(source), "--device", "cpu", "--precision", "int8", "--max-candidates", "3", "-o", str(tmp_path / "wf.yaml")]
    assert main([*args, "--store", str(tmp_path / "store"), "--output", str(out), "-q"]) == 0
    candidates: list[dict[str, Any]] = json.loads((out / "candidates.json").read_text())["candidates"]
    assert len(candidates) >= 2 and candidates[0]["reference"] and candidates[0]["state"] == "complete"
    assert any(c["state"] == "complete" and not c["reference"] for c in candidates), candidates  # an INT8 model was measured
    (chosen,) = [c for c in candidates if c["chosen"]]
    folder = out / ("genai-cpu" if KINDS[family] == "decoder" else "ort-cpu") / "model"
    if KINDS[family] == "seq2seq":
        check_seq2seq(family, source, folder, chosen["reference"])
    elif KINDS[family] == "decoder":
        check_decoder(source, folder, chosen["reference"])
    else:
        check_onnx(family, source, folder, chosen["reference"])


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {family: build(root / family, family) for family in ("whisper", "t5", "llama")}


def dry_run(model: Path, out: Path, *extra: str) -> dict[str, Any]:
    import yaml

    assert main(["optimize", str(model), *extra, "--dry-run", "-o", str(out)]) == 0
    return yaml.safe_load(out.read_text())


@pytest.mark.parametrize(("family", "task"), [("whisper", "automatic-speech-recognition"), ("t5", "text2text-generation")])
def test_an_encoder_decoder_gets_its_export_and_dynamic_int8_of_both_parts(folders, tmp_path, family, task) -> None:
    body = dry_run(folders[family], tmp_path / "wf.yaml")
    steps = {step["id"]: step for step in body["steps"]}
    assert steps["export"] == {"id": "export", "pass": "seq2seq_export", "config": {"task": task}}
    assert steps["int8"]["pass"] == "ort_quantize" and steps["int8"]["config"] == {"mode": "dynamic"}
    assert [e["evaluator"] for e in body["evaluate"]] == ["seq2seq_fidelity", "seq2seq_generation", "size"]
    assert "data" not in body  # no tokenizer: the evaluators' own synthetic sources (token ids, or log-mel features)
    assert body["select"]["objective"]["metric"] == "generation.tokens_per_s"
    assert body["select"]["constraints"] == [{"metric": "fidelity.top1_agreement", "min": 0.95}]
    assert (
        f"encoder-decoder model ({'speech recognition' if family == 'whisper' else 'text to text'})" in (tmp_path / "wf.yaml").read_text()
    )


def test_a_decoder_without_tokenizer_files_is_measured_on_synthetic_ids_of_its_vocabulary(folders, tmp_path) -> None:
    body = dry_run(folders["llama"], tmp_path / "wf.yaml", "--precision", "int8")
    assert {name: (data["source"], data.get("int_high")) for name, data in body["data"].items()} == {
        "prompts": ("synthetic", 320),
        "heldout": ("synthetic", 320),
    }
    assert "synthetic-id (no tokenizer found) NLL" in (tmp_path / "wf.yaml").read_text()


@pytest.mark.parametrize(
    ("family", "args", "said"),
    [
        ("whisper", ["--provider", "openvino"], "ONNX Runtime's CPU provider"),
        ("t5", ["--device", "gpu"], "ONNX Runtime's CPU provider"),
        ("t5", ["--precision", "int4"], "int8 or fp32"),
        ("whisper", ["--task", "text2text-generation"], "automatic-speech-recognition"),
        ("t5", ["--task", "text-classification"], "text2text-generation, automatic-speech-recognition"),
    ],
)
def test_what_an_encoder_decoder_is_not_offered_exits_2_with_the_fix(folders, tmp_path, capsys, family, args, said) -> None:
    assert main(["optimize", str(folders[family]), *args, "--dry-run", "-o", str(tmp_path / "wf.yaml")]) == 2
    err = capsys.readouterr().err
    assert said in err and "fix:" in err and not (tmp_path / "wf.yaml").exists()
