"""The store: atomic records, corrupt entries are misses, published content is deduplicated,
objects and records are checked before they are served."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.core.hashing import sha256_json
from engine.store.store import Store, write_json_atomic


def keyed(kind: str, **fields):
    """A key and a record whose key document hashes to it, as the runner writes them."""
    doc = {"kind": kind, "n": fields.pop("n", 0)}
    return sha256_json(doc), {"kind": kind, "key_doc": doc, **fields}


def published(store: Store, content: bytes = b"weights", name: str = "model.onnx") -> tuple[str, str]:
    staging = store.staging("pass")
    (staging / name).write_bytes(content)
    digest = store.publish(staging, "onnx")
    key, record = keyed("pass", digest=digest, format="onnx", n=content.hex())
    store.record(key, record)
    return key, digest


def test_record_then_lookup_round_trips(tmp_path):
    store = Store(tmp_path).ensure()
    key, record = keyed("eval", values={"x": 1.0})
    store.record(key, record)
    assert store.lookup(key)["values"] == {"x": 1.0}


def test_corrupt_entry_is_a_miss_with_a_warning(tmp_path, caplog):
    store = Store(tmp_path).ensure()
    store.key_path("k" * 64).write_text('{"kind": "pass", "dig')
    assert store.lookup("k" * 64) is None
    assert "corrupt" in caplog.text


def test_entry_pointing_at_a_missing_object_is_a_miss(tmp_path, caplog):
    store = Store(tmp_path).ensure()
    key, record = keyed("pass", digest="d" * 64, format="onnx")
    store.record(key, record)
    assert store.lookup(key) is None
    assert "is missing" in caplog.text


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
        (staging / "owner.json").unlink()
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


# -- objects are checked before they are served (issue 9, item 1) ----------------------------------
def test_flipped_bytes_in_an_object_make_its_record_a_miss_and_the_object_goes(tmp_path, caplog):
    store = Store(tmp_path).ensure()
    key, digest = published(store)
    assert store.lookup(key)["digest"] == digest
    with open(store.object_path(digest) / "model.onnx", "r+b") as handle:
        handle.write(b"W")  # same size
    assert store.lookup(key) is None
    assert "changed since it was published" in caplog.text
    assert not store.object_path(digest).exists()


@pytest.mark.parametrize("damage", ["delete", "add", "truncate"])
def test_an_object_with_files_removed_added_or_resized_is_a_miss(tmp_path, damage):
    store = Store(tmp_path).ensure()
    key, digest = published(store)
    folder = store.object_path(digest)
    if damage == "delete":
        (folder / "model.onnx").unlink()
    elif damage == "add":
        (folder / "extra.bin").write_bytes(b"x")
    else:
        (folder / "model.onnx").write_bytes(b"w")
    assert store.lookup(key) is None


def test_a_touched_but_unchanged_object_is_still_served(tmp_path):
    store = Store(tmp_path).ensure()
    key, digest = published(store)
    os.utime(store.object_path(digest) / "model.onnx", ns=(1, 1))
    assert store.lookup(key)["digest"] == digest


def test_full_check_catches_what_the_cheap_check_cannot(tmp_path):
    store = Store(tmp_path).ensure()
    _key, digest = published(store)
    file = store.object_path(digest) / "model.onnx"
    stat = file.stat()
    # forge the manifest's stamps so the cheap check trusts a changed file: only hashing sees it
    file.write_bytes(b"WEIGHTS")
    meta = json.loads(store.manifest_path(digest).read_text())
    meta["stamps"]["model.onnx"] = [file.stat().st_ino, stat.st_size, file.stat().st_mtime_ns, file.stat().st_ctime_ns]
    write_json_atomic(store.manifest_path(digest), meta)
    assert store.check_object(digest) is None
    assert "no longer matches its digest" in store.check_object(digest, full=True)


def test_an_object_without_a_manifest_is_hashed_once_and_served(tmp_path):
    store = Store(tmp_path).ensure()
    key, digest = published(store)
    store.manifest_path(digest).unlink()
    assert store.lookup(key)["digest"] == digest
    assert store.manifest_path(digest).exists()


def test_publishing_over_a_damaged_object_replaces_it(tmp_path):
    store = Store(tmp_path).ensure()
    key, digest = published(store)
    (store.object_path(digest) / "model.onnx").write_bytes(b"garbage")
    assert published(store) == (key, digest)
    assert (store.object_path(digest) / "model.onnx").read_bytes() == b"weights"
    assert store.lookup(key)["digest"] == digest


def _verify(store: Store, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli.main", "verify", "--store", str(store.root), *extra], capture_output=True, text=True, timeout=60
    )


def test_engine_verify_reports_damage_and_repair_removes_it(tmp_path):
    store = Store(tmp_path).ensure()
    good_key, good = published(store, b"good")
    bad_key, bad = published(store, b"bad!")
    with open(store.object_path(bad) / "model.onnx", "r+b") as handle:
        handle.write(b"B")
    store.key_path("e" * 64).write_text(json.dumps({"key": "e" * 64, "kind": "eval"}))
    done = _verify(store)
    assert done.returncode == 1, done.stdout + done.stderr
    assert bad in done.stdout and "e" * 64 in done.stdout and good not in done.stdout
    repaired = _verify(store, "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert not store.object_path(bad).exists() and not store.key_path(bad_key).exists()
    assert not store.key_path("e" * 64).exists()
    assert store.lookup(good_key)["digest"] == good
    assert _verify(store).returncode == 0


# -- records are validated on read (item 2) ----------------------------------------------------------
@pytest.mark.parametrize(
    "damage",
    [
        {"format": None},
        {"format": "tflite"},
        {"digest": 42},
        {"attrs": "x"},
        {"notes": "a note"},
    ],
)
def test_a_pass_record_with_missing_or_mistyped_fields_is_a_miss(tmp_path, caplog, damage):
    store = Store(tmp_path).ensure()
    key, _digest = published(store)
    record = json.loads(store.key_path(key).read_text())
    record.update(damage)
    record = {k: v for k, v in record.items() if v is not None}
    store.key_path(key).write_text(json.dumps(record))
    assert store.lookup(key) is None
    assert "treating it as a miss" in caplog.text


@pytest.mark.parametrize("values", [None, "fast", {"p50_ms": "1.5"}, {"p50_ms": [1]}, {"p50_ms": True}])
def test_an_eval_record_with_bad_values_is_a_miss(tmp_path, values):
    store = Store(tmp_path).ensure()
    key, record = keyed("eval", values=values)
    if values is None:
        del record["values"]
    store.record(key, record)
    assert store.lookup(key) is None


def test_a_record_whose_key_document_does_not_hash_to_its_key_is_a_miss(tmp_path, caplog):
    store = Store(tmp_path).ensure()
    key, record = keyed("eval", values={"x": 1.0})
    record["key_doc"]["n"] = 1  # the figures of another job filed under this key
    store.record(key, record)
    assert store.lookup(key) is None
    assert "does not hash to its key" in caplog.text


# -- the digests/ memo (item 3) --------------------------------------------------------------------
def _model(tmp_path, content: bytes = b"one"):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "w.bin").write_bytes(content)
    return model


def test_a_memo_naming_another_digest_is_not_used(tmp_path, caplog):
    store = Store(tmp_path / "store").ensure()
    model = _model(tmp_path)
    right = store.cached_digest(model, "hf")
    (entry,) = (store.root / "digests").glob("*.json")
    memo = json.loads(entry.read_text())
    memo["digest"] = "0" * 64  # another model's results
    entry.write_text(json.dumps(memo))
    assert store.cached_digest(model, "hf") == right
    assert "is corrupt" in caplog.text


def test_a_memo_whose_manifest_was_swapped_is_not_used(tmp_path):
    store = Store(tmp_path / "store").ensure()
    model = _model(tmp_path)
    right = store.cached_digest(model, "hf")
    (entry,) = (store.root / "digests").glob("*.json")
    memo = json.loads(entry.read_text())
    memo["files"][0]["size"] = 999
    entry.write_text(json.dumps(memo))
    assert store.cached_digest(model, "hf") == right


def test_an_in_place_edit_keeping_size_and_mtime_is_noticed(tmp_path):
    store = Store(tmp_path / "store").ensure()
    model = _model(tmp_path)
    first = store.cached_digest(model, "hf")
    before = (model / "w.bin").stat()
    (model / "w.bin").write_bytes(b"two")  # same size
    os.utime(model / "w.bin", ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime
    assert store.cached_digest(model, "hf") != first


# -- staging folders of killed runs (item 4) --------------------------------------------------------
def test_staging_folders_of_dead_owners_are_removed_and_live_ones_kept(tmp_path):
    store = Store(tmp_path).ensure()
    mine = store.staging("pass")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    theirs = store.staging("pass")
    owner = json.loads((theirs / "owner.json").read_text())
    write_json_atomic(theirs / "owner.json", {**owner, "pid": dead.pid})
    (theirs / "model.onnx").write_bytes(b"x" * 1000)
    reused = store.staging("eval")  # a live pid, but started at another time: the pid was reused
    write_json_atomic(reused / "owner.json", {**owner, "started": owner["started"] - 1000})
    unowned = store.tmp / "pass-old"
    unowned.mkdir()
    os.utime(unowned, (1, 1))
    assert sorted(store.clean_stale_staging()) == sorted([theirs, reused, unowned])
    assert mine.is_dir()


def test_a_run_removes_the_staging_folders_of_killed_runs(tmp_path, tiny_onnx):
    from engine_helpers import tiny_workflow, write_workflow

    from engine.run import run_workflow
    from engine.workflow import load_workflow

    store = Store(tmp_path / "store").ensure()
    left = store.tmp / "pass-0123456789ab"
    left.mkdir()
    write_json_atomic(left / "owner.json", {"host": os.uname().nodename, "pid": 2**22 + 1, "started": 0.0})
    (left / "out").mkdir()
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"][0]["search"] = {"per_channel": [False]}
    workflow["evaluate"] = workflow["evaluate"][:1]
    workflow["select"]["objective"] = {"metric": "fidelity.cosine_mean", "goal": "max"}
    run_workflow(load_workflow(write_workflow(tmp_path, workflow)), store)
    assert not left.exists()
