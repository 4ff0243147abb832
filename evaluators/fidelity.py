"""Fidelity: how closely a candidate's outputs follow the reference model's on the same inputs.

Per sample and output, the cosine similarity of the flattened outputs and their absolute
differences, in float64; padding positions (mask 0) are left out, since what a model writes there
is noise. numpy is imported inside functions: the engine imports this module at validate time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import Field

from engine.core.errors import EvaluationError
from engine.core.evaluator import EvalContext, Evaluator, EvaluatorConfig, MetricResult, Samples
from engine.core.refs import DatasetRef
from evaluators._refcache import MAX_BYTES, ReferenceOutputs, feeds_digest
from evaluators._sessions import dataset, open_reference, open_session, run_session, select_feeds

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.target import Session

    Batch = dict[str, np.ndarray]

logger = logging.getLogger(__name__)


@dataclass
class _Tally:
    """Running figures for one output."""

    cosines: list[float] = field(default_factory=list)
    max_abs: float = 0.0
    abs_sum: float = 0.0
    count: int = 0
    nonfinite: int = 0
    masked: bool = False

    def summary(self) -> dict[str, Any]:
        return {
            "cosine_mean": sum(self.cosines) / len(self.cosines) if self.cosines else 1.0,
            "cosine_min": min(self.cosines) if self.cosines else 1.0,
            "max_abs_error": self.max_abs,
            "mean_abs_error": self.abs_sum / self.count if self.count else 0.0,
            "samples": len(self.cosines),
            "elements_compared": self.count,
            "nonfinite_values": self.nonfinite,
            "masked": self.masked,
        }


class Fidelity(Evaluator):
    name = "fidelity"
    summary = "Cosine similarity and absolute error of the candidate's outputs against the reference model's, on a dataset."
    version = "1"
    needs_reference = True
    metrics = ("cosine_mean", "cosine_min", "cosine_p5", "max_abs_error", "mean_abs_error", "samples")

    # a constraint on cosine is judged on the first 16 samples first: a candidate far from the bar
    # (static INT8 of every op at 0.85 against 0.99) is settled there, at a tenth of the cost
    stage_option = "max_samples"
    stage_rows = 16

    class Config(EvaluatorConfig):
        data: DatasetRef = Field(description="The dataset both models are run on.")
        batch_size: int = Field(default=1, ge=1, description="Samples per inference.")
        max_samples: int | None = Field(default=None, ge=1, description="Compare on the first N samples only. Omit for the whole dataset.")
        outputs: list[str] | None = Field(
            default=None, min_length=1, description="Outputs to compare. Omit for every output the two models share by name."
        )
        mask_input: str | None = Field(
            default="attention_mask",
            description=(
                "A dataset input marking real positions (1) and padding (0). Where an output's first two axes match its "
                "[batch, sequence] shape, padding positions are left out of every figure. null to compare everything."
            ),
        )

    config: Config

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        cfg = self.config
        data = dataset(ctx, cfg.data)
        count = len(data) if cfg.max_samples is None else min(cfg.max_samples, len(data))
        if ctx.reference is None:
            # This model is the reference: it matches itself exactly, nothing needs to run.
            values = {
                "cosine_mean": 1.0,
                "cosine_min": 1.0,
                "cosine_p5": 1.0,
                "max_abs_error": 0.0,
                "mean_abs_error": 0.0,
                "samples": float(count),
            }
            return MetricResult(values=values, details={"reference": True, "data": cfg.data, "dataset_size": len(data), "samples": count})

        cache = self._reference_cache(ctx, data, count)
        with _Reference(ctx, cfg.data, cache, lambda: data.batches(cfg.batch_size, limit=count)) as reference:
            candidate = open_session(ctx, model, "candidate")  # after the reference ran, unless it streams
            try:
                names = self._outputs(candidate, reference.names)
                tallies = self._compare(candidate, reference, names, data, count)
            finally:
                candidate.close()

        per_output = {name: tally.summary() for name, tally in tallies.items()}
        cosines = [c for tally in tallies.values() for c in tally.cosines]
        elements = sum(t.count for t in tallies.values())
        # one cosine per sample: the mean over a sample's outputs, so the samples stay independent
        # (what the interval of cosine_mean is bootstrapped over)
        per_sample = [sum(values) / len(values) for values in zip(*(t.cosines for t in tallies.values()), strict=True)]
        worst = min(range(len(per_sample)), key=per_sample.__getitem__)
        values = {
            "cosine_mean": sum(cosines) / len(cosines),
            "cosine_min": min(cosines),
            "cosine_p5": _percentile(per_sample, 5),
            "max_abs_error": max(t.max_abs for t in tallies.values()),
            "mean_abs_error": sum(t.abs_sum for t in tallies.values()) / elements if elements else 0.0,
            "samples": float(count),
        }
        details = {
            "reference": False,
            "reference_digest": ctx.reference.digest,
            "data": cfg.data,
            "dataset_size": len(data),
            "samples": count,
            "batch_size": cfg.batch_size,
            "outputs": names,
            "per_output": per_output,
            "mask_input": cfg.mask_input if cfg.mask_input in data.inputs else None,
            "worst_sample": {"index": worst, "cosine": per_sample[worst]},
            "target": ctx.target.id,
            "reference_target": ctx.reference_on.id,
            "reference_outputs": cache.status,
        }
        logger.debug("fidelity of %s: cosine mean %.6f over %d samples", model.digest[:12], values["cosine_mean"], count)
        return MetricResult(values=values, details=details, samples={"cosine_mean": Samples("mean", per_sample)})

    def _reference_cache(self, ctx: EvalContext, data: Any, count: int) -> ReferenceOutputs:
        """The cache entry of the reference's outputs on exactly these feeds on the target the
        reference runs on (so candidates that differ only in session settings share it)."""
        assert ctx.reference is not None
        key_doc = {
            "reference": ctx.reference.digest,
            "target": ctx.reference_on.fingerprint(),
            "batch_size": self.config.batch_size,
            "samples": count,
            "feeds": feeds_digest(data.batches(self.config.batch_size, limit=count)),
        }
        return ReferenceOutputs(ctx.cache_dir, key_doc)

    def _outputs(self, candidate: Session, reference_names: list[str]) -> list[str]:
        have = [spec.name for spec in candidate.outputs]
        ref = set(reference_names)
        if self.config.outputs is not None:
            absent = [name for name in self.config.outputs if name not in have or name not in ref]
            if absent:
                raise EvaluationError(
                    f"output(s) {', '.join(absent)} asked for in `outputs` are not produced by both models "
                    f"(candidate: {', '.join(have)}; reference: {', '.join(sorted(ref))})"
                )
            return list(self.config.outputs)
        shared = [name for name in have if name in ref]
        if not shared:
            raise EvaluationError(
                f"the candidate and the reference share no output name (candidate: {', '.join(have)}; reference: {', '.join(sorted(ref))}); "
                "name the outputs to compare with `outputs`, or keep output names when transforming the model"
            )
        return shared

    def _compare(self, candidate: Session, reference: _Reference, names: list[str], data: Any, count: int) -> dict[str, _Tally]:
        cfg = self.config
        cand_index = {spec.name: i for i, spec in enumerate(candidate.outputs)}
        tallies = {name: _Tally() for name in names}
        for index, batch in enumerate(data.batches(cfg.batch_size, limit=count)):
            cand_out = run_session(candidate, select_feeds(candidate.inputs, batch, cfg.data, "candidate"), "candidate")
            ref_out = reference.outputs(index, batch)
            mask = batch.get(cfg.mask_input) if cfg.mask_input else None
            for name in names:
                _accumulate(tallies[name], name, cand_out[cand_index[name]], ref_out[name], mask)
        return tallies


class _Reference:
    """The reference's outputs batch by batch: from the cache, or, on a miss, from a session that
    runs every batch first, before the candidate's session runs any (the outputs are then cached).

    One model at a time, not the two alternating batch by batch: a runtime's idle worker threads
    spin for a while after a run (ONNX Runtime's intra-op pool does, by default), and on a small
    machine the model that just ran takes the cores the other one needs. On 2 cores, 192 rows of
    128 tokens took 18.8 s alternating and 9.6 s without the spinning; run one after the other,
    neither waits. Outputs past ``MAX_BYTES`` are not kept: the session then stays open and the
    reference runs beside the candidate, batch by batch, as a stream."""

    def __init__(self, ctx: EvalContext, data_name: str, cache: ReferenceOutputs, batches: Callable[[], Iterable[Batch]]) -> None:
        self.ctx, self.data_name, self.cache, self.batches = ctx, data_name, cache, batches
        self.session: Session | None = None
        self.cached: list[dict[str, np.ndarray]] | None = None
        self.names: list[str] = []

    def __enter__(self) -> _Reference:
        loaded = self.cache.load()
        if loaded is not None:
            self.names, self.cached = loaded
            return self
        assert self.ctx.reference is not None
        self.session = open_reference(self.ctx)
        self.names = [spec.name for spec in self.session.outputs]
        computed: list[dict[str, np.ndarray]] = []
        kept_bytes = 0
        for batch in self.batches():
            outputs = self._run(batch)
            kept_bytes += sum(array.nbytes for array in outputs.values())
            if kept_bytes > MAX_BYTES:  # not worth keeping: stream beside the candidate instead
                self.cache.status = "too large"
                return self
            computed.append(outputs)
        self.session.close()
        self.session = None
        self.cache.save(self.names, computed)
        self.cached = computed
        return self

    def _run(self, batch: Batch) -> dict[str, np.ndarray]:
        assert self.session is not None
        results = run_session(self.session, select_feeds(self.session.inputs, batch, self.data_name, "reference"), "reference")
        return dict(zip(self.names, results, strict=True))

    def outputs(self, index: int, batch: Batch) -> dict[str, np.ndarray]:
        if self.cached is not None:
            return self.cached[index]
        return self._run(batch)

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if self.session is not None:
            self.session.close()


def _accumulate(tally: _Tally, name: str, candidate: np.ndarray, reference: np.ndarray, mask: np.ndarray | None) -> None:
    """Add one batch of one output to ``tally``: a cosine per sample along the first axis."""
    import numpy as np

    cand = np.asarray(candidate, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    if cand.shape != ref.shape:
        raise EvaluationError(f"output '{name}' has shape {list(cand.shape)} in the candidate but {list(ref.shape)} in the reference")
    if cand.ndim == 0:
        cand, ref = cand.reshape(1, 1), ref.reshape(1, 1)
    keep = None
    if mask is not None and mask.ndim == 2 and cand.ndim >= 2 and cand.shape[:2] == mask.shape:
        keep = np.asarray(mask) != 0
        tally.masked = True
    for row in range(cand.shape[0]):
        c, r = cand[row], ref[row]
        if keep is not None:
            c, r = c[keep[row]], r[keep[row]]
        c, r = c.ravel(), r.ravel()
        finite = np.isfinite(c) & np.isfinite(r)
        if not finite.all():
            # a broken candidate (NaN / inf) scores cosine 0 for the sample; errors use the finite part
            tally.nonfinite += int((~finite).sum())
            tally.cosines.append(0.0)
            c, r = c[finite], r[finite]
        else:
            tally.cosines.append(_cosine(c, r))
        if c.size:
            diff = np.abs(c - r)
            tally.max_abs = max(tally.max_abs, float(diff.max()))
            tally.abs_sum += float(diff.sum())
            tally.count += int(c.size)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    import numpy as np

    if np.array_equal(a, b):
        return 1.0  # exactly, not 1 ± rounding
    norm_a, norm_b = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if norm_a == 0.0 and norm_b == 0.0:
        return 1.0  # both all zeros (or nothing left after masking): identical
    if norm_a == 0.0 or norm_b == 0.0:
        return 0.0
    return max(-1.0, min(1.0, float(np.dot(a, b) / (norm_a * norm_b))))


def _percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=np.float64), q))
