"""The generation evaluators' clock: a model under it (``GenerationArm``: greedy generations from the
rounds' prompts, their continuations kept), the figures of a set of generations (``Figures``), and the
rounds of a decoder, which stop on the decode speedup's interval (``DecodeRounds``). numpy is imported
inside functions: the engine imports the evaluator modules at validate time."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.core.stats import Interval, bootstrap
from evaluators._rounds import Rounds

if TYPE_CHECKING:
    from engine.core.target import Generation, Session


class Timings(list[int]):
    """A round's end-to-end times (ns), one per generation, with the generations they came from
    (what ``Rounds`` keeps per arm and round, so the kept rounds' generations can be read back)."""

    def __init__(self, generations: list[Generation]) -> None:
        super().__init__(round(g.total_s * 1e9) for g in generations)
        self.generations = generations


#: the tokens of a wake-up generation between rounds (a prefill and one decode step)
WAKE_TOKENS = 2

#: one greedy generation: (session, prompt or source, max_new_tokens, role) -> its tokens and timings
Produce = Callable[[Any, Any, int, str], "Generation"]


class GenerationArm:
    """One model under the clock: generations from the prompts (a decoder's token ids, an
    encoder-decoder's sources), in the rounds' order (round k uses prompt k modulo the number of
    prompts, for both models). The continuation of each prompt is kept, and a prompt that
    generates differently twice is noted."""

    def __init__(self, role: str, session: Session, prompts: list[Any], max_new_tokens: int, first_round: int, produce: Produce) -> None:
        self.role, self.session, self.prompts, self.max_new_tokens = role, session, prompts, max_new_tokens
        self.produce = produce
        self.next = first_round  # the index of the next round this arm times
        self.outputs: dict[int, list[int]] = {}
        self.unstable: set[int] = set()
        self.warmed = False

    def _generate(self, index: int) -> Generation:
        index %= len(self.prompts)
        out = self.produce(self.session, self.prompts[index], self.max_new_tokens, self.role)
        seen = self.outputs.setdefault(index, out.tokens)
        if seen != out.tokens:
            self.unstable.add(index)
        return out

    def warm_up(self, runs: int) -> None:
        """``runs`` untimed generations from the next round's prompts: full length on a fresh session
        (its first generations allocate the cache and load the kernels), then ``WAKE_TOKENS`` long
        (the wake-up before each arm's turn in a round only has to get its threads running; a
        full-length one cost as much as the timed generation itself)."""
        for i in range(runs):
            if self.warmed:
                self.produce(
                    self.session, self.prompts[(self.next + i) % len(self.prompts)], min(WAKE_TOKENS, self.max_new_tokens), self.role
                )
            else:
                self._generate(self.next + i)
        self.warmed = True
        self.session.synchronize()

    def time(self, runs: int) -> list[int]:
        """The next round: ``runs`` generations from its prompt."""
        self.session.synchronize()
        generations = [self._generate(self.next) for _ in range(runs)]
        self.next += 1
        return Timings(generations)

    def cover(self, known: dict[int, list[int]] | None = None) -> None:
        """One untimed generation from each prompt not yet generated (for ``greedy_match``), but for
        the prompts whose continuation is ``known`` already (from an earlier pair of sessions, or the
        reference's from the cache)."""
        for index in range(len(self.prompts)):
            if index not in self.outputs and index not in (known or {}):
                self._generate(index)


class DecodeRounds(Rounds):
    """The rounds of a decoder's generation, whose stopping rule (and ``interval_half_width``) is on the
    figure its objective is ranked by: the decode speedup per round (the candidate's decode rate over the
    reference's), not the end-to-end one, in which the prefill's noise would keep the rounds going."""

    def interval(self) -> Interval:
        decode = [decode_speedup(r.times_ns) for r in self.kept]
        return bootstrap(decode, "median", self.cfg.confidence, groups=[r.block for r in self.kept])


def decode_speedup(times_ns: list[list[int]]) -> float:
    return Figures(generations(times_ns[1])).decode_tokens_per_s / Figures(generations(times_ns[0])).decode_tokens_per_s


def generations(times: list[int]) -> list[Generation]:
    assert isinstance(times, Timings)
    return times.generations


class Figures:
    """The figures of a set of generations."""

    def __init__(self, generations: list[Generation]) -> None:
        import numpy as np

        self.generations = generations
        self.ttft_ms = float(np.median([g.prefill_s for g in generations])) * 1e3
        self.e2e_ms = float(np.median([g.total_s for g in generations])) * 1e3
        self.decode_tokens = sum(len(g.decode_s) for g in generations)
        self.decode_s = sum(sum(g.decode_s) for g in generations)
        self.new_tokens = sum(len(g.tokens) for g in generations)
        self.total_s = sum(g.total_s for g in generations)
        self.decode_tokens_per_s = self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0
        self.tokens_per_s = self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def totals(self) -> dict[str, float]:
        return {
            "decode_tokens": self.decode_tokens,
            "decode_s": self.decode_s,
            "new_tokens_total": self.new_tokens,
            "total_s": self.total_s,
        }
