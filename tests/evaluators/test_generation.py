"""The generation evaluator on bigram decoders in numpy (real greedy loops under a real clock):
consistent figures, speedups against the reference, greedy match, errors; and the memory
evaluator running generations for a generative session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydantic
import pytest
from _decoder_ctx import VOCAB, context, rows_dataset, tokens_of
from _fakes import BigramSession, bigram_model

from engine.core.data import Dataset
from engine.core.errors import EvaluationError
from engine.core.target import Generation
from engine.registry import load
from evaluators.generation import GenerationEvaluator
from evaluators.memory import Memory

CHANGED = 5  # the candidate's most likely token after this one differs from the reference's


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):
    rng = np.random.default_rng(2)
    reference = rng.standard_normal((VOCAB, VOCAB)).astype(np.float32)
    changed = reference.copy()
    changed[CHANGED, (int(np.argmax(reference[CHANGED])) + 1) % VOCAB] = reference[CHANGED].max() + 1.0
    folder = tmp_path_factory.mktemp("bigrams")
    return {
        "tables": (reference, changed),
        "reference": bigram_model(folder / "reference", reference),
        "same": bigram_model(folder / "same", reference, prefill_sleep_s=0.0),
        "changed": bigram_model(folder / "changed", changed),
        "slow": bigram_model(folder / "slow", reference, decode_sleep_s=0.002),
    }


def generation(**options: object) -> GenerationEvaluator:
    fast = {"data": "text", "max_new_tokens": 4, "min_rounds": 4, "max_rounds": 4, "sessions": 2, "runs_per_round": 1, "warmup": 1}
    return GenerationEvaluator(GenerationEvaluator.Config(**{**fast, "quiet_wait_s": 0, **options}))


def greedy(table: np.ndarray, prompt: list[int], n: int) -> list[int]:
    out = [int(np.argmax(table[prompt[-1]]))]
    while len(out) < n:
        out.append(int(np.argmax(table[out[-1]])))
    return out


def test_figures_are_consistent(models, tmp_path: Path) -> None:
    ctx, target = context(tmp_path, models["reference"], rows_dataset())
    result = generation().evaluate(models["same"], ctx)
    v, d = result.values, result.details
    assert set(v) == set(GenerationEvaluator.metrics)
    assert d["generations"] == 4  # 4 rounds of 1 generation
    assert d["decode_tokens"] == 4 * 3 and d["new_tokens_total"] == 4 * 4
    # tokens/s x time = tokens
    assert v["decode_tokens_per_s"] * d["decode_s"] == pytest.approx(d["decode_tokens"], rel=1e-12)
    assert v["tokens_per_s"] * d["total_s"] == pytest.approx(d["new_tokens_total"], rel=1e-12)
    r = d["reference"]
    assert v["reference_decode_tokens_per_s"] * r["decode_s"] == pytest.approx(r["decode_tokens"], rel=1e-12)
    assert v["new_tokens"] == 4.0
    assert 0 < v["ttft_ms"] <= v["e2e_ms"]
    assert v["decode_speedup_low"] <= v["decode_speedup"] <= v["decode_speedup_high"]
    assert v["greedy_match"] == 1.0
    # two fresh pairs of sessions, each model generating the same number of times on each
    assert d["sessions"] == 2 and len(target.sessions) == 4
    counts = [s.generations for s in target.sessions if isinstance(s, BigramSession)]
    assert counts[0] == counts[1] and counts[2] == counts[3]
    assert all(s.closed for s in target.sessions if isinstance(s, BigramSession))


def test_speedups_have_per_round_samples_grouped_by_session(models, tmp_path: Path) -> None:
    ctx, _ = context(tmp_path, models["reference"], rows_dataset())
    result = generation().evaluate(models["same"], ctx)
    for metric in ("decode_speedup", "ttft_speedup", "e2e_speedup", "ttft_ms"):
        samples = result.samples[metric]
        assert samples.statistic == "median"
        assert samples.groups == [0, 0, 1, 1]
        assert float(np.median(samples.values)) == pytest.approx(result.values[metric], rel=1e-12)
    assert result.samples["greedy_match"].values == [1.0] * 4  # one per prompt


def test_a_slower_decode_shows_in_the_decode_speedup(models, tmp_path: Path) -> None:
    ctx, _ = context(tmp_path, models["reference"], rows_dataset())
    v = generation().evaluate(models["slow"], ctx).values
    assert v["decode_speedup"] < 0.5
    assert v["decode_speedup_high"] < 1.0
    assert v["decode_tokens_per_s"] < 1 / 0.002
    assert v["reference_decode_tokens_per_s"] > v["decode_tokens_per_s"]


def test_greedy_match_is_the_fraction_of_prompts_continued_alike(models, tmp_path: Path) -> None:
    data = rows_dataset(lengths=(3, 4, 2, 5, 3, 2), seed=7)
    data.inputs["input_ids"][[0, 3], [2, 4]] = CHANGED  # these two prompts end where the models differ
    ctx, _ = context(tmp_path, models["reference"], data)
    result = generation(limit=6, max_new_tokens=3).evaluate(models["changed"], ctx)
    reference, changed = models["tables"]
    same = [greedy(reference, p, 3) == greedy(changed, p, 3) for p in tokens_of(data)]
    assert 0 < sum(same) < 6  # the prompts exercise both cases
    assert result.values["greedy_match"] == sum(same) / 6  # prompts beyond the 4 rounds are generated too
    assert result.details["greedy_compared_prompts"] == 6


def test_the_reference_alone_has_speedups_of_exactly_one(models, tmp_path: Path) -> None:
    ctx, target = context(tmp_path, None, rows_dataset())
    result = generation().evaluate(models["reference"], ctx)
    v = result.values
    for metric in ("decode_speedup", "decode_speedup_low", "decode_speedup_high", "ttft_speedup", "e2e_speedup", "greedy_match"):
        assert v[metric] == 1.0
    assert v["reference_decode_tokens_per_s"] == v["decode_tokens_per_s"]
    assert len(target.sessions) == 2  # one per block: the model alone
    assert result.details["method"] == "rounds, alone"


def test_objectives_are_ranked_through_the_paired_figures() -> None:
    paired = GenerationEvaluator.paired_metrics
    assert paired["decode_tokens_per_s"] == "decode_speedup" and paired["ttft_ms"] == "ttft_speedup"
    assert all(metric in GenerationEvaluator.metrics and figure in GenerationEvaluator.metrics for metric, figure in paired.items())
    assert load("evaluators", "generation") is GenerationEvaluator
    assert GenerationEvaluator.timing and GenerationEvaluator.needs_reference


def test_errors_are_located(models, tmp_path: Path, make_model, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, _ = context(tmp_path, models["reference"], rows_dataset())
    with pytest.raises(EvaluationError, match="the generation evaluator needs a decoder model \\(genai format\\); got onnx"):
        generation().evaluate(make_model().artifact, ctx)
    ctx, _ = context(tmp_path, models["reference"], rows_dataset(), plain=True)
    with pytest.raises(EvaluationError, match="opened the candidate as a plain session"):
        generation().evaluate(models["same"], ctx)
    ctx, _ = context(tmp_path, models["reference"], Dataset(inputs={"text": np.zeros((2, 3), dtype=np.float32)}))
    with pytest.raises(EvaluationError, match="reads token ids from the dataset's input_ids; dataset 'text' has none"):
        generation().evaluate(models["same"], ctx)
    ctx, _ = context(tmp_path, models["reference"], rows_dataset(lengths=(3, 0)))
    with pytest.raises(EvaluationError, match="row\\(s\\) without tokens \\(1\\)"):
        generation().evaluate(models["same"], ctx)
    with pytest.raises(pydantic.ValidationError):
        GenerationEvaluator.Config(data="text", max_new_tokens=1)

    def short(self: BigramSession, prompt: list[int], max_new_tokens: int) -> Generation:
        return Generation([1], 0.001, [])

    monkeypatch.setattr(BigramSession, "generate", short)
    ctx, _ = context(tmp_path, models["reference"], rows_dataset())
    with pytest.raises(EvaluationError, match="returned 1 tokens and 0 decode times for max_new_tokens=4"):
        generation().evaluate(models["same"], ctx)

    def timeless(self: BigramSession, prompt: list[int], max_new_tokens: int) -> Generation:
        return Generation([1] * max_new_tokens, 0.001, [0.0] * (max_new_tokens - 1))

    monkeypatch.setattr(BigramSession, "generate", timeless)
    with pytest.raises(EvaluationError, match="reported a generation step that took no time"):
        generation().evaluate(models["same"], ctx)


def test_memory_runs_generations_of_a_decoder(models, tmp_path: Path) -> None:
    ctx, target = context(tmp_path, models["reference"], rows_dataset())
    result = Memory(Memory.Config(data="text", runs=2, batch_size=2, max_new_tokens=6)).evaluate(models["same"], ctx)
    assert result.details["generation"] == {"max_new_tokens": 6, "prompts": 2, "sampling": "greedy"}
    (session,) = target.sessions  # the model alone: the reference is never opened
    assert isinstance(session, BigramSession) and session.generations == 4
    assert result.values["peak_rss_mb"] > 0
    # without the option the key of an existing memory evaluation is unchanged
    assert "max_new_tokens" not in Memory.Config().to_json()
    assert Memory.Config(max_new_tokens=8).to_json()["max_new_tokens"] == 8


def test_the_defaults_are_lean_and_wake_ups_between_turns_are_short(models, tmp_path: Path, monkeypatch) -> None:
    """Defaults: 16 new tokens, 1 warm-up per fresh session, 1 timed generation per round, 4 rounds over 2
    pairs of sessions; the untimed wake-up before each model's turn in a round makes 2 tokens, not 16."""
    asked: list[int] = []
    real = BigramSession.generate

    def counted(self: BigramSession, prompt: list[int], max_new_tokens: int) -> Generation:
        asked.append(max_new_tokens)
        return real(self, prompt, max_new_tokens)

    monkeypatch.setattr(BigramSession, "generate", counted)
    ctx, _ = context(tmp_path, models["reference"], rows_dataset())
    result = GenerationEvaluator(GenerationEvaluator.Config(data="text", quiet_wait_s=0, precision=0.9)).evaluate(models["same"], ctx)
    d = result.details
    assert (d["max_new_tokens"], d["warmup"], d["runs_per_round"], d["rounds"], d["sessions"]) == (16, 1, 1, 4, 2)
    # per model a 2-token wake-up per round (4 each, 8 in all); every other generation (warm-ups of a fresh
    # session, timed ones, those covering prompts for greedy_match) makes the full 16
    assert asked.count(2) == 8
    assert set(asked) == {2, 16}


def test_the_rounds_stop_on_the_decode_speedups_interval(models, tmp_path: Path) -> None:
    """The objective is ranked by decode_speedup, so the stopping rule's interval is that one's."""
    ctx, _ = context(tmp_path, models["reference"], rows_dataset())
    result = generation(max_new_tokens=6).evaluate(models["slow"], ctx)
    v = result.values
    assert result.details["interval_half_width"] == pytest.approx(
        (v["decode_speedup_high"] - v["decode_speedup_low"]) / 2 / v["decode_speedup"]
    )


def test_the_references_continuations_are_cached_for_the_next_candidates(models, tmp_path: Path) -> None:
    """The prompts the rounds do not reach are generated once by the reference for greedy_match,
    then taken from the evaluation cache: a second candidate's reference generates only in its
    rounds, and the match is the same as without the cache."""
    data = rows_dataset(lengths=(3, 4, 2, 5, 3, 2, 4, 3), seed=7)
    data.inputs["input_ids"][[0, 3], [2, 4]] = CHANGED
    cold_ctx, cold = context(tmp_path / "a", models["reference"], data, cache=True)
    first = generation(limit=8).evaluate(models["changed"], cold_ctx)
    warm_ctx, warm = context(tmp_path / "a", models["reference"], data, cache=True)
    second = generation(limit=8).evaluate(models["changed"], warm_ctx)
    plain_ctx, _ = context(tmp_path / "b", models["reference"], data)
    uncached = generation(limit=8).evaluate(models["changed"], plain_ctx)
    assert first.values["greedy_match"] == second.values["greedy_match"] == uncached.values["greedy_match"] < 1
    assert second.details["greedy_compared_prompts"] == 8 and second.details["nondeterministic_prompts"] == []

    # 4 rounds reach 4 of the 8 prompts: the first reference covers the other 4, the second does not
    # 4 rounds over 2 pairs of sessions reach prompts 0-3; the last pair covers 4-7 once (not 0-1
    # again, which the first pair generated); the second candidate's reference takes them from the cache
    assert [s.generations for s in cold.sessions[1::2]] == [5, 9]
    assert [s.generations for s in warm.sessions[1::2]] == [5, 5]
    assert [s.generations for s in warm.sessions[0::2]] == [5, 9]  # a candidate's own are never taken from a cache
