"""``engine validate`` refuses a decoder pass given a folder with tokenizer settings and no
vocabulary, from which transformers would make up an empty tokenizer (exit 2: the file, the key
path, what was expected and given, the fix); a folder without any tokenizer files is accepted
(its token ids are synthetic)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from engine_helpers import engine_cmd, tiny_workflow, write_workflow

from engine.core.errors import InputError
from engine.workflow import load_workflow


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 2 saved from a bare config (no tokenizer files)."""
    from decoders import bare_decoder

    return bare_decoder(tmp_path_factory.mktemp("bare") / "gemma2", "gemma2")


def _workflow(bare: Path, tmp_path: Path, files: dict[str, str], pass_name: str) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(bare, folder)
    for name, text in files.items():
        (folder / name).write_text(text)
    workflow = tiny_workflow(folder)
    workflow["input"] = {"format": "hf", "path": str(folder)}
    workflow["data"] = {"rows": {"source": "synthetic", "samples": 4, "sequence_length": 8}}
    workflow["steps"] = [{"id": "lm", "pass": pass_name}, {"id": "again", "pass": pass_name, "config": {}}]
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes", "goal": "min"}}
    return write_workflow(tmp_path, workflow)


@pytest.mark.parametrize("pass_name", ["decoder_export", "genai_build"])
def test_tokenizer_settings_without_a_vocabulary_are_refused(bare: Path, tmp_path: Path, pass_name: str) -> None:
    path = _workflow(bare, tmp_path, {"tokenizer_config.json": "{}"}, pass_name)
    with pytest.raises(InputError) as caught:
        load_workflow(path)
    [problem] = caught.value.problems  # once, however many steps take the input
    assert problem.where == "input.path" and problem.file == str(path)
    assert "tokenizer_config.json" in problem.message and "make up" in problem.message
    assert problem.given == "tokenizer_config.json" and "tokenizer.json" in problem.expected
    assert "remove tokenizer_config.json" in problem.hint


def test_no_tokenizer_files_or_a_whole_tokenizer_are_accepted(bare: Path, tmp_path: Path) -> None:
    load_workflow(_workflow(bare, tmp_path / "bare", {}, "genai_build"))
    load_workflow(_workflow(bare, tmp_path / "whole", {"tokenizer_config.json": "{}", "tokenizer.json": "{}"}, "decoder_export"))


def test_engine_validate_exits_2(bare: Path, tmp_path: Path) -> None:
    path = _workflow(bare, tmp_path, {"special_tokens_map.json": "{}"}, "genai_build")
    done = subprocess.run([*engine_cmd(), "validate", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "input.path" in done.stderr and "special_tokens_map.json" in done.stderr and "Traceback" not in done.stderr


def test_text_tokenized_with_the_input_s_tokenizer_needs_one(bare: Path, tmp_path: Path) -> None:
    path = _workflow(bare, tmp_path, {}, "genai_build")
    (tmp_path / "lines.txt").write_text("one line\nanother line\n")
    text = path.read_text().replace("    samples: 4\n    sequence_length: 8\n", "")
    path.write_text(text.replace("source: synthetic", f"source: text_lines\n    path: {tmp_path / 'lines.txt'}\n    tokenizer: input", 1))
    with pytest.raises(InputError) as caught:
        load_workflow(path)
    [problem] = [problem for problem in caught.value.problems if problem.where == "data.rows.tokenizer"]
    assert problem.given == "input"
    assert "has no tokenizer files" in problem.message and "tokenizer.json" in problem.message


def test_a_longrope_phi3_the_builder_cannot_build_is_refused(tmp_path: Path) -> None:
    from decoders import bare_decoder

    folder = bare_decoder(tmp_path / "phi3", "phi3_longrope")
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = config["rope_parameters"]["original_max_position_embeddings"] = 64
    config["original_max_position_embeddings"] = 64
    (folder / "config.json").write_text(json.dumps(config))
    workflow = tiny_workflow(folder)
    workflow["input"] = {"format": "hf", "path": str(folder)}
    workflow["steps"] = [{"id": "lm", "pass": "genai_build"}, {"id": "ts", "pass": "decoder_export"}]
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes", "goal": "min"}}
    path = write_workflow(tmp_path, workflow)
    done = subprocess.run([*engine_cmd(), "validate", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "steps[0].pass" in done.stderr and "longrope RoPE style is not currently supported" in done.stderr
    assert "steps[1]" not in done.stderr  # decoder_export takes it
