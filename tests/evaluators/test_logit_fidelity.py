"""The logit_fidelity evaluator on bigram decoders whose logits are known: exact top-1 agreement and KL."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _decoder_ctx import VOCAB, context, rows_dataset, tokens_of
from _fakes import bigram_model

from engine.core.data import Dataset
from engine.core.errors import EvaluationError
from engine.registry import load
from evaluators.logit_fidelity import LogitFidelity

#: the candidate's table differs from the reference's in these rows: their most likely next token
#: is moved, so every position whose last token is one of them disagrees at top-1
CHANGED = (3, 7)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):
    rng = np.random.default_rng(1)
    reference = rng.standard_normal((VOCAB, VOCAB)).astype(np.float32)
    candidate = reference.copy()
    for row in CHANGED:
        candidate[row, (int(np.argmax(reference[row])) + 1) % VOCAB] = reference[row].max() + 1.0
    folder = tmp_path_factory.mktemp("bigrams")
    return {
        "tables": (reference, candidate),
        "reference": bigram_model(folder / "reference", reference),
        "candidate": bigram_model(folder / "candidate", candidate),
    }


def exact_kl(p_scores: np.ndarray, q_scores: np.ndarray) -> float:
    p = np.exp(p_scores.astype(np.float64)) / np.exp(p_scores.astype(np.float64)).sum()
    q = np.exp(q_scores.astype(np.float64)) / np.exp(q_scores.astype(np.float64)).sum()
    return float((p * np.log(p / q)).sum())


def fidelity(**options: object) -> LogitFidelity:
    options.setdefault("data", "text")
    return LogitFidelity(LogitFidelity.Config(**options))


def test_agreement_and_kl_are_exact(models, tmp_path: Path) -> None:
    data = rows_dataset(lengths=(6, 4, 1, 7), seed=2)
    positions = [t for row in tokens_of(data) for t in row]
    ctx, _ = context(tmp_path, models["reference"], data)
    result = fidelity().evaluate(models["candidate"], ctx)
    ref, cand = models["tables"]
    kls = [exact_kl(ref[t], cand[t]) for t in positions]
    changed = sum(t in CHANGED for t in positions)
    assert 0 < changed < len(positions)  # the rows exercise both cases
    v = result.values
    assert v["positions"] == len(positions) == 18
    assert v["top1_agreement"] == 1 - changed / len(positions)
    assert v["kl_mean"] == pytest.approx(np.mean(kls), rel=1e-6)
    assert v["kl_max"] == pytest.approx(max(kls), rel=1e-6)
    assert all(kl == 0.0 for t, kl in zip(positions, result.samples["kl_mean"].values, strict=True) if t not in CHANGED)


def test_samples_are_per_position_grouped_by_row(models, tmp_path: Path) -> None:
    ctx, _ = context(tmp_path, models["reference"], rows_dataset())
    result = fidelity().evaluate(models["candidate"], ctx)
    for metric in ("top1_agreement", "kl_mean"):
        samples = result.samples[metric]
        assert samples.statistic == "mean"
        assert samples.groups == [0] * 6 + [1] * 4 + [2] + [3] * 7
        assert np.mean(samples.values) == pytest.approx(result.values[metric], rel=1e-12)


def test_the_reference_against_itself_is_exact_without_running(models, tmp_path: Path) -> None:
    ctx, target = context(tmp_path, None, rows_dataset())
    result = fidelity().evaluate(models["reference"], ctx)
    assert result.values == {"top1_agreement": 1.0, "kl_mean": 0.0, "kl_max": 0.0, "positions": 18.0}
    assert target.sessions == []
    # the same model as a candidate measures the same figures
    same = fidelity().evaluate(models["reference"], context(tmp_path, models["reference"], rows_dataset())[0]).values
    assert same == result.values


def test_the_reference_logits_are_cached(models, tmp_path: Path) -> None:
    first, target = context(tmp_path, models["reference"], rows_dataset(), cache=True)
    a = fidelity().evaluate(models["candidate"], first)
    second, target2 = context(tmp_path, models["reference"], rows_dataset(), cache=True)
    b = fidelity().evaluate(models["candidate"], second)
    assert (len(target.sessions), len(target2.sessions)) == (2, 1)
    assert (a.details["reference_logits"], b.details["reference_logits"]) == ("miss", "hit")
    assert a.values == b.values


def test_errors_are_located(models, tmp_path: Path, make_model) -> None:
    ctx, _ = context(tmp_path, models["reference"], Dataset(inputs={"input_ids": np.zeros((2, 3), dtype=np.float32)}))
    with pytest.raises(EvaluationError, match="must be integer token ids"):
        fidelity().evaluate(models["candidate"], ctx)
    ctx, _ = context(tmp_path, models["reference"], rows_dataset())
    with pytest.raises(EvaluationError, match="the logit_fidelity evaluator needs a decoder model \\(genai format\\); got onnx"):
        fidelity().evaluate(make_model().artifact, ctx)
    ctx, _ = context(tmp_path, None, rows_dataset())
    with pytest.raises(EvaluationError, match="got onnx"):
        fidelity().evaluate(make_model().artifact, ctx)
    ctx, _ = context(tmp_path, models["reference"], rows_dataset(), plain=True)
    with pytest.raises(EvaluationError, match="plain session"):
        fidelity().evaluate(models["candidate"], ctx)


def test_registered() -> None:
    assert load("evaluators", "logit_fidelity") is LogitFidelity


def test_the_references_own_measurement_caches_its_logits_for_its_candidates(models, tmp_path: Path) -> None:
    own, target = context(tmp_path, None, rows_dataset(), cache=True)
    fidelity().evaluate(models["reference"], own)
    assert len(target.sessions) == 1  # the reference's logits computed once, for its candidates
    compared, target2 = context(tmp_path, models["reference"], rows_dataset(), cache=True)
    result = fidelity().evaluate(models["candidate"], compared)
    assert len(target2.sessions) == 1 and result.details["reference_logits"] == "hit"
    assert (
        result.values
        == fidelity().evaluate(models["candidate"], context(tmp_path / "fresh", models["reference"], rows_dataset())[0]).values
    )
