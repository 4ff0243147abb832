"""A torch factory's (model, tokenizer) is saved once into the store's pass cache and shared by
the decoder passes; a cached folder whose files changed is built again, never served."""

from __future__ import annotations

import json
from pathlib import Path

from engine.core import ModelArtifact, PassContext
from passes.generate._common import hf_input

FACTORY = """
import torch
from pathlib import Path
from transformers import AutoModelForCausalLM

from decoders import config, tokenizer


def make(calls):
    with open(calls, "a") as f:
        f.write("x")
    tok = tokenizer()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config("llama", len(tok), hidden=32)).eval(), tok
"""


def test_the_factory_runs_once_and_a_changed_cache_is_rebuilt(tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.py").write_text(FACTORY)
    (tmp_path / "model" / "factory.json").write_text(json.dumps({"file": "model.py", "function": "make", "kwargs": {"calls": str(calls)}}))
    model = ModelArtifact.from_folder("torch", tmp_path / "model")
    store = tmp_path / "store" / "passcache"

    def context(step: str) -> PassContext:
        (tmp_path / step).mkdir()
        return PassContext(step_id=step, workdir=tmp_path / step, output_dir=tmp_path / f"{step}-out", cache_dir=store / step)

    first, notes = hf_input(model, context("genai_build"), "genai_build")
    assert first.parent == store / "hf-factory" and (first / "config.json").is_file() and "kept in" in notes[0]
    second, notes = hf_input(model, context("decoder_export"), "decoder_export")
    assert second == first and "from the store's factory cache" in notes[0]
    assert calls.read_text() == "x"  # the second pass did not run the factory

    (first / "config.json").write_text("{}")  # a damaged cache entry
    third, _ = hf_input(model, context("again"), "genai_build")
    assert calls.read_text() == "xx" and json.loads((third / "config.json").read_text())["model_type"] == "llama"
