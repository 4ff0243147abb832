"""Intervals for figures measured on samples: a percentile bootstrap, seeded so the same samples
always give the same interval.

Evaluators hand their per-sample figures to the engine (``MetricResult.samples``: the cosine of
each sentence, whether each image was classified right, the speedup of each timing round), and
the engine judges constraints and ties on intervals computed here at the workflow's confidence.
numpy is imported inside the functions: the SDK stays light to import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Statistic = Literal["mean", "median"]
STATISTICS: tuple[Statistic, ...] = ("mean", "median")
#: bootstrap resamples: enough that the 2.5% / 97.5% quantiles move by well under the interval's width
RESAMPLES = 4000
#: values a clustered bootstrap draws at once (bounds its memory: about 40 bytes each)
CHUNK_VALUES = 4_000_000


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided confidence interval."""

    estimate: float
    low: float
    high: float
    confidence: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    def within_ratio(self, margin: float) -> bool:
        """A ratio's interval lies wholly within ``margin`` of 1 (between 1 / (1 + margin) and
        1 + margin): the two things compared are equivalent within that margin. Never for a margin of 0."""
        return margin > 0 and 1 / (1 + margin) <= self.low and self.high <= 1 + margin

    def to_json(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "confidence": self.confidence}


def point(values: Sequence[float], statistic: Statistic = "mean") -> float:
    import numpy as np

    array = np.asarray(values, dtype=np.float64)
    return float(array.mean() if statistic == "mean" else np.median(array))


def bootstrap(
    values: Sequence[float],
    statistic: Statistic = "mean",
    confidence: float = 0.95,
    seed: int = 0,
    groups: Sequence[int] | None = None,
) -> Interval:
    """The percentile-bootstrap interval of ``statistic`` over ``values``.

    With ``groups`` (one label per value) the bootstrap is clustered: groups are resampled, then
    values within each chosen group. Values that share a group share what made them (timing
    rounds of one pair of sessions share its memory layout and thread placement), and a flat
    bootstrap would treat them as independent and give an interval too narrow to trust.

    One sample (or identical samples) gives a zero-width interval: there is nothing to resample,
    which callers see as "no uncertainty measured" rather than as certainty they should trust;
    evaluators report how many samples stand behind each figure.
    """
    import numpy as np

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, not {confidence}")
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise ValueError("no samples to bootstrap")
    if groups is not None and len(groups) != array.size:
        raise ValueError(f"{len(groups)} group labels for {array.size} values")
    estimate = point(array.tolist(), statistic)
    if array.size == 1 or bool(np.all(array == array[0])):
        return Interval(estimate, estimate, estimate, confidence)
    rng = np.random.default_rng(seed)
    if groups is None or len(set(groups)) < 2:
        resampled = array[rng.integers(0, array.size, size=(RESAMPLES, array.size))]
        stats = resampled.mean(axis=1) if statistic == "mean" else np.median(resampled, axis=1)
    else:
        stats = _clustered(array, np.asarray(groups), statistic, rng)
    alpha = (1 - confidence) / 2
    low, high = (float(v) for v in np.quantile(stats, [alpha, 1 - alpha]))
    # the estimate lies inside its own interval even when the bootstrap distribution is skewed
    return Interval(estimate, min(low, estimate), max(high, estimate), confidence)


def _clustered(array: Any, groups: Any, statistic: Statistic, rng: Any) -> Any:
    """RESAMPLES statistics of a two-stage resample: groups with replacement, then values within
    each chosen group with replacement (vectorised: groups padded to the largest with NaN)."""
    import numpy as np

    labels = list(dict.fromkeys(groups.tolist()))
    members = [np.flatnonzero(groups == label) for label in labels]
    sizes = np.array([len(m) for m in members])
    width = int(sizes.max())
    table = np.full((len(members), width), -1, dtype=np.int64)
    for row, member in enumerate(members):
        table[row, : len(member)] = member
    chosen = rng.integers(0, len(members), size=(RESAMPLES, len(members)))
    # resamples in chunks of at most CHUNK_VALUES drawn values, so many samples (the tokens of a
    # perplexity) stay within memory; the generator fills arrays in C order, so drawing the picks
    # chunk by chunk gives exactly the numbers one draw of all of them gives
    step = max(1, CHUNK_VALUES // (len(members) * width))
    stats = []
    for start in range(0, RESAMPLES, step):
        part = chosen[start : start + step]
        picks = (rng.random((len(part), len(members), width)) * sizes[part][..., None]).astype(np.int64)
        index = np.take_along_axis(table[part], picks, axis=2)
        keep = np.arange(width)[None, None, :] < sizes[part][..., None]
        drawn = np.where(keep, array[index], np.nan).reshape(len(part), -1)
        stats.append(np.nanmean(drawn, axis=1) if statistic == "mean" else np.nanmedian(drawn, axis=1))
    return np.concatenate(stats)


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95, seed: int = 0) -> Interval:
    """The interval of mean(a - b) over paired samples (the same inputs scored twice): far
    tighter than comparing two separate intervals, since what both share cancels out."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} vs {len(b)}")
    return bootstrap([x - y for x, y in zip(a, b, strict=True)], "mean", confidence, seed)
