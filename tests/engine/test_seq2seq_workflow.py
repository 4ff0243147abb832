"""A workflow over tiny encoder-decoder models, end to end through `engine run`: seq2seq_export (the
reference) and dynamic INT8 of both parts, measured by seq2seq_fidelity and seq2seq_generation,
one chosen per target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_helpers import write_workflow
from seq2seq_models import tiny_seq2seq

from engine.cli.main import main


def workflow(model: Path, task: str) -> dict:
    return {
        "version": 1,
        "name": "seq2seq",
        "input": {"format": "hf", "path": str(model), "task": task},
        "targets": [{"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1}],
        "steps": [
            {"id": "export", "pass": "seq2seq_export"},
            {"id": "int8", "pass": "ort_quantize", "after": "export", "config": {"mode": "dynamic", "per_channel": True}},
        ],
        "evaluate": [
            {"id": "fidelity", "evaluator": "seq2seq_fidelity", "config": {"samples": 2, "max_new_tokens": 6, "pytorch": True}},
            {
                "id": "generation",
                "evaluator": "seq2seq_generation",
                "config": {"samples": 2, "max_new_tokens": 6, "min_rounds": 4, "max_rounds": 4},
            },
        ],
        "select": {
            "objective": {"metric": "generation.decode_tokens_per_s", "goal": "max"},
            "constraints": [{"metric": "fidelity.top1_agreement", "min": 0.0}],
        },
        "search": {"sampler": "grid"},
    }


@pytest.mark.slow
@pytest.mark.parametrize(("family", "task"), [("t5", "text2text-generation"), ("whisper", "automatic-speech-recognition")])
def test_engine_run_exports_quantizes_and_chooses(tmp_path: Path, family: str, task: str) -> None:
    model = tiny_seq2seq(tmp_path / family, family)
    path = write_workflow(tmp_path, workflow(model, task))
    out = tmp_path / "out"
    assert main(["run", str(path), "--store", str(tmp_path / "store"), "-o", str(out), "-q"]) == 0
    records = json.loads((out / "candidates.json").read_text())["candidates"]
    assert len(records) == 2 and all(c["state"] == "complete" for c in records)
    reference, int8 = records
    assert reference["reference"] and reference["metrics"]["fidelity.pytorch_greedy_match"] == 1.0
    assert int8["metrics"]["fidelity.max_abs_diff"] > 0.0  # the INT8 parts, measured against the export
    assert int8["metrics"]["generation.ttft_ms"] > 0 and int8["metrics"]["generation.decode_tokens_per_s"] > 0
    assert len([c for c in records if c["chosen"]]) == 1
    assert (out / "cpu" / "model" / "seq2seq.json").is_file()
