"""seq2seq_fidelity and seq2seq_generation on a tiny T5 exported by seq2seq_export (FP32, the
reference) and its dynamic INT8 parts (the candidate), on synthetic sources and on a dataset."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from seq2seq_models import tiny_seq2seq

from engine.core import ModelArtifact, PassContext
from engine.core.data import Dataset
from engine.core.errors import EvaluationError
from engine.core.evaluator import EvalContext

#: the module's fixture exports a model (about half a minute)
pytestmark = pytest.mark.slow


def _run(cls: Any, model: ModelArtifact, root: Path, config: dict[str, Any] | None = None) -> ModelArtifact:
    ctx = PassContext(step_id="step", workdir=root / "work", output_dir=root / "out")
    ctx.workdir.mkdir(parents=True)
    with contextlib.chdir(ctx.workdir):
        return cls(cls.Config(**(config or {})))(model, ctx).model


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelArtifact, ModelArtifact]:
    from passes.generate.seq2seq_export import Seq2SeqExport
    from passes.quantize.ort_quantize import OrtQuantize

    source = tiny_seq2seq(tmp_path_factory.mktemp("t5"), "t5")
    fp32 = _run(Seq2SeqExport, ModelArtifact.from_folder("hf", source), tmp_path_factory.mktemp("export"))
    int8 = _run(OrtQuantize, fp32, tmp_path_factory.mktemp("int8"), {"mode": "dynamic"})
    return fp32, int8


def context(tmp_path: Path, reference: ModelArtifact | None, data: Dataset | None = None) -> EvalContext:
    from targets.onnxruntime import OnnxRuntimeTarget

    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="cpu", runtime="onnxruntime", intra_op_threads=1))
    datasets = {"sources": lambda *_: data} if data is not None else {}
    return EvalContext(target=target, workdir=tmp_path, reference=reference, datasets=datasets)


def test_the_export_matches_pytorchs_generate_and_itself(models: tuple[ModelArtifact, ModelArtifact], tmp_path: Path) -> None:
    from evaluators.seq2seq_fidelity import Seq2SeqFidelity

    fp32, _ = models
    result = Seq2SeqFidelity(Seq2SeqFidelity.Config(pytorch=True, samples=3, max_new_tokens=8)).evaluate(fp32, context(tmp_path, None))
    assert result.values["pytorch_greedy_match"] == 1.0
    assert result.values["greedy_match"] == 1.0 and result.values["sources"] == 3


def test_int8_parts_are_compared_with_the_reference_on_a_dataset(models: tuple[ModelArtifact, ModelArtifact], tmp_path: Path) -> None:
    from evaluators.seq2seq_fidelity import Seq2SeqFidelity

    fp32, int8 = models
    ids = np.random.default_rng(3).integers(3, 128, (4, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    data = Dataset(inputs={"input_ids": ids, "attention_mask": mask})
    config = Seq2SeqFidelity.Config(data="sources", samples=4, max_new_tokens=6)
    result = Seq2SeqFidelity(config).evaluate(int8, context(tmp_path, fp32, data))
    values = result.values
    assert values["sources"] == 4
    assert 0.0 < values["max_abs_diff"] < 1.0  # INT8 moves the logits, a little
    assert values["kl_mean"] > 0.0 and 0.0 <= values["top1_agreement"] <= 1.0
    assert 0.0 <= values["greedy_match"] <= values["token_match"] <= 1.0
    assert len(result.samples["greedy_match"].values) == 4
    same = Seq2SeqFidelity(config).evaluate(fp32, context(tmp_path, fp32, data)).values
    assert same["max_abs_diff"] == 0.0 and same["greedy_match"] == 1.0


def test_a_dataset_without_the_models_input_is_a_clear_error(models: tuple[ModelArtifact, ModelArtifact], tmp_path: Path) -> None:
    from evaluators.seq2seq_fidelity import Seq2SeqFidelity

    data = Dataset(inputs={"input_features": np.zeros((2, 16, 48), np.float32)})
    with pytest.raises(EvaluationError, match=r"reads input_ids from dataset 'sources'.*it has: input_features"):
        Seq2SeqFidelity(Seq2SeqFidelity.Config(data="sources")).evaluate(models[1], context(tmp_path, models[0], data))


def test_generation_timing_against_the_reference(models: tuple[ModelArtifact, ModelArtifact], tmp_path: Path) -> None:
    from evaluators.seq2seq_generation import Seq2SeqGeneration

    fp32, int8 = models
    config = Seq2SeqGeneration.Config(samples=2, max_new_tokens=6, min_rounds=4, max_rounds=4, sessions=2, quiet_wait_s=0)
    result = Seq2SeqGeneration(config).evaluate(int8, context(tmp_path, fp32))
    values, details = result.values, result.details
    assert values["ttft_ms"] > 0 and values["reference_ttft_ms"] > 0
    assert values["decode_tokens_per_s"] > 0 and values["tokens_per_s"] > 0
    assert values["e2e_ms"] >= values["ttft_ms"]
    assert values["decode_speedup"] > 0 and len(result.samples["decode_speedup"].values) == values["rounds"] >= 4
    # the generation evaluator's clock: rounds spread over fresh pairs of sessions, grouped by them, the machine's load recorded
    assert details["sessions"] >= 2 and len(set(result.samples["e2e_speedup"].groups or [])) == details["sessions"]
    assert "others_cores_mean" in details["noise"] and details["prompts"] == 2 and details["data"] == "synthetic"
    assert 0.0 <= values["greedy_match"] <= 1.0
