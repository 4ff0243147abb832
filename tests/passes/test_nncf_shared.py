"""One NNCF calibration for nncf_quantize and nncf_quantize_accuracy with the same options
(passes.openvino._nncf_shared): served from the store's pass cache, the same bytes as a
calibration of its own, verified before it is served."""

from __future__ import annotations

from pathlib import Path

import pytest
from openvino_models import fidelity_measure, make_ctx, text_dataset, tiny_bert_ir

from engine.core import ModelArtifact, PassContext, PassResult
from passes.openvino import _nncf_shared
from passes.openvino.nncf_quantize import NncfQuantize
from passes.openvino.nncf_quantize_accuracy import NncfQuantizeAccuracy
from targets.openvino import OpenVinoTarget

CALIBRATION = text_dataset(16, seed=0)
VALIDATION = text_dataset(8, seed=1)
OPTIONS = {"calibration": "calibration", "model_type": "transformer", "smooth_quant_alpha": 0.8}


def ctx(root: Path, cache: Path | None, measure: object = None, calibration: object = CALIBRATION) -> PassContext:
    context = make_ctx(root, {"calibration": calibration}, measure)
    context.cache_dir = None if cache is None else cache / "passcache" / "any_pass"
    return context


def plain(model: ModelArtifact, root: Path, cache: Path | None, calibration: object = CALIBRATION) -> PassResult:
    return NncfQuantize(NncfQuantize.Config(**OPTIONS))(model, ctx(root, cache, calibration=calibration))


def controlled(model: ModelArtifact, root: Path, cache: Path | None, **options: object) -> PassResult:
    target = OpenVinoTarget(OpenVinoTarget.Config(id="ov", runtime="openvino", inference_num_threads=1))
    measure = fidelity_measure(target, model, VALIDATION, root / "eval")
    config = NncfQuantizeAccuracy.Config(**OPTIONS, validation="fidelity", metric="cosine_mean", **options)  # type: ignore[arg-type]
    return NncfQuantizeAccuracy(config)(model, ctx(root, cache, measure))


def same_bytes(a: PassResult, b: PassResult) -> bool:
    return all((a.model.path / n).read_bytes() == (b.model.path / n).read_bytes() for n in ("model.xml", "model.bin"))


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def bert_ir(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    return tiny_bert_ir(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def alone(bert_ir: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> PassResult:
    """nncf_quantize without a cache: NNCF as it is."""
    return plain(bert_ir, tmp_path_factory.mktemp("alone"), None)


def test_the_plain_pass_served_from_the_cache_writes_the_bytes_of_its_own_calibration(
    bert_ir: ModelArtifact, alone: PassResult, tmp_path: Path
) -> None:
    first = plain(bert_ir, tmp_path / "first", tmp_path)
    again = plain(bert_ir, tmp_path / "again", tmp_path)
    assert first.details["calibration_shared"] is False and again.details["calibration_shared"] is True
    assert any("kept in the store's pass cache" in n for n in first.notes)
    assert any("from the store's pass cache" in n for n in again.notes)
    assert same_bytes(first, alone) and same_bytes(again, alone)
    assert len(list((tmp_path / "passcache" / _nncf_shared.FOLDER).glob("*.digest"))) == 1


def test_accuracy_control_starts_from_the_plain_pass_calibration(bert_ir: ModelArtifact, alone: PassResult, tmp_path: Path) -> None:
    plain(bert_ir, tmp_path / "plain", tmp_path)
    result = controlled(bert_ir, tmp_path / "ac", tmp_path, max_drop=0.01)
    assert result.details["calibration_shared"] is True
    assert result.details["reverted_ops"] == 0 and result.details["written_as_plain_quantization"] is True
    assert same_bytes(result, alone)  # nothing reverted: nncf_quantize's bytes, as without the cache


def test_accuracy_control_that_reverts_gives_the_same_model_from_a_shared_calibration(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    tight = {"max_drop": 2e-6, "max_num_iterations": 2}
    own = controlled(bert_ir, tmp_path / "own", None, **tight)
    plain(bert_ir, tmp_path / "plain", tmp_path)
    shared = controlled(bert_ir, tmp_path / "shared", tmp_path, **tight)
    assert shared.details["calibration_shared"] is True and shared.details["reverted_ops"] >= 1
    assert shared.details["reverted_op_names"] == own.details["reverted_op_names"]
    assert same_bytes(shared, own)


def test_an_entry_whose_files_changed_is_calibrated_again_not_served(bert_ir: ModelArtifact, alone: PassResult, tmp_path: Path) -> None:
    plain(bert_ir, tmp_path / "first", tmp_path)
    (entry,) = [p for p in (tmp_path / "passcache" / _nncf_shared.FOLDER).iterdir() if p.is_dir()]
    weights = entry / "model.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    again = plain(bert_ir, tmp_path / "again", tmp_path)
    assert again.details["calibration_shared"] is False
    assert same_bytes(again, alone)


def test_other_calibration_samples_are_another_entry(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    plain(bert_ir, tmp_path / "first", tmp_path)
    other = plain(bert_ir, tmp_path / "other", tmp_path, calibration=text_dataset(16, seed=5))
    assert other.details["calibration_shared"] is False
    assert len(list((tmp_path / "passcache" / _nncf_shared.FOLDER).glob("*.digest"))) == 2


def test_outside_a_pass_nncf_quantizes_as_itself(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    import nncf

    plain(bert_ir, tmp_path / "first", tmp_path)  # the replacement is in place from here on
    model = _nncf_shared.ov.Core().read_model(str(bert_ir.model_file))
    items = [{name: array[i : i + 1] for name, array in CALIBRATION.inputs.items()} for i in range(4)]
    nncf.quantize(model, nncf.Dataset(items), subset_size=4)
    assert len(list((tmp_path / "passcache" / _nncf_shared.FOLDER).glob("*.digest"))) == 1
