"""Helpers of the evaluators that measure decoders (generation, perplexity, logit_fidelity): token
rows from a dataset, generative sessions opened and called with failures told as
``EvaluationError``, and the reference's per-row figures kept in the evaluation cache.

A row's tokens are its ``input_ids`` where ``attention_mask`` is 1 (a text source pads rows on the
right). numpy is imported inside functions: evaluator modules import this one at validate time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from engine.core.errors import EvaluationError
from engine.core.target import Generation, GenerativeSession
from evaluators._refcache import MAX_BYTES, ReferenceOutputs, feeds_digest
from evaluators._sessions import RUN_ERRORS, dataset, open_session

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact
    from engine.core.evaluator import EvalContext
    from engine.core.target import Target

#: the format of a decoder with a key/value cache, which generative sessions open
DECODER_FORMAT = "genai"


def token_rows(ctx: EvalContext, name: str, limit: int | None, evaluator: str) -> list[list[int]]:
    """The tokens of the first ``limit`` rows (all without it) of dataset ``name``: ``input_ids``
    where ``attention_mask`` is 1 (every position without a mask)."""
    import numpy as np

    data = dataset(ctx, name)
    if "input_ids" not in data.inputs:
        raise EvaluationError(
            f"the {evaluator} evaluator reads token ids from the dataset's input_ids; dataset '{name}' has none "
            f"(it has: {', '.join(sorted(data.inputs)) or 'nothing'}); use a text source such as text_lines with the model's tokenizer"
        )
    ids = np.asarray(data.inputs["input_ids"])
    if ids.ndim != 2 or ids.dtype.kind not in "iu":
        raise EvaluationError(f"input_ids of dataset '{name}' must be integer token ids [rows, length], not {ids.dtype} {list(ids.shape)}")
    mask = np.asarray(data.inputs["attention_mask"]) if "attention_mask" in data.inputs else np.ones_like(ids)
    if mask.shape != ids.shape:
        raise EvaluationError(f"attention_mask of dataset '{name}' has shape {list(mask.shape)}, input_ids {list(ids.shape)}")
    count = len(ids) if limit is None else min(limit, len(ids))
    return _masked(ids[:count], mask[:count])


def _masked(ids: np.ndarray, mask: np.ndarray) -> list[list[int]]:
    """Each row's tokens: ``ids`` where ``mask`` is 1."""
    return [[int(token) for token in row[keep == 1]] for row, keep in zip(ids, mask, strict=True)]


def prompt_rows(feeds: dict[str, np.ndarray]) -> list[list[int]]:
    """The token rows of a feed batch: ``input_ids`` where ``attention_mask`` is 1."""
    import numpy as np

    if "input_ids" not in feeds:
        raise EvaluationError(f"a decoder's feeds need input_ids (they have: {', '.join(sorted(feeds)) or 'nothing'})")
    ids = np.asarray(feeds["input_ids"])
    mask = np.asarray(feeds["attention_mask"]) if "attention_mask" in feeds else np.ones_like(ids)
    rows = _masked(ids, mask)
    if not all(rows):
        raise EvaluationError("a prompt of the batch has no tokens (its attention_mask is all 0)")
    return rows


def require_decoder(model: ModelArtifact, evaluator: str, role: str = "model") -> None:
    if model.format != DECODER_FORMAT:
        raise EvaluationError(
            f"the {evaluator} evaluator needs a decoder model ({DECODER_FORMAT} format); got {model.format}"
            + ("" if role == "model" else f" for the {role}")
        )


def open_generative(ctx: EvalContext, model: ModelArtifact, role: str, evaluator: str, target: Target | None = None) -> GenerativeSession:
    """The model's session on ``target`` (default ``ctx.target``), which must be able to generate."""
    require_decoder(model, evaluator, role)
    target = target if target is not None else ctx.target
    session = open_session(ctx, model, role, target=target)
    if not isinstance(session, GenerativeSession):
        session.close()
        raise EvaluationError(
            f"target '{target.id}' ({target.runtime}) opened the {role} as a plain session, which cannot generate; "
            f"the {evaluator} evaluator needs a target that runs decoders with a key/value cache"
        )
    return session


def generate(session: GenerativeSession, prompt: Sequence[int], max_new_tokens: int, role: str) -> Generation:
    """``session.generate`` with a failure, or a generation of the wrong length, as an EvaluationError."""
    try:
        out = session.generate(prompt, max_new_tokens)
    except EvaluationError:
        raise
    except RUN_ERRORS as error:
        raise EvaluationError(f"generating with the {role} failed on a prompt of {len(prompt)} tokens: {error}") from error
    if len(out.tokens) != max_new_tokens or len(out.decode_s) != max_new_tokens - 1:
        raise EvaluationError(
            f"the {role}'s session returned {len(out.tokens)} tokens and {len(out.decode_s)} decode times for "
            f"max_new_tokens={max_new_tokens} (expected {max_new_tokens} and {max_new_tokens - 1})"
        )
    if not out.prefill_s > 0 or not all(step > 0 for step in out.decode_s):
        raise EvaluationError(f"the {role}'s session reported a generation step that took no time: its timings cannot be used")
    return out


def logits(session: GenerativeSession, ids: Sequence[int], role: str) -> np.ndarray:
    """``session.logits(ids)`` checked: ``[len(ids), vocab]``, finite."""
    import numpy as np

    try:
        out = np.asarray(session.logits(ids))
    except EvaluationError:
        raise
    except RUN_ERRORS as error:
        raise EvaluationError(f"the {role}'s logits failed on a row of {len(ids)} tokens: {error}") from error
    if out.ndim != 2 or out.shape[0] != len(ids):
        raise EvaluationError(f"the {role}'s session gave logits of shape {list(out.shape)} for {len(ids)} tokens, not [{len(ids)}, vocab]")
    if not np.isfinite(out).all():
        raise EvaluationError(f"the {role}'s logits hold NaN or infinite values on a row of {len(ids)} tokens")
    return out


def log_softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise log-probabilities, in float64."""
    import numpy as np

    x = np.asarray(scores, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def rows_digest(rows: list[list[int]]) -> str:
    import numpy as np

    return feeds_digest({"ids": np.asarray(row, dtype=np.int64)} for row in rows)


def row_entries(ctx: EvalContext, reference: ModelArtifact, target: Target, kind: str, rows: list[list[int]]) -> list[ReferenceOutputs]:
    """The cache entries of ``reference``'s figure ``kind`` on ``target``, one per row."""
    common = {"kind": kind, "reference": reference.digest, "target": target.fingerprint()}
    return [ReferenceOutputs(ctx.cache_dir, {**common, "row": rows_digest([row])}) for row in rows]


def keep_own_rows(ctx: EvalContext, model: ModelArtifact, kind: str, rows: list[list[int]], outputs: list[np.ndarray]) -> None:
    """The reference's own figures, computed while it is measured as a candidate, kept where its
    candidates' ``ReferenceRows`` look for them: no candidate then opens the reference to score
    these rows again (nor holds it in memory beside itself)."""
    if ctx.cache_dir is None:
        return
    for entry, out in zip(row_entries(ctx, model, ctx.target, kind, rows), outputs, strict=True):
        if out.nbytes <= MAX_BYTES:
            entry.save([kind], [{kind: out}])


class ReferenceRows:
    """The reference's figure per row (``kind``: its logits, its per-token NLL), each row its own
    entry of the evaluation cache (keyed by the reference, its target and the row's tokens), so an
    evaluation on the first rows and one on every row share what they have in common, and a large
    figure (a 32000-token vocabulary's logits) is cached row by row instead of not at all. A row
    missing from the cache is computed by a reference session opened on the first miss, and
    cached at once (unless it exceeds the cache's size limit)."""

    def __init__(
        self,
        ctx: EvalContext,
        kind: str,
        rows: list[list[int]],
        compute: Callable[[GenerativeSession, list[int]], np.ndarray],
        evaluator: str,
    ) -> None:
        assert ctx.reference is not None
        self.ctx, self.kind, self.compute, self.evaluator = ctx, kind, compute, evaluator
        self.entries = row_entries(ctx, ctx.reference, ctx.reference_on, kind, rows)
        self.session: GenerativeSession | None = None
        self.hits = self.misses = 0

    def __enter__(self) -> ReferenceRows:
        return self

    def row(self, index: int, ids: list[int]) -> np.ndarray:
        entry = self.entries[index]
        loaded = entry.load()
        if loaded is not None and loaded[0] == [self.kind] and len(loaded[1]) == 1:
            self.hits += 1
            return loaded[1][0][self.kind]
        self.misses += 1
        if self.session is None:
            assert self.ctx.reference is not None
            self.session = open_generative(self.ctx, self.ctx.reference, "reference", self.evaluator, target=self.ctx.reference_on)
        out = self.compute(self.session, ids)
        if out.nbytes <= MAX_BYTES:
            entry.save([self.kind], [{self.kind: out}])
        return out

    @property
    def status(self) -> str:
        """``hit`` (every row from the cache), ``miss`` (none), ``partial (H of N rows cached)``, or ``disabled``."""
        if self.ctx.cache_dir is None:
            return "disabled"
        if not self.misses:
            return "hit"
        return "miss" if not self.hits else f"partial ({self.hits} of {self.hits + self.misses} rows cached)"

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if self.session is not None:
            self.session.close()
