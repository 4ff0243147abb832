"""AMD Quark's ONNX quantizer for real: quark_quantize quantizes the small digits CNN in the isolated
environment the pass declares (amd-quark 0.13 with onnx 1.22; built once per test session, or
found in ``$KILN_ENVS_DIR``), run by the engine as a workflow would be. Its models must load in the
main environment's onnxruntime and classify as the float model does. The run tests are slow (the
environment comes from PyPI and Quark compiles its custom-op library on first use) and skip where
the environment cannot be built; the option tests run anywhere."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from pydantic import ValidationError

from engine.run import run_workflow
from engine.select.results import RunReport
from engine.store.store import Store
from engine.workflow import load_workflow
from passes.quantize._quark import QUARK_ENVIRONMENT, QUARK_REQUIREMENTS
from passes.quantize.quark_quantize import QuarkQuantize

DIGITS_CNN = Path(__file__).resolve().parents[2] / "workflows" / "models" / "digits_cnn.py"
DIGITS = {"source": "sklearn", "name": "digits", "reshape": [1, 8, 8], "scale": 0.0625}


@pytest.fixture(scope="module")
def digits_cnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits workflow's CNN, trained for 3 epochs (seconds), exported to ONNX (opset 17)."""
    import torch

    spec = importlib.util.spec_from_file_location("digits_cnn", DIGITS_CNN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, example = module.build(epochs=3)
    path = tmp_path_factory.mktemp("cnn") / "model.onnx"
    torch.onnx.export(
        model, (example["input"],), str(path), input_names=["input"], output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False,
    )  # fmt: skip
    return path


def _workflow(cnn: Path) -> dict[str, Any]:
    return {
        "version": 1,
        "name": "quark-digits",
        "input": {"format": "onnx", "path": str(cnn)},
        "data": {
            "calibration": {**DIGITS, "split": {"take": "first", "count": 32}},
            "heldout": {**DIGITS, "split": {"take": "last", "count": 300}},
        },
        "targets": [{"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1}],
        "steps": [
            {"id": "a8w8", "pass": "quark_quantize", "config": {"calibration": "calibration"}},
            {"id": "npu", "pass": "quark_quantize",
             "config": {"calibration": "calibration", "activation": {"data_type": "UInt8", "symmetric": False},
                        "weight": {"calibration_method": "MinMax", "quant_granularity": "Channel"},
                        "algorithms": [{"name": "cle", "cle_steps": 2}], "extra_options": {"EnableNPUCnn": True}}},
        ],
        "evaluate": [
            {"id": "accuracy", "evaluator": "accuracy", "config": {"data": "heldout", "batch_size": 64}},
            {"id": "fidelity", "evaluator": "fidelity", "config": {"data": "heldout"}},
        ],
        "select": {"objective": {"metric": "accuracy.top1", "goal": "max"}},
        "search": {"sampler": "grid"},
    }  # fmt: skip


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory: pytest.TempPathFactory, digits_cnn: Path, quark_env: Any, envs_dir: Path) -> RunReport:
    """The workflow run once by the engine, from a working folder of its own."""
    import yaml

    folder = tmp_path_factory.mktemp("quark-run")
    path = folder / "workflow.yaml"
    path.write_text(yaml.safe_dump(_workflow(digits_cnn), sort_keys=False))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KILN_ENVS_DIR", str(envs_dir))
        patch.chdir(folder)
        return run_workflow(load_workflow(path), Store(folder / "store"), workers=1)


@pytest.mark.slow
def test_quark_quantizes_in_its_environment_and_the_models_classify_as_the_float_one(digits_run: RunReport) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images[-300:] / 16.0).astype(np.float32)[:, None]
    reference = next(r for r in digits_run.results if r.candidate.reference)
    float_logits = onnxruntime.InferenceSession(str(reference.model.model_file), providers=["CPUExecutionProvider"]).run(
        None, {"input": images}
    )[0]
    for label in ("a8w8", "npu"):
        result = next(r for r in digits_run.results if r.candidate.jobs and digits_run.plan.spec(r.candidate.jobs[-1]).label == label)
        assert result.state == "complete", result.reason
        model = onnx.load(str(result.model.model_file))
        ops = {node.op_type for node in model.graph.node}
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops, label
        assert not any(node.domain == "com.amd.quark" for node in model.graph.node), label
        logits = onnxruntime.InferenceSession(str(result.model.model_file), providers=["CPUExecutionProvider"]).run(
            None, {"input": images}
        )[0]
        cosine = (logits * float_logits).sum(1) / (np.linalg.norm(logits, axis=1) * np.linalg.norm(float_logits, axis=1))
        assert float(cosine.mean()) > 0.98, label
        assert result.metrics["fidelity.cosine_mean"] == pytest.approx(float(cosine.mean()), abs=1e-3)
        assert result.metrics["accuracy.top1"] >= reference.metrics["accuracy.top1"] - 0.05, label
        record = next(s.record for j, s in digits_run.jobs.items() if digits_run.plan.spec(j).label == label)
        assert record["details"]["versions"]["amd-quark"] == "0.13" and record["details"]["versions"]["onnx"] == "1.22.0"
        assert record["details"]["calibration"]["samples"] == 32 and record["details"]["quantized_ops"]


# -- options ----------------------------------------------------------------------------------------
def test_the_pass_declares_its_pinned_environment() -> None:
    assert QuarkQuantize.environment == QUARK_ENVIRONMENT
    assert all("==" in requirement for requirement in QUARK_REQUIREMENTS)
    assert not any(requirement.startswith("torch") for requirement in QUARK_REQUIREMENTS)  # torch: the main environment's


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "calibration"),
        ({"calibration": "c", "activation": {"data_type": "Int4"}}, "activation.data_type"),
        ({"calibration": "c", "weight": {"granularity": "Channel"}}, "weight.granularity"),
        ({"calibration": "c", "algorithms": [{"name": "awq"}]}, "algorithms[0].name is 'awq'"),
        ({"calibration": "c", "algorithms": [{"name": "cle", "alpha": 0.5}]}, "(cle) has no option alpha"),
    ],
)
def test_bad_options_are_refused_with_what_was_expected(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        QuarkQuantize.Config(**config)
    assert message in str(caught.value)


def test_defaults_are_quarks_a8w8() -> None:
    cfg = QuarkQuantize.Config(calibration="c")
    expected = {
        "data_type": "Int8",
        "symmetric": True,
        "calibration_method": "Percentile",
        "quant_granularity": "Tensor",
        "scale_type": "Float32",
    }
    assert cfg.activation.model_dump() == cfg.weight.model_dump() == expected
