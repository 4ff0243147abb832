"""The fidelity evaluator: candidate against reference on real onnxruntime sessions."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest

from engine.core.data import Dataset
from engine.core.errors import EvaluationError
from evaluators.fidelity import Fidelity


def fidelity(**options: object) -> Fidelity:
    return Fidelity(Fidelity.Config(data="d", **options))


def test_the_reference_itself_scores_perfectly_without_running(tmp_path, make_ctx, token_dataset) -> None:
    from engine.core.artifact import ModelArtifact

    # a model file no runtime could load: had it been run, this would fail
    (tmp_path / "never").mkdir()
    (tmp_path / "never" / "model.onnx").write_bytes(b"never loaded")
    model = ModelArtifact.from_folder("onnx", tmp_path / "never")
    result = fidelity(max_samples=4).evaluate(model, make_ctx(reference=None, d=token_dataset(samples=6)))
    assert result.values == {
        "cosine_mean": 1.0,
        "cosine_min": 1.0,
        "cosine_p5": 1.0,
        "max_abs_error": 0.0,
        "mean_abs_error": 0.0,
        "samples": 4.0,
    }
    assert result.details["reference"] is True


def test_an_identical_model_has_cosine_one_and_no_error(make_model, make_ctx, token_dataset) -> None:
    reference = make_model(seed=0).artifact
    copy = make_model(seed=0).artifact
    result = fidelity().evaluate(copy, make_ctx(reference=reference, d=token_dataset(samples=5)))
    assert result.values["cosine_mean"] == 1.0
    assert result.values["cosine_min"] == 1.0
    assert result.values["max_abs_error"] == 0.0
    assert result.values["mean_abs_error"] == 0.0
    assert result.values["samples"] == 5
    assert result.details["outputs"] == ["last_hidden_state"]


def test_a_perturbed_model_matches_a_numpy_computation(make_model, make_ctx, token_dataset) -> None:
    reference = make_model(seed=0)
    candidate = make_model(seed=0, noise=0.05)
    data = token_dataset(samples=6, sequence=10)
    result = fidelity(batch_size=4).evaluate(candidate.artifact, make_ctx(reference=reference.artifact, d=data))

    ids, mask = data.inputs["input_ids"], data.inputs["attention_mask"]
    ref_out = reference.reference_output(ids, mask)
    cand_out = candidate.reference_output(ids, mask)
    cosines = [float(c.ravel() @ r.ravel() / (np.linalg.norm(c) * np.linalg.norm(r))) for c, r in zip(cand_out, ref_out, strict=True)]
    diff = np.abs(cand_out - ref_out)

    v = result.values
    assert v["cosine_mean"] < 1.0
    assert v["max_abs_error"] > 0.0
    assert v["cosine_mean"] == pytest.approx(np.mean(cosines), abs=1e-6)
    assert v["cosine_min"] == pytest.approx(min(cosines), abs=1e-6)
    assert v["max_abs_error"] == pytest.approx(diff.max(), rel=1e-4)
    assert v["mean_abs_error"] == pytest.approx(diff.mean(), rel=1e-4)
    assert v["samples"] == 6


def test_more_noise_means_lower_cosine(make_model, make_ctx, token_dataset) -> None:
    reference = make_model(seed=0).artifact
    data = token_dataset()
    small = fidelity().evaluate(make_model(seed=0, noise=0.01).artifact, make_ctx(reference=reference, d=data)).values
    large = fidelity().evaluate(make_model(seed=0, noise=0.5).artifact, make_ctx(reference=reference, d=data)).values
    assert large["cosine_mean"] < small["cosine_mean"] < 1.0
    assert large["max_abs_error"] > small["max_abs_error"]


def test_float16_outputs_are_compared_in_float64(make_model, make_ctx, token_dataset) -> None:
    reference = make_model(seed=0).artifact
    candidate = make_model(seed=0, fp16_output=True).artifact
    v = fidelity().evaluate(candidate, make_ctx(reference=reference, d=token_dataset())).values
    # only float16 rounding separates them: relative error about 2**-11
    assert 0.9999 < v["cosine_min"] < 1.0
    assert 0.0 < v["max_abs_error"] < 0.01


def test_masked_out_positions_are_left_out(make_model, make_ctx, token_dataset) -> None:
    # identical weights; the candidate writes 1000 wherever the mask is 0
    reference = make_model(seed=0).artifact
    candidate = make_model(seed=0, pad_value=1000.0).artifact
    data = token_dataset(samples=4, sequence=10, real=[3, 5, 10, 7])
    masked = fidelity().evaluate(candidate, make_ctx(reference=reference, d=data))
    assert masked.values["cosine_min"] == 1.0
    assert masked.values["max_abs_error"] == 0.0
    assert masked.details["per_output"]["last_hidden_state"]["masked"] is True
    assert masked.details["per_output"]["last_hidden_state"]["elements_compared"] == (3 + 5 + 10 + 7) * 8

    unmasked = fidelity(mask_input=None).evaluate(candidate, make_ctx(reference=reference, d=data))
    assert unmasked.values["cosine_min"] < 0.5
    assert unmasked.values["max_abs_error"] == pytest.approx(1000.0, rel=1e-3)


def test_outputs_not_shaped_like_the_mask_are_compared_whole(make_model, make_ctx, token_dataset) -> None:
    reference = make_model(seed=0, pooled=True).artifact
    candidate = make_model(seed=0, pooled=True, pad_value=1000.0).artifact
    data = token_dataset(samples=3, sequence=10, real=[4, 10, 6])
    result = fidelity().evaluate(candidate, make_ctx(reference=reference, d=data))
    per_output = result.details["per_output"]
    assert per_output["last_hidden_state"]["cosine_min"] == 1.0
    # the pooled mean includes the padded positions, so it differs wherever padding exists
    assert per_output["pooled"]["masked"] is False
    assert per_output["pooled"]["cosine_min"] < 1.0
    assert per_output["pooled"]["samples"] == 3
    assert result.values["cosine_min"] == per_output["pooled"]["cosine_min"]


def test_only_the_named_outputs_are_compared(make_model, make_ctx, token_dataset) -> None:
    reference = make_model(seed=0, pooled=True).artifact
    candidate = make_model(seed=0, pooled=True).artifact
    result = fidelity(outputs=["pooled"]).evaluate(candidate, make_ctx(reference=reference, d=token_dataset()))
    assert result.details["outputs"] == ["pooled"]
    assert list(result.details["per_output"]) == ["pooled"]


def test_a_named_output_missing_from_a_model_is_an_evaluation_error(make_model, make_ctx, token_dataset) -> None:
    reference = make_model(seed=0).artifact
    candidate = make_model(seed=0, pooled=True).artifact
    with pytest.raises(EvaluationError, match="pooled"):
        fidelity(outputs=["pooled"]).evaluate(candidate, make_ctx(reference=reference, d=token_dataset()))


def test_no_shared_output_is_an_evaluation_error_naming_both(make_model, make_ctx, token_dataset) -> None:
    reference = make_model(seed=0).artifact
    candidate = make_model(seed=0, output_name="embeddings").artifact
    with pytest.raises(EvaluationError, match=r"share no output.*embeddings.*last_hidden_state"):
        fidelity().evaluate(candidate, make_ctx(reference=reference, d=token_dataset()))


def test_max_samples_limits_the_comparison(make_model, make_ctx, token_dataset) -> None:
    reference = make_model(seed=0).artifact
    candidate = make_model(seed=0, noise=0.1).artifact
    result = fidelity(max_samples=3, batch_size=2).evaluate(candidate, make_ctx(reference=reference, d=token_dataset(samples=8)))
    assert result.values["samples"] == 3
    assert result.details["per_output"]["last_hidden_state"]["samples"] == 3
    assert result.details["dataset_size"] == 8


def test_a_dataset_lacking_a_model_input_is_an_evaluation_error(make_model, make_ctx) -> None:
    reference = make_model(seed=0).artifact
    data = Dataset(inputs={"input_ids": np.ones((2, 4), dtype=np.int64)})
    with pytest.raises(EvaluationError, match=r"lacks input.*attention_mask"):
        fidelity().evaluate(make_model(seed=1).artifact, make_ctx(reference=reference, d=data))


def test_data_is_required() -> None:
    with pytest.raises(pydantic.ValidationError):
        Fidelity.Config()


def _cached_ctx(make_ctx, reference, data, cache_dir):
    ctx = make_ctx(reference=reference, d=data)
    ctx.cache_dir = cache_dir
    return ctx


def test_the_reference_outputs_are_computed_once_and_served_from_the_cache(tmp_path, make_model, make_ctx, token_dataset) -> None:
    reference = make_model(seed=0).artifact
    candidate = make_model(seed=0, noise=0.05).artifact
    data, cache = token_dataset(samples=6), tmp_path / "evalcache"
    first = fidelity(batch_size=2).evaluate(candidate, _cached_ctx(make_ctx, reference, data, cache))
    assert first.details["reference_outputs"] == "miss" and len(list(cache.glob("*.npz"))) == 1
    # the reference model is gone: only the cache can answer, and it answers the same figures
    for path in reference.path.rglob("*.onnx"):
        path.unlink()
    second = fidelity(batch_size=2).evaluate(candidate, _cached_ctx(make_ctx, reference, data, cache))
    assert second.details["reference_outputs"] == "hit"
    assert second.values == first.values


def test_other_feeds_or_a_damaged_entry_recompute_the_reference(tmp_path, make_model, make_ctx, token_dataset) -> None:
    reference = make_model(seed=0).artifact
    candidate = make_model(seed=0, noise=0.05).artifact
    cache = tmp_path / "evalcache"
    first = fidelity().evaluate(candidate, _cached_ctx(make_ctx, reference, token_dataset(samples=4), cache))
    other = fidelity().evaluate(candidate, _cached_ctx(make_ctx, reference, token_dataset(samples=5), cache))
    assert other.details["reference_outputs"] == "miss" and len(list(cache.glob("*.npz"))) == 2
    for entry in cache.glob("*.npz"):
        entry.write_bytes(entry.read_bytes()[:-8] + b"12345678")  # flipped bytes: the checksum catches them
    again = fidelity().evaluate(candidate, _cached_ctx(make_ctx, reference, token_dataset(samples=4), cache))
    assert again.details["reference_outputs"] == "corrupt" and again.values == first.values
    assert (
        fidelity().evaluate(candidate, _cached_ctx(make_ctx, reference, token_dataset(samples=4), cache)).details["reference_outputs"]
        == "hit"
    )


def test_candidates_on_other_session_settings_share_the_reference_outputs(tmp_path, make_model, make_ctx, token_dataset) -> None:
    from targets.onnxruntime import OnnxRuntimeTarget

    def target(id: str, threads: int) -> OnnxRuntimeTarget:
        return OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id=id, runtime="onnxruntime", intra_op_threads=threads))

    reference = make_model(seed=0).artifact
    candidate = make_model(seed=0, noise=0.05).artifact
    data, cache = token_dataset(samples=4), tmp_path / "evalcache"
    results = []
    for threads in (1, 2):
        ctx = _cached_ctx(make_ctx, reference, data, cache)
        ctx.target, ctx.reference_target = target("cpu", threads), target("cpu", 1)
        results.append(fidelity().evaluate(candidate, ctx))
    # the reference ran once, on the target as written; the second candidate's settings did not matter
    assert [r.details["reference_outputs"] for r in results] == ["miss", "hit"]
    assert len(list(cache.glob("*.npz"))) == 1
    assert results[0].values == results[1].values
    assert results[1].details["reference_target"] == "cpu"
    # without a reference target the reference runs on the candidate's target: its own entry
    ctx = _cached_ctx(make_ctx, reference, data, cache)
    ctx.target = target("cpu", 2)
    assert fidelity().evaluate(candidate, ctx).details["reference_outputs"] == "miss"


def _logged_sessions(monkeypatch) -> list[str]:
    """Record when each session of the fidelity evaluator opens, runs and closes."""
    import evaluators.fidelity as module

    log: list[str] = []

    def logged(opener, role):
        def open_(*args, **kwargs):
            session = opener(*args, **kwargs)
            run, close = session.run, session.close
            log.append(f"{role} open")

            def run_logged(*a, **k):
                log.append(f"{role} run")
                return run(*a, **k)

            def close_logged():
                log.append(f"{role} close")
                close()

            session.run, session.close = run_logged, close_logged
            return session

        return open_

    monkeypatch.setattr(module, "open_reference", logged(module.open_reference, "reference"))
    monkeypatch.setattr(module, "open_session", logged(module.open_session, "candidate"))
    return log


def test_on_a_miss_the_reference_runs_every_row_before_the_candidate_opens(
    tmp_path, make_model, make_ctx, token_dataset, monkeypatch
) -> None:
    # two models alternating row by row fight over the cores (idle threads spin after a run): one at a time
    reference = make_model(seed=0).artifact
    candidate = make_model(seed=0, noise=0.05).artifact
    data = token_dataset(samples=5)
    log = _logged_sessions(monkeypatch)
    result = fidelity().evaluate(candidate, _cached_ctx(make_ctx, reference, data, tmp_path / "evalcache"))
    assert log == ["reference open", *["reference run"] * 5, "reference close", "candidate open", *["candidate run"] * 5, "candidate close"]
    assert result.details["reference_outputs"] == "miss"
    # outputs too large to keep: the reference streams beside the candidate, to the same figures
    monkeypatch.setattr("evaluators.fidelity.MAX_BYTES", 1)
    log.clear()
    streamed = fidelity().evaluate(candidate, _cached_ctx(make_ctx, reference, data, tmp_path / "other"))
    assert streamed.details["reference_outputs"] == "too large"
    assert streamed.values == result.values
    assert log[:3] == ["reference open", "reference run", "candidate open"]
    assert log.count("reference run") == 6  # the first row again, beside the candidate
