"""The reference decoder's tiny recipe (the same code path as the full one, a few hundred KB of
the standard library's docstrings, hidden 64, 2 layers): deterministic, cached by its recipe,
never trained on its held-out split, and better than a unigram model on it."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parents[2] / "workflows" / "models"
sys.path.insert(0, str(MODELS))

import reference_corpus  # noqa: E402
import reference_decoder  # noqa: E402


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference_decoder.build("tiny", tmp_path_factory.mktemp("reference-a"))


def test_the_tiny_recipe_builds_the_same_bytes_twice(built: Path, tmp_path: Path) -> None:
    again = reference_decoder.build("tiny", tmp_path)
    assert again != built
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert _digest(again / name) == _digest(built / name), name


def test_a_second_build_returns_the_cached_folder_without_training(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object) -> None:
        raise AssertionError("the second build trained")

    monkeypatch.setattr(reference_decoder, "_build", refuse)
    started = time.monotonic()
    assert reference_decoder.build("tiny", built.parents[1]) == built
    assert time.monotonic() - started < 10


def test_the_held_out_split_is_whole_files_never_trained_on(built: Path) -> None:
    corpus = reference_corpus.build_corpus(reference_decoder.RECIPES["tiny"].corpus, built.parents[1])
    records = [json.loads(line) for line in (corpus.folder / "manifest.jsonl").read_text().splitlines()]
    paths = [(r["package"], r["path"]) for r in records]
    assert len(paths) == len(set(paths)), "a source file was split between documents"
    held = {f"{r['package']}:{r['path']}" for r in records if r["split"] == "heldout"}
    assert held and set(corpus.heldout_ids) == held
    train_text = "\n".join(corpus.train)
    for text in corpus.heldout:
        for paragraph in text.splitlines():
            assert paragraph not in train_text
    recipe = json.loads((built / "recipe.json").read_text())
    assert recipe["corpus"]["digest"] == corpus.digest == _digest(corpus.folder / "manifest.jsonl")


def test_the_tiny_model_beats_a_unigram_model_on_held_out_text(built: Path) -> None:
    report = json.loads((built / "report.json").read_text())
    assert report["heldout_tokens"] > 200
    assert report["nll"] < report["unigram_nll"] - 0.5, report
    assert set(report["activations"]) >= {"lm_head", "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj"}
    assert all(entry["max_abs"] > 0 for entry in report["activations"].values())


def test_the_recipe_key_changes_with_the_corpus_digest_and_a_hyper_parameter() -> None:
    tiny = reference_decoder.RECIPES["tiny"]
    key = reference_decoder.recipe_key(tiny, "a" * 64)
    assert key != reference_decoder.recipe_key(tiny, "b" * 64)
    assert key != reference_decoder.recipe_key(reference_decoder.Recipe(**{**tiny.__dict__, "seed": 1}), "a" * 64)


def test_a_killed_build_leaves_no_half_model(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def killed(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(reference_decoder, "_train", killed)
    (tmp_path / "corpus").symlink_to(built.parents[1] / "corpus")  # the corpus is found, the model is not
    with pytest.raises(KeyboardInterrupt):
        reference_decoder.build("tiny", tmp_path)
    assert list((tmp_path / "models").iterdir()) == []
