"""Generation timing of an encoder-decoder model (``seq2seq`` format): time to first token (the
encoder and the first decoder step), decode tokens per second and end-to-end time, beside the
reference's, and whether the two continue each source the same way.

Sources as in ``seq2seq_fidelity`` (a dataset's rows, else synthetic). After ``warmup`` untimed
generations of each, the candidate and the reference take turns, round by round, their order
alternating, each generating exactly ``max_new_tokens`` tokens from the round's source (round k
uses source k modulo their number). Per round: ``decode_speedup`` (the candidate's decode rate over
the reference's), ``ttft_speedup`` and ``e2e_speedup`` (the reference's time over the
candidate's); their medians are the metrics, with the per-round values as samples. The candidate's
own figures: ``ttft_ms`` and ``e2e_ms`` medians per generation, ``decode_tokens_per_s`` decode tokens
over decode seconds and ``tokens_per_s`` new tokens over end-to-end seconds, summed over its timed
generations. Unlike ``generation`` (decoders), rounds are not spread over fresh sessions nor
retaken while the machine is busy: the figures are a first measure, not a bound.
numpy is imported inside functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from engine.core.evaluator import EvalContext, Evaluator, EvaluatorConfig, MetricResult, Samples
from engine.core.refs import DatasetRef
from evaluators._seq2seq import generate, open_seq2seq, sources

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.target import Generation


def _rates(generations: list[Generation]) -> dict[str, float]:
    import numpy as np

    decode_s = sum(sum(g.decode_s) for g in generations)
    decode_tokens = sum(len(g.decode_s) for g in generations)
    total_s = sum(g.total_s for g in generations)
    return {
        "ttft_ms": float(np.median([g.prefill_s for g in generations]) * 1e3),
        "e2e_ms": float(np.median([g.total_s for g in generations]) * 1e3),
        "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
        "tokens_per_s": sum(len(g.tokens) for g in generations) / total_s if total_s > 0 else 0.0,
    }


class Seq2SeqGeneration(Evaluator):
    name = "seq2seq_generation"
    summary = (
        "Greedy generation of an encoder-decoder model: time to first token (encoder + first step), decode tokens per second "
        "and end-to-end time, timed against the reference in alternating rounds, and whether the continuations match."
    )
    version = "1"
    timing = True
    needs_reference = True
    metrics = (
        "ttft_ms",
        "decode_tokens_per_s",
        "e2e_ms",
        "tokens_per_s",
        "decode_speedup",
        "ttft_speedup",
        "e2e_speedup",
        "reference_ttft_ms",
        "reference_decode_tokens_per_s",
        "greedy_match",
        "rounds",
    )
    paired_metrics = {
        "decode_tokens_per_s": "decode_speedup",
        "ttft_ms": "ttft_speedup",
        "e2e_ms": "e2e_speedup",
        "tokens_per_s": "e2e_speedup",
    }

    class Config(EvaluatorConfig):
        data: DatasetRef | None = Field(
            default=None,
            description="A dataset of sources (input_ids + attention_mask, or input_features). Omit for synthetic ones.",
        )
        samples: int = Field(default=2, ge=1, le=10_000, description="Sources the rounds cycle through.")
        max_new_tokens: int = Field(default=16, ge=2, le=4096, description="Tokens each generation makes (at least 2).")
        warmup: int = Field(default=1, ge=0, le=1000, description="Untimed generations of each model before timing.")
        rounds: int = Field(default=6, ge=2, le=10_000, description="Timed rounds (one generation of each model per round).")

    config: Config

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:  # long: one loop of alternating rounds
        import numpy as np

        cfg = self.config
        found = sources(ctx, model, cfg.data, cfg.samples, self.name)
        compared = ctx.reference is not None
        arms = [open_seq2seq(ctx, model, "candidate" if compared else "model", self.name)]
        timed: list[list[Generation]] = [[], []]
        try:
            if ctx.reference is not None:
                arms.append(open_seq2seq(ctx, ctx.reference, "reference", self.name, target=ctx.reference_on))
            roles = ("candidate", "reference")
            for index, session in enumerate(arms):
                for i in range(cfg.warmup):
                    generate(session, found[i % len(found)], cfg.max_new_tokens, roles[index])
            for round_ in range(cfg.rounds):
                order = list(range(len(arms))) if round_ % 2 == 0 else list(reversed(range(len(arms))))
                for index in order:
                    timed[index].append(generate(arms[index], found[round_ % len(found)], cfg.max_new_tokens, roles[index]))
        finally:
            for session in arms:
                session.close()
        values = _rates(timed[0])
        samples: dict[str, Samples] = {}
        if compared:
            reference = _rates(timed[1])
            pairs = list(zip(timed[0], timed[1], strict=True))
            decode = [_rates([c])["decode_tokens_per_s"] / max(_rates([r])["decode_tokens_per_s"], 1e-12) for c, r in pairs]
            ttft = [r.prefill_s / c.prefill_s for c, r in pairs]
            e2e = [r.total_s / c.total_s for c, r in pairs]
            same = [1.0 if c.tokens == r.tokens else 0.0 for c, r in pairs[: len(found)]]
            values |= {
                "decode_speedup": float(np.median(decode)),
                "ttft_speedup": float(np.median(ttft)),
                "e2e_speedup": float(np.median(e2e)),
                "reference_ttft_ms": reference["ttft_ms"],
                "reference_decode_tokens_per_s": reference["decode_tokens_per_s"],
                "greedy_match": float(np.mean(same)),
            }
            samples = {
                "decode_speedup": Samples("median", decode),
                "ttft_speedup": Samples("median", ttft),
                "e2e_speedup": Samples("median", e2e),
            }
        else:
            values |= {"decode_speedup": 1.0, "ttft_speedup": 1.0, "e2e_speedup": 1.0, "greedy_match": 1.0}
            values |= {"reference_ttft_ms": values["ttft_ms"], "reference_decode_tokens_per_s": values["decode_tokens_per_s"]}
        values["rounds"] = float(cfg.rounds)
        details: dict[str, Any] = {
            "data": cfg.data or "synthetic",
            "sources": len(found),
            "max_new_tokens": cfg.max_new_tokens,
            "decode_loop": arms[0].details.get("decode_loop"),
            "target": ctx.target.id,
        }
        return MetricResult(values=values, details=details, samples=samples)
