"""The decoder evaluators on real sessions: tiny llama decoders exported by ONNX Runtime GenAI's
builder (fp32 reference, int4 candidate), run by Kiln's decode loop on the onnxruntime target and
by the onnxruntime-genai target."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.core.data import Dataset
from engine.core.evaluator import EvalContext
from evaluators.generation import GenerationEvaluator
from evaluators.logit_fidelity import LogitFidelity
from evaluators.perplexity import Perplexity
from targets.genai import GenaiConfig, GenaiTarget
from targets.onnxruntime.target import OnnxRuntimeConfig, OnnxRuntimeTarget

ROWS = [[5, 17, 33, 80, 12, 7, 41, 9, 60, 3], [44, 2, 19, 100, 250, 31]]


def dataset() -> Dataset:
    ids = np.zeros((len(ROWS), 10), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(ROWS):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    return Dataset(inputs={"input_ids": ids, "attention_mask": mask})


TARGETS = {
    "kiln-loop": lambda: OnnxRuntimeTarget(OnnxRuntimeConfig(id="cpu", runtime="onnxruntime", intra_op_threads=1)),
    "genai": lambda: GenaiTarget(GenaiConfig(id="genai", runtime="onnxruntime-genai", intra_op_threads=1)),
}


def context(tmp_path: Path, target_name: str, reference) -> EvalContext:  # type: ignore[no-untyped-def]
    return EvalContext(target=TARGETS[target_name](), workdir=tmp_path, reference=reference, datasets={"text": dataset})


@pytest.mark.parametrize("target_name", sorted(TARGETS))
def test_int4_against_fp32_on_real_sessions(tiny_genai, tmp_path: Path, target_name: str) -> None:
    ctx = context(tmp_path, target_name, tiny_genai.fp32)
    config = {"data": "text", "max_new_tokens": 6, "min_rounds": 2, "max_rounds": 2, "sessions": 1, "runs_per_round": 1, "warmup": 1}
    gen = GenerationEvaluator(GenerationEvaluator.Config(**config, quiet_wait_s=0)).evaluate(tiny_genai.int4, ctx)
    v, d = gen.values, gen.details
    assert v["new_tokens"] == 6 and d["decode_tokens"] == d["generations"] * 5
    assert v["decode_tokens_per_s"] * d["decode_s"] == pytest.approx(d["decode_tokens"], rel=1e-9)
    assert v["decode_speedup"] > 0 and 0.0 <= v["greedy_match"] <= 1.0

    ppl = Perplexity(Perplexity.Config(data="text")).evaluate(tiny_genai.int4, ctx).values
    assert ppl["perplexity"] == pytest.approx(np.exp(ppl["nll_mean"]))
    assert ppl["tokens"] == sum(len(r) - 1 for r in ROWS)
    assert ppl["nll_increase"] != 0.0  # int4 weights change the logits

    fid = LogitFidelity(LogitFidelity.Config(data="text")).evaluate(tiny_genai.int4, ctx).values
    assert 0.5 <= fid["top1_agreement"] <= 1.0 and 0 < fid["kl_mean"] <= fid["kl_max"]

    same = Perplexity(Perplexity.Config(data="text")).evaluate(tiny_genai.fp32, context(tmp_path, target_name, None)).values
    assert same["nll_increase"] == 0.0 and same["perplexity_ratio"] == 1.0


def test_both_runtimes_score_the_same_perplexity(tiny_genai, tmp_path: Path) -> None:
    figures = {
        name: Perplexity(Perplexity.Config(data="text")).evaluate(tiny_genai.fp32, context(tmp_path / name, name, None)).values["nll_mean"]
        for name in TARGETS
    }
    assert figures["kiln-loop"] == pytest.approx(figures["genai"], rel=1e-5)
