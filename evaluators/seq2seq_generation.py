"""Generation timing of an encoder-decoder model (``seq2seq`` format): time to first token (the
encoder and the first decoder step), decode tokens per second and end-to-end time, beside the
reference's, and whether the two continue each source the same way.

The clock is the ``generation`` evaluator's (``evaluators.generation``, on ``evaluators._rounds``):
the candidate and the reference are opened side by side and timed in interleaved rounds, their
order alternating, over several fresh pairs of sessions, with the machine watched (a round taken
while other processes keep it busy is thrown away and taken again once it is quiet); the same
figures, speedups and per-round samples. Only the prompts differ: a round is one source (a
dataset's rows, else synthetic token ids or log-mel features; see ``evaluators._seq2seq``), from
which each model generates exactly ``max_new_tokens`` tokens with Kiln's greedy loop over the
decoder's cache. numpy is imported inside functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from engine.core.refs import DatasetRef
from evaluators._rounds import Rounds
from evaluators._seq2seq import generate, open_seq2seq, sources
from evaluators.generation import GenerationEvaluator, GenerationTiming

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact
    from engine.core.evaluator import EvalContext
    from engine.core.target import Generation, Session, Target


class Seq2SeqGeneration(GenerationEvaluator):
    name = "seq2seq_generation"
    summary = (
        "Greedy generation of an encoder-decoder model: time to first token (encoder + first step), decode tokens per second "
        "and end-to-end time, timed against the reference in interleaved rounds (speedups with confidence intervals), and "
        "whether the continuations match."
    )
    version = "3"  # 3: stop_when_faster_than

    rounds_class = Rounds  # ranked by end-to-end tokens per second: the rounds stop on that interval

    class Config(GenerationTiming):  # the generation evaluator's clock; sources instead of prompts
        data: DatasetRef | None = Field(
            default=None,
            description="A dataset of sources (input_ids + attention_mask, or input_features). Omit for synthetic ones.",
        )
        samples: int = Field(default=4, ge=1, le=10_000, description="Sources the rounds cycle through (the first N rows of `data`).")
        max_new_tokens: int = Field(default=16, ge=2, le=4096, description="Tokens each generation makes (at least 2).")

    config: Config  # type: ignore[assignment]

    def prompts(self, model: ModelArtifact, ctx: EvalContext) -> tuple[list[Any], list[int]]:
        found = sources(ctx, model, self.config.data, self.config.samples, self.name)
        return found, [int(next(iter(source.values())).shape[-1]) for source in found]

    def open(self, ctx: EvalContext, model: ModelArtifact, role: str, target: Target | None = None) -> Session:
        return open_seq2seq(ctx, model, role, self.name, target=target)

    def continuations(self, ctx: EvalContext, model: ModelArtifact, prompts: list[Any]) -> None:
        """Not cached: a source is a dict of arrays (features or token ids), not a token row, and its
        few short continuations cost little next to a decoder's."""
        return None

    def produce(self, session: Any, prompt: Any, max_new_tokens: int, role: str) -> Generation:
        return generate(session, prompt, max_new_tokens, role)
