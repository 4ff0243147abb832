"""decoder_export on tiny random decoders (tests/decoders.py): the torch.onnx export with a
key/value cache, run by ONNX Runtime GenAI from the genai folder the pass writes, continues a
prompt exactly as the PyTorch model does. Qwen2 from a Hugging Face folder, Llama from a torch
factory; each exported once per module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from decoder_passes import NEW_TOKENS, PROMPT, og_greedy, run_pass, until_eos
from decoders import greedy, tiny_decoder

from engine.core import ModelArtifact, PassError, PassResult
from passes.generate.decoder_export import DecoderExport

FACTORY = """
import torch
from transformers import AutoModelForCausalLM

from decoders import config, tokenizer


def make(family="llama"):
    tok = tokenizer()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config(family, len(tok))).eval(), tok
"""


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    return ModelArtifact.from_folder("hf", tiny_decoder(tmp_path_factory.mktemp("qwen2"), "qwen2"))


@pytest.fixture(scope="module")
def qwen2_export(qwen2: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> PassResult:
    return run_pass(DecoderExport, qwen2, tmp_path_factory.mktemp("qwen2_export"))


@pytest.fixture(scope="module")
def llama_factory_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[PassResult, Path]:
    root = tmp_path_factory.mktemp("llama_factory")
    (root / "model").mkdir()
    (root / "model" / "model.py").write_text(FACTORY)
    (root / "model" / "factory.json").write_text(json.dumps({"file": "model.py", "function": "make"}))
    result = run_pass(DecoderExport, ModelArtifact.from_folder("torch", root / "model"), root)
    return result, root / "work" / "hf"  # where the pass saved the factory's model and tokenizer


def test_qwen2_export_continues_like_pytorch_in_onnxruntime_genai(qwen2_export: PassResult, qwen2: ModelArtifact) -> None:
    assert qwen2_export.model.format == "genai"
    assert og_greedy(qwen2_export.model.path, PROMPT, NEW_TOKENS) == until_eos(greedy(qwen2.path, PROMPT, NEW_TOKENS))


def test_the_folder_holds_the_model_its_weights_the_config_and_the_tokenizer(qwen2_export: PassResult) -> None:
    folder = qwen2_export.model.path
    assert {p.name for p in folder.iterdir()} >= {
        "model.onnx",
        "model.onnx.data",
        "genai_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    config = json.loads((folder / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert config["model"]["type"] == "qwen2"
    assert config["search"]["past_present_share_buffer"] is False
    assert (decoder["filename"], decoder["num_key_value_heads"], decoder["head_size"], decoder["num_hidden_layers"]) == (
        "model.onnx",
        2,
        16,
        2,
    )
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    inputs = qwen2_export.details["inputs"]
    assert inputs[:3] == ["input_ids", "attention_mask", "position_ids"] and "past_key_values.1.value" in inputs
    assert "present.1.value" in qwen2_export.details["outputs"]


def test_parity_with_pytorch_is_recorded(qwen2_export: PassResult) -> None:
    parity = qwen2_export.details["parity"]
    assert set(parity["steps"]) == {"prompt", "cached step"}
    assert parity["max_abs_diff"] < 1e-4


def test_torch_factory_returning_model_and_tokenizer_exports(llama_factory_export: tuple[PassResult, Path]) -> None:
    result, saved = llama_factory_export
    assert json.loads((result.model.path / "genai_config.json").read_text())["model"]["type"] == "llama"
    assert og_greedy(result.model.path, PROMPT, NEW_TOKENS) == until_eos(greedy(saved, PROMPT, NEW_TOKENS))


def test_a_factory_returning_something_else_is_a_pass_error(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(2, 2)\n")
    (tmp_path / "model" / "factory.json").write_text(json.dumps({"function": "make"}))
    with pytest.raises(PassError, match=r"must return \(PreTrainedModel, tokenizer\)"):
        run_pass(DecoderExport, ModelArtifact.from_folder("torch", tmp_path / "model"), tmp_path)
