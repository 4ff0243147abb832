"""seq2seq_export, and ort_quantize over the folder it writes, run twice on the same tiny model (the
second time from another folder, on one thread) write the same bytes, as every built-in pass must
(see test_pass_determinism.py, whose helpers these runs use)."""

from __future__ import annotations

from pathlib import Path

import pytest
from seq2seq_models import tiny_seq2seq
from test_pass_determinism import run, twice

from engine.core import ModelArtifact


@pytest.mark.slow
@pytest.mark.parametrize("family", ["whisper", "bart"])
def test_seq2seq_export_and_its_int8_parts(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, family: str) -> None:
    from passes.generate.seq2seq_export import Seq2SeqExport
    from passes.quantize.ort_quantize import OrtQuantize

    model = ModelArtifact.from_folder("hf", tiny_seq2seq(tmp_path_factory.mktemp(family), family))
    exported = twice(tmp_path / "export", f"seq2seq_export ({family})", lambda root: run(Seq2SeqExport, model, root)).model
    twice(tmp_path / "int8", f"ort_quantize ({family} parts)", lambda root: run(OrtQuantize, exported, root, {"mode": "dynamic"}))
