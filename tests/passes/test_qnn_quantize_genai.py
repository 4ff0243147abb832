"""qnn_quantize on a decoder folder (``genai``, the model builder's output, as Olive's QNN decoder
recipes quantize it): calibrated on prefills of token ids with an empty cache, written as a genai
folder that Kiln's onnxruntime decode loop opens on the CPU provider and generates with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from genai_models import NEW_TOKENS, PROMPT, TinyGenai

from engine.core import KilnError, PassContext
from engine.core.data import Dataset
from passes.quantize.qnn_quantize import QnnQuantize
from targets.onnxruntime import OnnxRuntimeTarget
from targets.onnxruntime.decoder import DecoderSession

VOCAB = 320


def _token_set(samples: int = 16, width: int = 24) -> Dataset:
    """Padded token ids as a text dataset's tokenizer gives them: right padding, lengths 4..width."""
    rng = np.random.default_rng(3)
    ids = rng.integers(1, VOCAB, size=(samples, width)).astype(np.int64)
    mask = np.zeros((samples, width), dtype=np.int64)
    for row, length in enumerate(rng.integers(4, width + 1, size=samples)):
        mask[row, :length] = 1
    ids[mask == 0] = 0
    return Dataset(inputs={"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})


def _quantize(tmp_path: Path, model, dataset: Dataset, **config):  # type: ignore[no-untyped-def]
    (tmp_path / "work").mkdir()
    (tmp_path / "out").mkdir()
    ctx = PassContext(step_id="qnn", workdir=tmp_path / "work", output_dir=tmp_path / "out", datasets={"calib": lambda: dataset})
    return QnnQuantize(QnnQuantize.Config(calibration="calib", **config))(model, ctx)


def test_a_genai_decoder_is_quantized_into_a_genai_folder_that_generates_on_the_cpu(tmp_path: Path, tiny_genai: TinyGenai) -> None:
    result = _quantize(tmp_path, tiny_genai.fp32, _token_set())
    model = result.model
    assert model.format == "genai"
    folder = Path(model.path)
    assert (folder / "genai_config.json").is_file() and (folder / "tokenizer.json").is_file()
    ops = {node.op_type for node in onnx.load(str(model.model_file), load_external_data=False).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    calibration = result.details["calibration"]
    assert calibration["samples"] == 16 and calibration["ignored_inputs"] == ["token_type_ids"]
    assert result.details["activation_type"] == "quint16"

    session = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="c", runtime="onnxruntime")).open_session(model)  # type: ignore[arg-type]
    assert isinstance(session, DecoderSession)
    tokens = session.generate(PROMPT, NEW_TOKENS).tokens
    assert len(tokens) == NEW_TOKENS
    # A16W8 on a decoder with random weights: its logits are nearly flat (the top two are often
    # within the quantization error), so once one close pair swaps, the continuation diverges from
    # there. Measured: the first 6 of 10 tokens equal the float model's, 8 of 10 in all. Asserted:
    # the first 5 and at least 6 of 10, a margin of one swap either way.
    matches = sum(a == b for a, b in zip(tokens, tiny_genai.greedy, strict=True))
    assert tokens[:5] == tiny_genai.greedy[:5], (tokens, tiny_genai.greedy)
    assert matches >= 6, (tokens, tiny_genai.greedy)
    assert calibration["cache_ranges_from_present"] == 4  # 2 layers' past key and value


def test_a_dataset_without_token_ids_is_refused_with_the_inputs_it_has(tmp_path: Path, tiny_genai: TinyGenai) -> None:
    dataset = Dataset(inputs={"x": np.zeros((4, 8), dtype=np.float32)})
    with pytest.raises(KilnError, match=r"no input 'input_ids'.*the dataset's inputs: x"):
        _quantize(tmp_path, tiny_genai.fp32, dataset)
