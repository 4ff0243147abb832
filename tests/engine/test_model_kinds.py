"""``engine validate`` reads the input's config.json and refuses what its kind of model cannot do:
an encoder-decoder (T5, BART, Whisper) given an encoder's task, a causal-LM pass (decoder_export,
genai_build) given an encoder-decoder or an encoder. Each problem names config.json, the key path,
what was expected and given, and the pass or task that fits."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import engine_cmd, tiny_workflow, write_workflow
from kind_models import save_families

from engine.core.errors import InputError
from engine.core.model_kind import DECODER, ENCODER, ENCODER_DECODER, kind_of, read_config
from engine.workflow import load_workflow


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return save_families(tmp_path_factory.mktemp("kinds"))


def _workflow(tmp_path: Path, folder: Path, steps: list[dict[str, Any]], task: str | None = None) -> Path:
    workflow = tiny_workflow(folder)
    workflow["input"] = {"format": "hf", "path": str(folder), **({"task": task} if task else {})}
    workflow["data"] = {"rows": {"source": "synthetic", "samples": 4, "sequence_length": 8}}
    workflow["steps"] = steps
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes", "goal": "min"}}
    return write_workflow(tmp_path, workflow)


def _problems(path: Path) -> list[Any]:
    with pytest.raises(InputError) as caught:
        load_workflow(path)
    return caught.value.problems


def test_the_kind_is_read_from_config_json(folders) -> None:
    kinds = {name: kind_of(read_config(folder)) for name, folder in folders.items()}
    assert kinds == {"t5": ENCODER_DECODER, "bart": ENCODER_DECODER, "whisper": ENCODER_DECODER, "bert": ENCODER, "llama": DECODER}


@pytest.mark.parametrize("family", ["t5", "bart", "whisper"])
def test_an_encoder_decoder_given_feature_extraction_is_refused_with_its_task(tmp_path, folders, family) -> None:
    path = _workflow(tmp_path, folders[family], [{"id": "export", "pass": "torch_export"}], task="feature-extraction")
    [problem] = _problems(path)
    right = "automatic-speech-recognition" if family == "whisper" else "text2text-generation"
    assert problem.where == "input.task" and problem.file == str(path)
    assert str(folders[family] / "config.json") in problem.message and "encoder-decoder" in problem.message
    assert problem.given == "feature-extraction" and right in problem.expected
    assert f"input.task: {right}" in problem.hint and "seq2seq_export" in problem.hint


@pytest.mark.parametrize(("family", "right"), [("whisper", "seq2seq_export"), ("t5", "seq2seq_export"), ("bert", "torch_export")])
@pytest.mark.parametrize("pass_name", ["decoder_export", "genai_build"])
def test_a_causal_lm_pass_on_another_kind_is_refused_with_the_pass_that_fits(tmp_path, folders, family, right, pass_name) -> None:
    path = _workflow(tmp_path, folders[family], [{"id": "lm", "pass": pass_name}])
    [problem] = _problems(path)
    assert problem.where == "steps[0].pass" and problem.given == pass_name
    assert str(folders[family] / "config.json") in problem.message and "takes only decoder models" in problem.message
    assert f"use pass {right}" in problem.hint


def test_the_passes_that_fit_are_accepted(tmp_path, folders) -> None:
    load_workflow(_workflow(tmp_path / "llama", folders["llama"], [{"id": "lm", "pass": "decoder_export"}]))
    load_workflow(_workflow(tmp_path / "t5", folders["t5"], [{"id": "s2s", "pass": "seq2seq_export"}]))
    load_workflow(_workflow(tmp_path / "bert", folders["bert"], [{"id": "export", "pass": "torch_export"}], task="feature-extraction"))


def test_a_seq2seq_pass_on_a_decoder_is_refused(tmp_path, folders) -> None:
    [problem] = _problems(_workflow(tmp_path, folders["llama"], [{"id": "s2s", "pass": "seq2seq_export"}]))
    assert problem.where == "steps[0].pass" and "use pass decoder_export" in problem.hint


def test_engine_validate_exits_2_without_a_traceback(tmp_path, folders) -> None:
    path = _workflow(tmp_path, folders["whisper"], [{"id": "lm", "pass": "decoder_export"}])
    done = subprocess.run([*engine_cmd(), "validate", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "steps[0].pass" in done.stderr and "seq2seq_export" in done.stderr and "Traceback" not in done.stderr


def test_a_hub_model_is_read_from_the_cache(tmp_path, folders, offline_hub) -> None:
    from hub_cache import make_hub_cache

    make_hub_cache(offline_hub, "tiny/whisper", folders["whisper"], files=("config.json", "model.safetensors"))
    path = _workflow(tmp_path, folders["whisper"], [{"id": "lm", "pass": "decoder_export"}])
    text = path.read_text().replace(f"path: {folders['whisper']}", "model: tiny/whisper")
    path.write_text(text)
    [problem] = _problems(path)
    assert problem.where == "steps[0].pass" and "snapshots" in problem.message and "config.json" in problem.message
