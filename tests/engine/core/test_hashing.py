"""Golden tests: they pin the hashing scheme. If one fails, the scheme changed and every cache key
with it: bump engine.core.hashing.SCHEME instead of editing the expected values."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from engine.core.artifact import ModelArtifact
from engine.core.hashing import SCHEME, canonical_json, digest_tree, manifest, sha256_json
from engine.plan.keys import pass_key


def test_canonical_json_sorts_keys_and_drops_whitespace():
    assert canonical_json({"b": [1, 2.5, None], "a": {"y": True, "x": "é"}}) == '{"a":{"x":"é","y":true},"b":[1,2.5,null]}'


def test_canonical_json_refuses_nan():
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_sha256_json_is_pinned():
    assert SCHEME == "kiln-1"
    assert sha256_json({"a": 1}) == "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "model.onnx").write_bytes(b"weights")
    (root / "sub" / "extra.txt").write_text("hello")
    return root


def test_digest_tree_is_pinned(tmp_path):
    # the scheme spelled out: sha256 of the canonical JSON of {files, kind, scheme}
    files = [
        {"path": "model.onnx", "size": 7, "sha256": hashlib.sha256(b"weights").hexdigest()},
        {"path": "sub/extra.txt", "size": 5, "sha256": hashlib.sha256(b"hello").hexdigest()},
    ]
    by_hand = hashlib.sha256(
        json.dumps({"files": files, "kind": "onnx", "scheme": "kiln-1"}, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    digest = digest_tree(_tree(tmp_path / "a"), "onnx")
    assert digest == by_hand == "dfc0efb277391c25084eec2fd63800e2681d7e6d3ef8221f79e1a32459106398"


def test_digest_ignores_timestamps_and_location(tmp_path):
    first = _tree(tmp_path / "a")
    second = _tree(tmp_path / "elsewhere" / "b")
    os.utime(second / "model.onnx", (1, 1))
    assert digest_tree(first, "onnx") == digest_tree(second, "onnx")


def test_digest_depends_on_format_names_and_bytes(tmp_path):
    base = digest_tree(_tree(tmp_path / "a"), "onnx")
    assert digest_tree(tmp_path / "a", "openvino") != base
    (tmp_path / "a" / "sub" / "extra.txt").write_text("hellO")
    assert digest_tree(tmp_path / "a", "onnx") != base


def test_manifest_lists_relative_paths_sizes_and_hashes(tmp_path):
    entries = manifest(_tree(tmp_path / "a"))
    assert [(e["path"], e["size"]) for e in entries] == [("model.onnx", 7), ("sub/extra.txt", 5)]
    assert all(len(e["sha256"]) == 64 for e in entries)


def test_artifact_digest_matches_digest_tree(tmp_path):
    folder = _tree(tmp_path / "a")
    assert ModelArtifact.from_folder("onnx", folder).digest == digest_tree(folder, "onnx")


class _FakePass:
    name = "fake"
    version = "3"
    libraries = ()
    target_dependent = False


def test_pass_key_covers_every_input_and_is_never_truncated():
    key, doc = pass_key(_FakePass, {"x": 1}, "d" * 64, {"calib": "k" * 64}, {"runtime": "r"})
    assert len(key) == 64
    assert doc["pass"] == "fake" and doc["version"] == "3" and doc["config"] == {"x": 1}
    assert doc["input"] == "d" * 64 and doc["data"] == {"calib": "k" * 64}
    assert doc["target"] is None  # the pass does not depend on the target
    changed = [
        pass_key(_FakePass, {"x": 2}, "d" * 64, {"calib": "k" * 64}, None)[0],
        pass_key(_FakePass, {"x": 1}, "e" * 64, {"calib": "k" * 64}, None)[0],
        pass_key(_FakePass, {"x": 1}, "d" * 64, {"calib": "j" * 64}, None)[0],
    ]
    assert len({key, *changed}) == 4


# -- input folders: special files and symlink loops are refused, located (issue 9, item 5) --------
def test_a_symlink_to_a_device_is_refused_before_any_byte_is_read(tmp_path):
    from engine.core.errors import InputError

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    os.symlink("/dev/zero", tmp_path / "model" / "weights.bin")
    with pytest.raises(InputError) as error:
        digest_tree(tmp_path / "model", "hf")
    text = str(error.value)
    assert "weights.bin" in text and "character device" in text


def test_a_fifo_is_refused(tmp_path):
    from engine.core.errors import InputError

    (tmp_path / "model").mkdir()
    os.mkfifo(tmp_path / "model" / "pipe")
    with pytest.raises(InputError, match="FIFO"):
        manifest(tmp_path / "model")


def test_a_symlink_loop_is_refused_with_its_path(tmp_path):
    from engine.core.errors import InputError

    (tmp_path / "model" / "sub").mkdir(parents=True)
    (tmp_path / "model" / "w.bin").write_bytes(b"w")
    os.symlink("..", tmp_path / "model" / "sub" / "up")
    with pytest.raises(InputError) as error:
        digest_tree(tmp_path / "model", "hf")
    assert "symlink loop" in str(error.value) and str(tmp_path / "model" / "sub" / "up") in str(error.value)


def test_a_self_referencing_symlink_is_refused(tmp_path):
    from engine.core.errors import InputError

    (tmp_path / "model").mkdir()
    os.symlink("self", tmp_path / "model" / "self")
    with pytest.raises(InputError, match="self"):
        digest_tree(tmp_path / "model", "hf")


def test_a_folder_linked_twice_without_a_loop_is_hashed(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "w.bin").write_bytes(b"w")
    (tmp_path / "model").mkdir()
    os.symlink(tmp_path / "shared", tmp_path / "model" / "a")
    os.symlink(tmp_path / "shared", tmp_path / "model" / "b")
    assert [e["path"] for e in manifest(tmp_path / "model")] == ["a/w.bin", "b/w.bin"]
