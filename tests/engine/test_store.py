"""The store: atomic records, corrupt entries are misses, published content is deduplicated."""

from __future__ import annotations

import json

from engine.store import Store, write_json_atomic


def test_record_then_lookup_round_trips(tmp_path):
    store = Store(tmp_path).ensure()
    store.record("k" * 64, {"kind": "eval", "values": {"x": 1.0}})
    assert store.lookup("k" * 64)["values"] == {"x": 1.0}


def test_corrupt_entry_is_a_miss_with_a_warning(tmp_path, caplog):
    store = Store(tmp_path).ensure()
    store.key_path("k" * 64).write_text('{"kind": "pass", "dig')
    assert store.lookup("k" * 64) is None
    assert "corrupt" in caplog.text


def test_entry_pointing_at_a_missing_object_is_a_miss(tmp_path, caplog):
    store = Store(tmp_path).ensure()
    store.record("k" * 64, {"kind": "pass", "digest": "d" * 64})
    assert store.lookup("k" * 64) is None
    assert "missing object" in caplog.text


def test_entry_under_the_wrong_name_is_a_miss(tmp_path):
    store = Store(tmp_path).ensure()
    store.record("a" * 64, {"kind": "eval"})
    store.key_path("a" * 64).rename(store.key_path("b" * 64))
    assert store.lookup("b" * 64) is None


def test_publishing_the_same_content_twice_keeps_one_object(tmp_path):
    store = Store(tmp_path).ensure()
    digests = []
    for _ in range(2):
        staging = store.staging("pass")
        (staging / "model.onnx").write_bytes(b"same")
        digests.append(store.publish(staging, "onnx"))
        assert not staging.exists()
    assert digests[0] == digests[1]
    assert [p.name for p in store.objects.iterdir()] == [digests[0]]
    assert (store.object_path(digests[0]) / "model.onnx").read_bytes() == b"same"


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    write_json_atomic(tmp_path / "x.json", {"a": 1})
    write_json_atomic(tmp_path / "x.json", {"a": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 2}


def test_cached_digest_rehashes_when_a_file_changes(tmp_path):
    store = Store(tmp_path / "store").ensure()
    model = tmp_path / "model"
    model.mkdir()
    (model / "w.bin").write_bytes(b"one")
    first = store.cached_digest(model, "hf")
    assert store.cached_digest(model, "hf") == first
    (model / "w.bin").write_bytes(b"two!")
    assert store.cached_digest(model, "hf") != first
