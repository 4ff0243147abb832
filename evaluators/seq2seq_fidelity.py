"""Fidelity of an encoder-decoder model (``seq2seq`` format) to the reference, and to PyTorch.

Per source (a dataset's rows, else synthetic token ids or audio features; see
``evaluators._seq2seq``): the first decoder step's logits after the start token of both models
(``top1_agreement``, ``kl_mean`` KL(reference || candidate) in nats, ``max_abs_diff``) and the
greedy continuation of ``max_new_tokens`` tokens of both (``greedy_match``: the fraction of
sources on which they are equal token for token; ``token_match``: the mean fraction of the
continuation the two share before they first differ).

``pytorch: true`` also compares the model's continuation with PyTorch's
``generate(do_sample=False)`` on the Hugging Face folder it was exported from
(``pytorch_greedy_match``, up to PyTorch's length, which an end token may cut short); the
reference itself is compared too. numpy is imported inside functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from engine.core.errors import EvaluationError
from engine.core.evaluator import EvalContext, Evaluator, EvaluatorConfig, MetricResult, Samples
from engine.core.refs import DatasetRef
from evaluators._seq2seq import first_logits, generate, manifest, open_seq2seq, sources, torch_tokens
from evaluators._tokens import log_softmax

if TYPE_CHECKING:
    from engine.core.artifact import ModelArtifact


def common_prefix(a: list[int], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


class Seq2SeqFidelity(Evaluator):
    name = "seq2seq_fidelity"
    summary = (
        "An encoder-decoder model against the reference on the same sources: the first step's logits (top-1, KL, largest "
        "difference) and greedy continuations (exact match, shared prefix); optionally against PyTorch's generate."
    )
    version = "1"
    needs_reference = True
    metrics = ("top1_agreement", "kl_mean", "max_abs_diff", "greedy_match", "token_match", "pytorch_greedy_match", "sources")

    class Config(EvaluatorConfig):
        data: DatasetRef | None = Field(
            default=None,
            description="A dataset of sources: input_ids (+ attention_mask) for a text model, input_features for an audio model. "
            "Omit for synthetic ones (seeded random token ids or log-mel features).",
        )
        samples: int = Field(default=4, ge=1, le=10_000, description="Sources compared (the first N rows of `data`).")
        max_new_tokens: int = Field(default=16, ge=1, le=4096, description="Greedy tokens generated per source.")
        pytorch: bool = Field(
            default=False,
            description="Also compare with PyTorch's generate(do_sample=False) on the Hugging Face folder the model was exported from.",
        )

    config: Config

    def evaluate(self, model: ModelArtifact, ctx: EvalContext) -> MetricResult:
        cfg = self.config
        found = sources(ctx, model, cfg.data, cfg.samples, self.name)
        candidate = open_seq2seq(ctx, model, "candidate" if ctx.reference is not None else "model", self.name)
        try:
            outputs = [generate(candidate, source, cfg.max_new_tokens, "candidate").tokens for source in found]
            values, samples = self._against_reference(ctx, candidate, found, outputs)
        finally:
            candidate.close()
        details: dict[str, Any] = {"reference": ctx.reference is None, "data": cfg.data or "synthetic", "sources": len(found)}
        values["sources"] = float(len(found))
        if cfg.pytorch:
            values["pytorch_greedy_match"], details["pytorch"] = self._against_pytorch(model, found, outputs)
        return MetricResult(values=values, details=details, samples=samples)

    def _against_reference(
        self, ctx: EvalContext, candidate: Any, found: list[Any], outputs: list[list[int]]
    ) -> tuple[dict[str, float], dict[str, Samples]]:
        import numpy as np

        count = len(found)
        if ctx.reference is None:  # the reference against itself: nothing else needs to run
            ones, zeros = [1.0] * count, [0.0] * count
            values = {"top1_agreement": 1.0, "kl_mean": 0.0, "max_abs_diff": 0.0, "greedy_match": 1.0, "token_match": 1.0}
            return values, {"greedy_match": Samples("mean", ones), "kl_mean": Samples("mean", zeros)}
        reference = open_seq2seq(ctx, ctx.reference, "reference", self.name, target=ctx.reference_on)
        agree, kl, diffs, match, shared = [], [], [], [], []
        try:
            for source, tokens in zip(found, outputs, strict=True):
                got, want = first_logits(candidate, source, "candidate"), first_logits(reference, source, "reference")
                if got.shape != want.shape:
                    raise EvaluationError(
                        f"the candidate's first-step logits have shape {list(got.shape)}, the reference's {list(want.shape)}"
                    )
                log_ref, log_cand = log_softmax(want), log_softmax(got)
                kl.append(float(np.maximum((np.exp(log_ref) * (log_ref - log_cand)).sum(axis=-1), 0.0).mean()))
                agree.append(float((got.argmax(-1) == want.argmax(-1)).mean()))
                diffs.append(float(np.abs(got.astype(np.float64) - want).max()))
                expected = generate(reference, source, self.config.max_new_tokens, "reference").tokens
                match.append(1.0 if tokens == expected else 0.0)
                shared.append(common_prefix(tokens, expected) / len(expected))
        finally:
            reference.close()
        values = {
            "top1_agreement": float(np.mean(agree)),
            "kl_mean": float(np.mean(kl)),
            "max_abs_diff": float(np.max(diffs)),
            "greedy_match": float(np.mean(match)),
            "token_match": float(np.mean(shared)),
        }
        samples = {"greedy_match": Samples("mean", match), "kl_mean": Samples("mean", kl), "top1_agreement": Samples("mean", agree)}
        return values, samples

    def _against_pytorch(self, model: ModelArtifact, found: list[Any], outputs: list[list[int]]) -> tuple[float, dict[str, Any]]:
        source = model.attrs.get("hf_source")
        if not source:
            raise EvaluationError(
                f"pytorch: true needs the Hugging Face folder {model.path} was exported from (attrs['hf_source'], written by seq2seq_export)"
            )
        expected = torch_tokens(Path(source), manifest(model, self.name), found, self.config.max_new_tokens)
        same = [tokens[: len(want)] == want for tokens, want in zip(outputs, expected, strict=True)]
        return sum(same) / len(same), {"folder": str(source), "matched": sum(same), "tokens": [len(want) for want in expected]}
