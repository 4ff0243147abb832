"""Perplexity: how well a decoder predicts real text, and how much a candidate loses against the
reference on the same tokens.

Each row of the dataset (a text source tokenized with the model's tokenizer) is scored in one
forward pass (``GenerativeSession.logits``): position t predicts token t+1, whose negative
log-likelihood (NLL, natural log, computed in float64) is the token's figure; a row's first token
has none. ``perplexity`` is exp of the mean NLL over all tokens of all rows (``nll_mean``).

The comparison is paired token by token: ``nll_increase`` is the mean over tokens of (candidate's
NLL - reference's NLL), with its samples grouped by row, so the engine judges a bound such as
``{metric: perplexity.nll_increase, max: 0.05}`` on the upper end of a clustered bootstrap
interval; ``perplexity_ratio`` is exp(nll_increase), the candidate's perplexity over the
reference's. The reference's NLL per token is computed once per (reference, target, rows) and
kept in the evaluation cache. numpy is imported inside functions.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from pydantic import Field

from engine.core.errors import EvaluationError
from engine.core.evaluator import EvalContext, Evaluator, EvaluatorConfig, MetricResult, Samples
from engine.core.refs import DatasetRef
from evaluators._tokens import ReferenceRows, keep_own_rows, log_softmax, logits, open_generative, token_rows

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.target import GenerativeSession

logger = logging.getLogger(__name__)


def token_nll(scores: np.ndarray, ids: list[int]) -> np.ndarray:
    """The NLL of tokens 1..n-1 of ``ids`` given the logits ``scores`` [n, vocab] (row t predicts t+1)."""
    import numpy as np

    if len(ids) < 2:
        return np.zeros(0, dtype=np.float64)
    vocab = scores.shape[-1]
    targets = np.asarray(ids[1:], dtype=np.int64)
    if targets.max() >= vocab or targets.min() < 0:
        raise EvaluationError(
            f"a token id ({int(targets.max())}) lies outside the model's vocabulary of {vocab}: was the dataset tokenized with this model's tokenizer?"
        )
    logp = log_softmax(scores[:-1])
    return -logp[np.arange(len(targets)), targets]


def session_nll(session: GenerativeSession, ids: list[int], role: str) -> np.ndarray:
    return token_nll(logits(session, ids, role), ids)


class Perplexity(Evaluator):
    name = "perplexity"
    summary = (
        "Perplexity of a decoder on real text (exp of the mean next-token NLL), and the candidate's mean NLL increase over "
        "the reference on the same tokens, with an interval clustered by row."
    )
    version = "1"
    needs_reference = True
    stage_option = "limit"
    metrics = ("perplexity", "nll_mean", "nll_increase", "perplexity_ratio", "reference_perplexity", "tokens")

    class Config(EvaluatorConfig):
        data: DatasetRef = Field(
            description="A dataset of token rows (input_ids + attention_mask), e.g. text_lines with the model's tokenizer."
        )
        limit: int | None = Field(default=None, ge=1, description="Score the first N rows only. Omit for every row.")

    config: Config

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        import numpy as np

        cfg = self.config
        rows = token_rows(ctx, cfg.data, cfg.limit, self.name)
        per_row: list[np.ndarray] = []
        diffs: list[np.ndarray] = []
        status = "not needed"
        session = open_generative(ctx, model, "candidate" if ctx.reference is not None else "model", self.name)
        try:
            if ctx.reference is None:
                per_row = [session_nll(session, ids, "model") for ids in rows]
                keep_own_rows(ctx, model, "nll", rows, per_row)  # what the candidates compare with
            else:
                with ReferenceRows(ctx, "nll", rows, lambda s, ids: session_nll(s, ids, "reference"), self.name) as reference:
                    for index, ids in enumerate(rows):
                        mine = session_nll(session, ids, "candidate")
                        per_row.append(mine)
                        diffs.append(mine - reference.row(index, ids))
                    status = reference.status
        finally:
            session.close()
        groups = [index for index, nll in enumerate(per_row) for _ in range(len(nll))]
        if not groups:
            raise EvaluationError(f"dataset '{cfg.data}' has no row of 2 tokens or more: nothing to predict")
        nll = np.concatenate(per_row)
        nll_mean = float(nll.mean())
        if ctx.reference is None:
            diff = np.zeros_like(nll)  # the reference against itself: exactly no increase
        else:
            diff = np.concatenate(diffs)
        increase = float(diff.mean())
        values = {
            "perplexity": math.exp(nll_mean),
            "nll_mean": nll_mean,
            "nll_increase": increase,
            "perplexity_ratio": math.exp(increase),
            "reference_perplexity": math.exp(nll_mean - increase),
            "tokens": float(len(nll)),
        }
        details: dict[str, Any] = {
            "reference": ctx.reference is None,
            "data": cfg.data,
            "rows": len(rows),
            "rows_scored": sum(1 for n in per_row if len(n)),
            "tokens": len(nll),
            "nll_unit": "nats per token",
            "worst_row": int(np.argmax([n.mean() if len(n) else -np.inf for n in per_row])),
            "target": ctx.target.id,
            "reference_target": ctx.reference_on.id,
            "reference_nll": status,
        }
        samples = {
            "nll_mean": Samples("mean", nll.tolist(), groups),
            "nll_increase": Samples("mean", diff.tolist(), groups),
        }
        logger.debug("perplexity of %s: %.4f (NLL +%.5f over the reference)", model.digest[:12], values["perplexity"], increase)
        return MetricResult(values=values, details=details, samples=samples)
