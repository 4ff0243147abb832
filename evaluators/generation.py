"""Generation: what a user of a decoder feels (time to first token, decode tokens per second,
end-to-end time for a prompt and an output length), measured as a comparison with the reference.

Prompts are the token rows of a dataset (``input_ids`` where ``attention_mask`` is 1; a text
source tokenized with the model's tokenizer). Generation is greedy (``GenerativeSession.generate``)
and makes exactly ``max_new_tokens`` tokens, so runs repeat and both models do the same work.

As in the latency evaluator (whose clock, ``evaluators._rounds``, is reused), the candidate and
the reference are opened side by side and timed in interleaved rounds, their order alternating,
over several fresh pairs of sessions, with the machine watched: a round taken while other processes
keep it busy is thrown away and taken again once it is quiet. A round is one prompt (the rounds
cycle through them): each model generates from it ``runs_per_round`` times, after one untimed
generation that wakes its threads (as latency's rounds do; after a fresh session's warm-up it makes
``_generation_clock.WAKE_TOKENS``, not the full length). Per round, and so on the same prompt:

- ``decode_speedup``: the candidate's decode rate over the reference's (decode tokens / decode
  seconds of the round's generations): what the stopping rule's interval, ``precision``, is
  computed on (``DecodeRounds``), as an objective on ``decode_tokens_per_s`` is ranked by it;
- ``ttft_speedup``: the reference's median time to first token over the candidate's;
- ``e2e_speedup``: the reference's median end-to-end time over the candidate's (the stopping
  rule's figure for ``seq2seq_generation``, ranked by end-to-end tokens per second).

Their medians over rounds are the metrics, with the per-round samples grouped by pair of sessions
(a clustered bootstrap, as latency's speedup). The candidate's own figures come from all its timed
generations: ``ttft_ms`` and ``e2e_ms`` are medians per generation; ``decode_tokens_per_s`` is decode
tokens over decode seconds and ``tokens_per_s`` new tokens over end-to-end seconds, both summed
over the generations, so ``decode_tokens_per_s * decode_s = decode_tokens`` (the details hold
both). ``greedy_match`` is the fraction of prompts on which the candidate's continuation equals
the reference's token for token. The reference itself is timed alone: its speedups are 1 and its
match is 1 by definition.

numpy is imported inside functions: the engine imports this module at validate time.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from engine.core.errors import EvaluationError
from engine.core.evaluator import EvalContext, Evaluator, MetricResult, Samples
from engine.core.refs import DatasetRef
from engine.core.stats import bootstrap
from evaluators._generation_clock import DecodeRounds, Figures, GenerationArm, decode_speedup, generations
from evaluators._refcache import ReferenceOutputs
from evaluators._rounds import Rounds
from evaluators._sessions import ComparisonRules
from evaluators._tokens import generate, open_generative, row_entries, token_rows

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import Generation, Session, Target

logger = logging.getLogger(__name__)


class GenerationTiming(ComparisonRules):
    """The options of generation timing (the ``generation`` and ``seq2seq_generation`` evaluators'),
    beside where their prompts come from."""

    max_new_tokens: int = Field(
        default=16,
        ge=2,
        le=1_000_000,
        description="Tokens each generation makes (at least 2: the first is the prefill's, the rest are decoded).",
    )
    warmup: int = Field(default=1, ge=0, le=10_000, description="Untimed generations of each model per pair of sessions before timing.")
    runs_per_round: int = Field(
        default=1, ge=1, le=10_000, description="Timed generations of each model in one round (all from the round's prompt)."
    )
    sessions: int = Field(default=2, ge=1, le=1000, description="Fresh pairs of sessions the rounds are spread over (at least).")
    min_rounds: int = Field(
        default=4,
        ge=2,
        le=100_000,
        description="Rounds to take at least (each round times both models on one prompt); more are taken, a pair of sessions at "
        "a time, only while the interval is wider than `precision` asks.",
    )
    max_rounds: int = Field(
        default=60, ge=2, le=100_000, description="Rounds to take at most while the interval is still wider than `precision` asks."
    )

    @property
    def runs(self) -> int:
        """What ``Rounds`` asks of the candidate's timed runs besides the rounds: nothing more."""
        return 1

    @property
    def min_time_s(self) -> float:
        return 0.0

    @model_validator(mode="after")
    def _rounds_order(self) -> GenerationTiming:
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds ({self.max_rounds}) is below min_rounds ({self.min_rounds})")
        return self


class Continuations:
    """The reference's greedy continuation of each prompt, one evaluation-cache entry per prompt
    (evaluators._tokens.row_entries: keyed by the reference, its target and the prompt's tokens), so
    the candidates after the first take the prompts the rounds did not reach from the cache, for
    ``greedy_match``, instead of generating them with the reference again (on a 0.7 B FP32 decoder
    that was about 30 s per candidate)."""

    def __init__(self, entries: list[ReferenceOutputs]) -> None:
        self.entries = entries

    def load(self) -> dict[int, list[int]]:
        found = {}
        for index, entry in enumerate(self.entries):
            cached = entry.load()
            if cached is not None:
                found[index] = [int(t) for t in cached[1][0]["tokens"]]
        return found

    def merge(self, outputs: dict[int, list[int]], known: dict[int, list[int]]) -> set[int]:
        """Fill ``outputs`` with the known continuations it lacks, cache those it has that were not
        known; returns the prompts whose generation now differs from the cached one."""
        import numpy as np

        differ = {index for index, tokens in known.items() if index in outputs and outputs[index] != tokens}
        for index, tokens in outputs.items():
            if index not in known:
                self.entries[index].save(["tokens"], [{"tokens": np.asarray(tokens, dtype=np.int64)}])
        for index, tokens in known.items():
            outputs.setdefault(index, tokens)
        return differ


class GenerationEvaluator(Evaluator):
    name = "generation"
    summary = (
        "Greedy generation from a dataset's prompts: time to first token, decode tokens per second and end-to-end time, "
        "timed against the reference in interleaved rounds (speedups with confidence intervals), and whether the "
        "candidate's continuations match the reference's."
    )
    version = "2"  # 2: stop_when_faster_than
    timing = True
    needs_reference = True
    metrics = (
        "ttft_ms",
        "decode_tokens_per_s",
        "e2e_ms",
        "tokens_per_s",
        "new_tokens",
        "decode_speedup",
        "decode_speedup_low",
        "decode_speedup_high",
        "ttft_speedup",
        "e2e_speedup",
        "reference_ttft_ms",
        "reference_decode_tokens_per_s",
        "greedy_match",
        "rounds",
        "others_cores",
    )
    #: the clock: rounds that stop once the decode speedup's interval is within ``precision``
    rounds_class: type[Rounds] = DecodeRounds
    paired_metrics = {
        "decode_tokens_per_s": "decode_speedup",
        "ttft_ms": "ttft_speedup",
        "e2e_ms": "e2e_speedup",
        "tokens_per_s": "e2e_speedup",
    }

    class Config(GenerationTiming):
        data: DatasetRef = Field(
            description="A dataset of prompts (input_ids + attention_mask), e.g. text_lines with the model's tokenizer."
        )
        limit: int | None = Field(
            default=8, ge=1, description="Use the first N rows as prompts (null: every row); the rounds cycle through them."
        )

    config: Config

    def prompts(self, model: ModelArtifact, ctx: EvalContext) -> tuple[list[Any], list[int]]:
        """What the rounds cycle through, and each one's length in tokens (for the record)."""
        cfg = self.config
        prompts = token_rows(ctx, cfg.data, cfg.limit, self.name)
        empty = [index for index, prompt in enumerate(prompts) if not prompt]
        if empty:
            raise EvaluationError(
                f"dataset '{cfg.data}' has row(s) without tokens ({', '.join(map(str, empty[:5]))}): a prompt needs one at least"
            )
        return prompts, [len(p) for p in prompts]

    def open(self, ctx: EvalContext, model: ModelArtifact, role: str, target: Target | None = None) -> Session:
        return open_generative(ctx, model, role, self.name, target=target)

    def produce(self, session: Any, prompt: Any, max_new_tokens: int, role: str) -> Generation:
        """One greedy generation of ``max_new_tokens`` tokens from ``prompt``."""
        return generate(session, prompt, max_new_tokens, role)

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:  # long: the blocks of fresh sessions, in one loop
        cfg = self.config
        prompts, lengths = self.prompts(model, ctx)
        compared = ctx.reference is not None
        rounds = self.rounds_class(cfg, arms=2 if compared else 1)
        outputs: list[dict[int, list[int]]] = [{}, {}]  # per arm: prompt index -> continuation
        unstable: set[int] = set()
        session_details: dict[str, Any] = {}
        reference_details: dict[str, Any] = {}
        continuations = self.continuations(ctx, model, prompts)
        known = continuations.load() if continuations is not None else {}
        while True:
            # one block: a fresh pair of sessions, warmed up, timed for a few rounds, closed
            opened: list[Session] = []
            done = False
            try:
                start = len(rounds.kept) + rounds.discarded
                candidate = self.open(ctx, model, "candidate" if compared else "model")
                opened.append(candidate)
                session_details = dict(candidate.details)
                arms = [GenerationArm("candidate" if compared else "model", candidate, prompts, cfg.max_new_tokens, start, self.produce)]
                if compared:
                    assert ctx.reference is not None
                    reference = self.open(ctx, ctx.reference, "reference", target=ctx.reference_on)
                    opened.append(reference)
                    reference_details = dict(reference.details)
                    arms.insert(0, GenerationArm("reference", reference, prompts, cfg.max_new_tokens, start, self.produce))
                for arm in arms:
                    arm.warm_up(cfg.warmup)
                rounds.block(arms)
                done = rounds.enough()
                if done and compared:  # the prompts neither an earlier pair of sessions nor the cache reached
                    for i, arm in enumerate(arms):
                        arm.cover({**outputs[i], **(known if arm.role == "reference" else {})})
                for i, arm in enumerate(arms):
                    for index, tokens in arm.outputs.items():
                        if outputs[i].setdefault(index, tokens) != tokens:
                            unstable.add(index)
                    unstable |= arm.unstable
            finally:
                for session in opened:
                    session.close()
            if done:
                break
        if continuations is not None:  # the reference's (the model's own when alone): cached for the next candidates
            unstable |= continuations.merge(outputs[0], known)
        sessions = (session_details, reference_details)
        return self._result(rounds, outputs[: rounds.arms], sorted(unstable), sessions, ctx, lengths)

    def continuations(self, ctx: EvalContext, model: ModelArtifact, prompts: list[Any]) -> Continuations | None:
        """The reference's greedy continuations of the prompts (token rows), cached per prompt (None:
        no cache folder). Evaluated alone, the model is the reference: what it generates is kept."""
        if ctx.cache_dir is None:
            return None
        reference, target = (ctx.reference, ctx.reference_on) if ctx.reference is not None else (model, ctx.target)
        return Continuations(row_entries(ctx, reference, target, f"greedy-{self.config.max_new_tokens}", prompts))

    # long: one flat record of every figure and of how it was taken, read top to bottom
    def _result(
        self,
        rounds: Rounds,
        outputs: list[dict[int, list[int]]],
        unstable: list[int],
        sessions: tuple[dict[str, Any], dict[str, Any]],
        ctx: EvalContext,
        prompt_lengths: list[int],
    ) -> MetricResult:
        cfg = self.config
        session, reference_session = sessions
        compared = rounds.arms == 2
        blocks = [r.block for r in rounds.kept]
        per_arm = [[g for r in rounds.kept for g in generations(r.times_ns[i])] for i in range(rounds.arms)]
        mine = Figures(per_arm[-1])
        values: dict[str, float] = {
            "ttft_ms": mine.ttft_ms,
            "decode_tokens_per_s": mine.decode_tokens_per_s,
            "e2e_ms": mine.e2e_ms,
            "tokens_per_s": mine.tokens_per_s,
            "new_tokens": float(cfg.max_new_tokens),
            "rounds": float(len(rounds.kept)),
            "others_cores": rounds.mean_others(),
        }
        samples = {"ttft_ms": Samples("median", [Figures(generations(r.times_ns[-1])).ttft_ms for r in rounds.kept], blocks)}
        details: dict[str, Any] = {
            "method": "interleaved rounds against the reference" if compared else "rounds, alone",
            "sampling": "greedy",
            "prompts": len(prompt_lengths),
            "prompt_tokens": {"min": min(prompt_lengths), "max": max(prompt_lengths), "mean": sum(prompt_lengths) / len(prompt_lengths)},
            "max_new_tokens": cfg.max_new_tokens,
            "generations": len(per_arm[-1]),
            "warmup": cfg.warmup,
            "runs_per_round": cfg.runs_per_round,
            "sessions": rounds.blocks,
            "rounds": len(rounds.kept),
            "rounds_thrown_away": rounds.discarded,
            "stopped_because": rounds.stop_reason,
            "precision": cfg.precision,
            "confidence": cfg.confidence,
            "noise": rounds.noise(),
            "data": cfg.data or "synthetic",
            **mine.totals(),
            "nondeterministic_prompts": unstable,
            "session": session,
            "target": ctx.target.id,
        }
        if compared:
            paired = self._paired(rounds, outputs, Figures(per_arm[0]), blocks, reference_session, ctx)
            values |= paired.values
            samples |= paired.samples
            details |= paired.details
        else:  # the reference itself: its speedups and match are 1 by definition
            values |= dict.fromkeys(("decode_speedup", "decode_speedup_low", "decode_speedup_high", "ttft_speedup", "e2e_speedup"), 1.0)
            values |= {"reference_ttft_ms": mine.ttft_ms, "reference_decode_tokens_per_s": mine.decode_tokens_per_s, "greedy_match": 1.0}
        logger.debug(
            "generation on %s: ttft %.3f ms, decode %.1f tok/s, decode speedup %.3f over %d rounds",
            ctx.target.id,
            values["ttft_ms"],
            values["decode_tokens_per_s"],
            values["decode_speedup"],
            len(rounds.kept),
        )
        return MetricResult(values=values, details=details, samples=samples)

    def _paired(
        self,
        rounds: Rounds,
        outputs: list[dict[int, list[int]]],
        ref: Figures,
        blocks: list[int],
        reference_session: dict[str, Any],
        ctx: EvalContext,
    ) -> MetricResult:
        """The figures against the reference, round by round: speedups with their samples, the
        greedy match, the reference's own figures."""
        import numpy as np

        cfg = self.config
        decode = [decode_speedup(r.times_ns) for r in rounds.kept]
        ttft = [Figures(generations(r.times_ns[0])).ttft_ms / Figures(generations(r.times_ns[1])).ttft_ms for r in rounds.kept]
        e2e = rounds.ratios()
        decode_interval = bootstrap(decode, "median", cfg.confidence, groups=blocks)
        matched = [float(outputs[1][i] == outputs[0][i]) for i in sorted(outputs[0]) if i in outputs[1]]
        values = {
            "decode_speedup": float(np.median(decode)),
            "decode_speedup_low": decode_interval.low,
            "decode_speedup_high": decode_interval.high,
            "ttft_speedup": float(np.median(ttft)),
            "e2e_speedup": float(np.median(e2e)),
            "reference_ttft_ms": ref.ttft_ms,
            "reference_decode_tokens_per_s": ref.decode_tokens_per_s,
            "greedy_match": float(np.mean(matched)),
        }
        samples = {
            "decode_speedup": Samples("median", decode, blocks),
            "ttft_speedup": Samples("median", ttft, blocks),
            "e2e_speedup": Samples("median", e2e, blocks),
            "greedy_match": Samples("mean", matched),
        }
        interval = rounds.interval()
        details = {
            "interval_half_width": interval.half_width / interval.estimate,
            "greedy_matched_prompts": int(sum(matched)),
            "greedy_compared_prompts": len(matched),
            "reference": {"ttft_ms": ref.ttft_ms, "e2e_ms": ref.e2e_ms, **ref.totals(), "session": reference_session},
            "reference_target": ctx.reference_on.id,
        }
        return MetricResult(values=values, details=details, samples=samples)
