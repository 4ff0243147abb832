"""The perplexity evaluator on bigram decoders whose logits are known, so every NLL is exact."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from _decoder_ctx import VOCAB, context, rows_dataset, tokens_of
from _fakes import BigramSession, bigram_model

from engine.core.data import Dataset
from engine.core.errors import EvaluationError
from engine.core.stats import bootstrap
from engine.registry import load
from engine.select.select import violations
from engine.workflow.schema import Constraint
from evaluators.perplexity import Perplexity


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((VOCAB, VOCAB)).astype(np.float32)
    candidate = (reference + 0.4 * rng.standard_normal((VOCAB, VOCAB))).astype(np.float32)
    folder = tmp_path_factory.mktemp("bigrams")
    return {
        "tables": (reference, candidate),
        "reference": bigram_model(folder / "reference", reference),
        "candidate": bigram_model(folder / "candidate", candidate),
    }


def expected_nll(table: np.ndarray, rows: list[list[int]]) -> list[np.ndarray]:
    out = []
    for ids in rows:
        scores = table.astype(np.float64)[ids[:-1]]
        logp = scores - np.log(np.exp(scores).sum(axis=1, keepdims=True))
        out.append(-logp[np.arange(len(ids) - 1), ids[1:]] if len(ids) > 1 else np.zeros(0))
    return out


def perplexity(**options: object) -> Perplexity:
    options.setdefault("data", "text")
    return Perplexity(Perplexity.Config(**options))


def test_figures_are_the_exact_nll_of_the_known_logits(models, tmp_path: Path) -> None:
    data = rows_dataset()
    rows = tokens_of(data)
    ctx, _ = context(tmp_path, models["reference"], data)
    result = perplexity().evaluate(models["candidate"], ctx)
    ref_table, cand_table = models["tables"]
    mine = np.concatenate(expected_nll(cand_table, rows))
    theirs = np.concatenate(expected_nll(ref_table, rows))
    v = result.values
    assert v["tokens"] == 5 + 3 + 0 + 6  # a row's first token is not predicted; the 1-token row adds none
    assert v["nll_mean"] == pytest.approx(mine.mean(), rel=1e-6)
    assert v["perplexity"] == math.exp(v["nll_mean"])
    assert v["nll_increase"] == pytest.approx((mine - theirs).mean(), rel=1e-6)
    assert v["perplexity_ratio"] == math.exp(v["nll_increase"])
    assert v["reference_perplexity"] == pytest.approx(math.exp(theirs.mean()), rel=1e-6)
    assert set(v) == set(Perplexity.metrics)


def test_samples_are_per_token_grouped_by_row_and_reproduce_the_metric(models, tmp_path: Path) -> None:
    ctx, _ = context(tmp_path, models["reference"], rows_dataset())
    result = perplexity().evaluate(models["candidate"], ctx)
    samples = result.samples["nll_increase"]
    assert samples.statistic == "mean"
    assert samples.groups == [0] * 5 + [1] * 3 + [3] * 6
    assert np.mean(samples.values) == pytest.approx(result.values["nll_increase"], rel=1e-12)
    assert np.mean(result.samples["nll_mean"].values) == pytest.approx(result.values["nll_mean"], rel=1e-12)
    # a bound on the increase is judged on the upper end of its clustered interval
    interval = bootstrap(samples.values, "mean", 0.95, groups=samples.groups)
    assert interval.low < result.values["nll_increase"] < interval.high
    value = result.values["nll_increase"]
    bound = Constraint(metric="perplexity.nll_increase", max=(value + interval.high) / 2)
    assert violations(bound, value, None) == []
    assert violations(bound, value, None, interval) != []


def test_the_reference_against_itself_increases_nothing(models, tmp_path: Path) -> None:
    data = rows_dataset()
    ctx, _ = context(tmp_path, None, data)
    v = perplexity().evaluate(models["reference"], ctx).values
    compared = perplexity().evaluate(models["candidate"], context(tmp_path, models["reference"], data)[0]).values
    assert v["nll_increase"] == 0.0
    assert v["perplexity_ratio"] == 1.0
    assert v["reference_perplexity"] == v["perplexity"]
    assert v["perplexity"] == pytest.approx(compared["reference_perplexity"], rel=1e-9)


def test_the_reference_nll_is_cached(models, tmp_path: Path) -> None:
    data = rows_dataset()
    first, target = context(tmp_path, models["reference"], data, cache=True)
    a = perplexity().evaluate(models["candidate"], first)
    assert len(target.sessions) == 2 and all(isinstance(s, BigramSession) and s.closed for s in target.sessions)
    second, target2 = context(tmp_path, models["reference"], data, cache=True)
    b = perplexity().evaluate(models["candidate"], second)
    assert len(target2.sessions) == 1  # the candidate only
    assert a.details["reference_nll"] == "miss" and b.details["reference_nll"] == "hit"
    assert a.values == b.values


def test_limit_keeps_the_first_rows(models, tmp_path: Path) -> None:
    ctx, _ = context(tmp_path, models["reference"], rows_dataset())
    result = perplexity(limit=2).evaluate(models["candidate"], ctx)
    assert result.values["tokens"] == 8
    assert result.details["rows"] == 2


def test_errors_are_located(models, tmp_path: Path, make_model) -> None:
    ctx, _ = context(tmp_path, models["reference"], Dataset(inputs={"pixels": np.zeros((2, 3), dtype=np.float32)}))
    with pytest.raises(EvaluationError, match=r"dataset 'text' has none .*pixels"):
        perplexity().evaluate(models["candidate"], ctx)
    onnx_model = make_model().artifact
    ctx, _ = context(tmp_path, models["reference"], rows_dataset())
    with pytest.raises(EvaluationError, match="needs a decoder model \\(genai format\\); got onnx"):
        perplexity().evaluate(onnx_model, ctx)
    ctx, _ = context(tmp_path, models["reference"], rows_dataset(), plain=True)
    with pytest.raises(EvaluationError, match="opened the candidate as a plain session, which cannot generate"):
        perplexity().evaluate(models["candidate"], ctx)
    ctx, _ = context(tmp_path, models["reference"], rows_dataset(lengths=(1, 1)))
    with pytest.raises(EvaluationError, match="no row of 2 tokens or more"):
        perplexity().evaluate(models["candidate"], ctx)
    big = rows_dataset()
    big.inputs["input_ids"][0, 1] = VOCAB + 3
    ctx, _ = context(tmp_path, models["reference"], big)
    with pytest.raises(EvaluationError, match="the candidate's logits failed on a row of 6 tokens: token id 15"):
        perplexity().evaluate(models["candidate"], ctx)


def test_registered() -> None:
    assert load("evaluators", "perplexity") is Perplexity


def test_rows_from_text_lines_with_a_decoder_tokenizer(tmp_path: Path) -> None:
    """The data path a workflow takes: text_lines tokenized with a decoder's tokenizer (no pad token)."""
    from decoders import tokenizer

    from evaluators.data.text_lines import TextLines

    tok = tokenizer()
    tok.save_pretrained(str(tmp_path / "tok"))
    (tmp_path / "text.txt").write_text("Beautiful is better than ugly.\nSimple is better than complex.\nFlat\n", encoding="utf-8")
    data = TextLines(TextLines.Config(source="text_lines", path=str(tmp_path / "text.txt"), tokenizer=str(tmp_path / "tok"))).load(None)
    table = np.random.default_rng(3).standard_normal((len(tok), len(tok))).astype(np.float32)
    model = bigram_model(tmp_path / "model", table)
    ctx, _ = context(tmp_path, None, data)
    result = perplexity().evaluate(model, ctx)
    rows = [tok(line)["input_ids"] for line in ("Beautiful is better than ugly.", "Simple is better than complex.", "Flat")]
    assert result.values["tokens"] == sum(len(row) - 1 for row in rows)
    expected = np.concatenate(expected_nll(table, rows))
    assert result.values["nll_mean"] == pytest.approx(expected.mean(), rel=1e-6)


def test_the_references_own_measurement_fills_the_cache_its_candidates_read(models, tmp_path: Path) -> None:
    data = rows_dataset()
    own, _ = context(tmp_path, None, data, cache=True)
    perplexity().evaluate(models["reference"], own)  # the reference measured as a candidate: ctx.reference is None
    compared, target2 = context(tmp_path, models["reference"], data, cache=True)
    result = perplexity().evaluate(models["candidate"], compared)
    assert len(target2.sessions) == 1  # the candidate only: the reference's NLL came from its own measurement
    assert result.details["reference_nll"] == "hit"
    uncached = perplexity().evaluate(models["candidate"], context(tmp_path / "fresh", models["reference"], data)[0])
    assert result.values == uncached.values


def test_a_shorter_look_and_a_longer_one_share_the_reference_rows(models, tmp_path: Path) -> None:
    data = rows_dataset()
    first, _ = context(tmp_path, models["reference"], data, cache=True)
    perplexity(limit=2).evaluate(models["candidate"], first)
    every, _ = context(tmp_path, models["reference"], data, cache=True)
    result = perplexity().evaluate(models["candidate"], every)
    assert result.details["reference_nll"] == "partial (2 of 4 rows cached)"
