"""Logit fidelity: how closely a decoder's next-token distributions follow the reference's on the
same rows of text.

Each row runs through both models in one forward pass (``GenerativeSession.logits``); at every
position the two next-token distributions are compared: whether their most likely tokens agree
(``top1_agreement``, the mean over positions) and the KL divergence KL(reference || candidate) in
nats, computed in float64 from log-softmax (``kl_mean`` the mean over positions, ``kl_max`` the
largest). Both means come with their per-position samples grouped by row, so a bound is judged on
a clustered bootstrap interval. The reference's logits are computed once per (reference, target,
rows) and kept in the evaluation cache while they fit its size limit. numpy is imported inside
functions.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import Field

from engine.core.errors import EvaluationError
from engine.core.evaluator import EvalContext, Evaluator, EvaluatorConfig, MetricResult, Samples
from engine.core.refs import DatasetRef
from evaluators._tokens import ReferenceRows, keep_own_rows, log_softmax, logits, open_generative, require_decoder, token_rows

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact

logger = logging.getLogger(__name__)


def compare_logits(candidate: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position: top-1 agreement (1.0 / 0.0) and KL(reference || candidate)."""
    import numpy as np

    if candidate.shape != reference.shape:
        raise EvaluationError(f"the candidate's logits have shape {list(candidate.shape)}, the reference's {list(reference.shape)}")
    agree = (np.argmax(candidate, axis=-1) == np.argmax(reference, axis=-1)).astype(np.float64)
    log_ref, log_cand = log_softmax(reference), log_softmax(candidate)
    kl = (np.exp(log_ref) * (log_ref - log_cand)).sum(axis=-1)
    return agree, np.maximum(kl, 0.0)  # rounding can leave -1e-17 where the two agree


class LogitFidelity(Evaluator):
    name = "logit_fidelity"
    summary = (
        "Next-token logits of a decoder against the reference's on the same rows: top-1 agreement and KL divergence "
        "(mean and largest) per position, with intervals clustered by row."
    )
    version = "1"
    needs_reference = True
    stage_option = "limit"
    metrics = ("top1_agreement", "kl_mean", "kl_max", "positions")

    class Config(EvaluatorConfig):
        data: DatasetRef = Field(
            description="A dataset of token rows (input_ids + attention_mask), e.g. text_lines with the model's tokenizer."
        )
        limit: int | None = Field(default=None, ge=1, description="Compare on the first N rows only. Omit for every row.")

    config: Config

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        import numpy as np

        cfg = self.config
        rows = token_rows(ctx, cfg.data, cfg.limit, self.name)
        groups = [index for index, ids in enumerate(rows) for _ in ids]
        if not groups:
            raise EvaluationError(f"dataset '{cfg.data}' has no tokens to compare on")
        details: dict[str, Any] = {"reference": ctx.reference is None, "data": cfg.data, "rows": len(rows), "positions": len(groups)}
        if ctx.reference is None:
            # the reference against itself: identical distributions; its logits are kept for its candidates
            require_decoder(model, self.name)
            self._keep_logits(model, ctx, rows)
            values = {"top1_agreement": 1.0, "kl_mean": 0.0, "kl_max": 0.0, "positions": float(len(groups))}
            samples = {
                "top1_agreement": Samples("mean", [1.0] * len(groups), groups),
                "kl_mean": Samples("mean", [0.0] * len(groups), groups),
            }
            return MetricResult(values=values, details=details, samples=samples)

        agree: list[np.ndarray] = []
        kl: list[np.ndarray] = []
        session = open_generative(ctx, model, "candidate", self.name)
        try:
            with ReferenceRows(ctx, "logits", rows, lambda s, ids: logits(s, ids, "reference"), self.name) as reference:
                for index, ids in enumerate(rows):
                    if not ids:
                        continue
                    a, k = compare_logits(logits(session, ids, "candidate"), reference.row(index, ids))
                    agree.append(a)
                    kl.append(k)
                details["reference_logits"] = reference.status
        finally:
            session.close()
        agreement, divergence = np.concatenate(agree), np.concatenate(kl)
        worst = int(np.argmax(divergence))
        values = {
            "top1_agreement": float(agreement.mean()),
            "kl_mean": float(divergence.mean()),
            "kl_max": float(divergence[worst]),
            "positions": float(len(groups)),
        }
        details |= {
            "kl_unit": "nats",
            "worst_position": {"row": groups[worst], "kl": float(divergence[worst])},
            "target": ctx.target.id,
            "reference_target": ctx.reference_on.id,
        }
        samples = {"top1_agreement": Samples("mean", agreement.tolist(), groups), "kl_mean": Samples("mean", divergence.tolist(), groups)}
        logger.debug("logit fidelity of %s: top-1 %.4f, KL %.6f", model.digest[:12], values["top1_agreement"], values["kl_mean"])
        return MetricResult(values=values, details=details, samples=samples)

    def _keep_logits(self, model: ModelArtifact, ctx: EvalContext, rows: list[list[int]]) -> None:
        """The reference's logits on ``rows``, computed once here and cached for its candidates (which
        would otherwise each open the reference beside themselves on a miss); nothing when no cache."""
        if ctx.cache_dir is None:
            return
        session = open_generative(ctx, model, "model", self.name)
        try:
            for ids in rows:  # row by row: a large vocabulary's logits are not all held at once
                if ids:
                    keep_own_rows(ctx, model, "logits", [ids], [logits(session, ids, "model")])
        finally:
            session.close()
