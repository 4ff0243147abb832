"""nncf_quantize_accuracy on a tiny BERT, validated by the fidelity evaluator on an OpenVINO target
through a ``measure`` function like the engine's (``ctx.measure``)."""

from __future__ import annotations

from pathlib import Path

import openvino as ov
import pytest
from nncf.quantization.algorithms.accuracy_control.evaluator import Evaluator
from openvino_models import fidelity_measure, make_ctx, text_dataset, tiny_bert_ir

from engine.core import ModelArtifact, PassError
from engine.core.refs import RefKind, references
from passes.openvino.nncf_quantize_accuracy import NncfQuantizeAccuracy
from targets.openvino import OpenVinoTarget

CALIBRATION = text_dataset(16, seed=0)
VALIDATION = text_dataset(8, seed=1)


def target() -> OpenVinoTarget:
    return OpenVinoTarget(OpenVinoTarget.Config(id="ov", runtime="openvino", inference_num_threads=1))


def quantize(model: ModelArtifact, root: Path, measure=None, calls: list[str] | None = None, **options: object):
    measure = measure or fidelity_measure(target(), model, VALIDATION, root / "eval", calls)
    config = NncfQuantizeAccuracy.Config(
        **{"calibration": "calibration", "validation": "fidelity", "metric": "cosine_mean", "model_type": "transformer", **options}
    )
    return NncfQuantizeAccuracy(config)(model, make_ctx(root, {"calibration": CALIBRATION}, measure))


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def bert_ir(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    return tiny_bert_ir(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def loose(bert_ir: ModelArtifact, tmp_path_factory: pytest.TempPathFactory):
    calls: list[str] = []
    return quantize(bert_ir, tmp_path_factory.mktemp("loose"), calls=calls, max_drop=0.01), calls


def test_within_max_drop_nncf_keeps_the_full_quantization(loose) -> None:
    result, calls = loose
    details = result.details
    assert details["initial_metric"] == pytest.approx(1.0, abs=1e-6)  # the input against itself
    assert 0.999 <= details["quantized_metric"] < 1.0
    assert details["final_metric"] == pytest.approx(details["quantized_metric"], abs=1e-6)
    assert details["drop"] <= 0.01
    assert details["reverted_ops"] == 0
    assert details["quantized_op_count"] == details["quantized_op_count_before_restoring"] > 0
    assert details["quantized_ops"]["MatMul"] >= 12
    assert details["fake_quantize_nodes"] > 0
    # the input, the quantized model and the written model: each measured once (cached by digest)
    assert len(calls) == len(set(calls)) == details["models_measured"] == 3
    assert details["validation_calls"] >= 2


def test_a_tight_max_drop_reverts_ops_and_recovers_the_metric(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    result = quantize(bert_ir, tmp_path, max_drop=2e-6, max_num_iterations=3)
    details = result.details
    assert details["reverted_ops"] >= 1
    assert details["quantized_op_count"] < details["quantized_op_count_before_restoring"]
    assert details["final_metric"] > details["quantized_metric"]
    assert 1 <= details["iterations"] <= 3
    assert any("Accuracy drop" in line for line in details["nncf_log"])
    assert details["models_measured"] > 3
    assert details["written_as_plain_quantization"] is False
    info = ov.Core().read_model(str(result.model.model_file)).get_rt_info()
    assert "max_drop" in dict(info["nncf"]["quantization"])  # accuracy control's own entries kept


def test_nothing_reverted_is_written_as_nncf_quantize_writes_it(bert_ir: ModelArtifact, loose, tmp_path: Path) -> None:
    # the same quantization: the same bytes, so one digest that the engine measures once
    from passes.openvino.nncf_quantize import NncfQuantize

    result, _ = loose
    assert result.details["written_as_plain_quantization"] is True
    config = NncfQuantize.Config(calibration="calibration", model_type="transformer")
    plain = NncfQuantize(config)(bert_ir, make_ctx(tmp_path / "plain", {"calibration": CALIBRATION})).model
    for name in ("model.xml", "model.bin"):
        assert (result.model.path / name).read_bytes() == (plain.path / name).read_bytes(), name
    assert result.model.digest == plain.digest


def test_the_written_model_is_openvino_ir_with_quantized_ops(bert_ir: ModelArtifact, loose) -> None:
    result, _ = loose
    assert result.model.format == "openvino"
    ops = {op.get_type_name() for op in ov.Core().read_model(str(result.model.model_file)).get_ops()}
    assert "FakeQuantize" in ops
    assert result.model.attrs == bert_ir.attrs


def test_a_metric_the_evaluation_does_not_report_is_a_pass_error_listing_them(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    with pytest.raises(PassError, match=r"reports no value 'accuracy'.*cosine_mean"):
        quantize(bert_ir, tmp_path, metric="accuracy")


def test_a_failing_measurement_is_reported_not_swallowed_by_nncf(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    def broken(evaluation: str, model: ModelArtifact):
        raise RuntimeError("the evaluator broke")

    with pytest.raises(PassError, match="the evaluator broke"):
        quantize(bert_ir, tmp_path, measure=broken)


def test_without_a_measure_function_the_pass_says_what_it_needs(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    config = NncfQuantizeAccuracy.Config(calibration="calibration", validation="fidelity", metric="cosine_mean")
    with pytest.raises(PassError, match="needs the engine's measure function to run evaluation 'fidelity'"):
        NncfQuantizeAccuracy(config)(bert_ir, make_ctx(tmp_path, {"calibration": CALIBRATION}))


def test_nncf_evaluator_is_restored_after_the_run(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    original = Evaluator.prepare_model
    with pytest.raises(PassError):
        quantize(bert_ir, tmp_path, metric="accuracy")
    assert Evaluator.prepare_model is original


def test_a_lower_is_better_metric_is_turned_around_for_nncf(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    result = quantize(bert_ir, tmp_path, metric="max_abs_error", metric_goal="min", max_drop=1.0)
    details = result.details
    assert details["initial_metric"] == pytest.approx(0.0, abs=1e-6)
    assert details["final_metric"] > 0
    assert details["drop"] == pytest.approx(details["final_metric"] - details["initial_metric"])


def test_relative_drop_of_a_lower_is_better_metric_is_rejected() -> None:
    with pytest.raises(ValueError, match="drop_type relative needs metric_goal max"):
        NncfQuantizeAccuracy.Config(calibration="c", validation="v", metric="m", metric_goal="min", drop_type="relative")


def test_the_pass_declares_its_evaluation_and_dataset_options() -> None:
    assert references(NncfQuantizeAccuracy.Config)[RefKind.EVALUATION] == ("validation",)
    assert references(NncfQuantizeAccuracy.Config)[RefKind.DATASET] == ("calibration",)
    assert NncfQuantizeAccuracy.target_dependent
