"""Hugging Face Hub models as inputs (``input.model: ORG/NAME``), from a Hub cache laid out by hand
in tmp_path (tests/hub_cache.py): no test reaches the network. Offline, the cache alone is used;
online, the Hub's answers are stood in for."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from engine_helpers import engine_cmd, tiny_workflow, write_workflow
from hub_cache import MODEL_FILES, make_hub_cache, minilm_folder

from engine.cli import main as cli
from engine.core.errors import InputError
from engine.core.hashing import digest_tree
from engine.execute.datasets import input_artifact
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import hub, load_workflow
from engine.workflow.code import code_of
from engine.workflow.resolve import fetch_input

REPO = "sentence-transformers/all-MiniLM-L6-v2"
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40
TOKEN = "hf_" + "Zx7Qw" * 6 + "Kp9L"  # a made-up token of the real format


def minilm_workflow(**input_: object) -> dict:
    """MiniLM exported to ONNX and measured by its size: the smallest real workflow on a Hub model."""
    return {
        "version": 1,
        "name": "hub",
        "input": {"format": "hf", "model": REPO, "task": "feature-extraction", **input_},
        "targets": [{"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1}],
        "steps": [{"id": "export", "pass": "torch_export", "config": {"exporter": "torchscript", "attn_implementation": "eager"}}],
        "evaluate": [{"id": "size", "evaluator": "size"}],
        "select": {"objective": {"metric": "size.file_bytes", "goal": "min"}},
    }


@pytest.fixture
def minilm_cache(offline_hub: Path) -> Path:
    """The Hub cache holding all-MiniLM-L6-v2 at COMMIT_A as main (the files Kiln downloads)."""
    make_hub_cache(offline_hub, REPO, minilm_folder(), commit=COMMIT_A, files=MODEL_FILES)
    return offline_hub


def cli_run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*engine_cmd(), *args], capture_output=True, text=True, timeout=timeout)


def refused(path: Path) -> str:
    """What `engine validate` says of a workflow it refuses (exit 2, no traceback)."""
    done = cli_run("validate", str(path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


# --- found in the cache ---------------------------------------------------------------------


def test_a_cached_hub_model_validates_offline_and_resolves_to_its_snapshot(tmp_path, minilm_cache):
    path = write_workflow(tmp_path, minilm_workflow())
    done = cli_run("validate", str(path))
    assert done.returncode == 0, done.stderr
    resolved = load_workflow(path)
    snapshot = minilm_cache / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / COMMIT_A
    assert resolved.input.path == snapshot
    assert resolved.input.attrs == {"model": REPO, "revision": "main", "commit": COMMIT_A, "task": "feature-extraction"}
    assert resolved.input.hub is not None and resolved.input.hub.present
    assert code_of(resolved) == []  # without trust_remote_code no code of the model runs


def test_hf_home_names_the_cache_when_hf_hub_cache_is_not_set(tmp_path, minilm_cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(minilm_cache.parent))  # <HF_HOME>/hub
    assert load_workflow(write_workflow(tmp_path, minilm_workflow())).input.attrs["commit"] == COMMIT_A


def test_plan_names_the_model_and_its_commit_and_downloads_nothing(tmp_path, minilm_cache):
    path = write_workflow(tmp_path, minilm_workflow())
    done = cli_run("plan", str(path), "--store", str(tmp_path / "store"))
    assert done.returncode == 0, done.stderr
    assert f"input hf {REPO}@{COMMIT_A[:12]}" in done.stdout
    assert "MISS export" in done.stdout


@pytest.mark.parametrize("revision", ["v2.0", "dev", COMMIT_B])
def test_a_tag_a_branch_or_a_commit_resolves_to_its_commit(tmp_path, offline_hub, revision):
    make_hub_cache(offline_hub, REPO, minilm_folder(), commit=COMMIT_A, files=MODEL_FILES)
    make_hub_cache(offline_hub, REPO, minilm_folder(), commit=COMMIT_B, revisions=["v2.0", "dev"], files=MODEL_FILES)
    resolved = load_workflow(write_workflow(tmp_path, minilm_workflow(revision=revision)))
    assert resolved.input.attrs["commit"] == COMMIT_B and resolved.input.attrs["revision"] == revision
    assert resolved.input.path.name == COMMIT_B


# --- keys -----------------------------------------------------------------------------------


def hub_digest(folder: Path, store: Path, **input_: object) -> str:
    return input_artifact(load_workflow(write_workflow(folder, minilm_workflow(**input_))), Store(store)).digest


def test_the_commit_enters_the_input_digest_and_the_same_commit_gives_the_same(tmp_path, offline_hub):
    make_hub_cache(offline_hub, REPO, minilm_folder(), commit=COMMIT_A, files=MODEL_FILES)
    make_hub_cache(offline_hub, REPO, minilm_folder(), commit=COMMIT_B, revisions=["v2"], files=MODEL_FILES)  # the same files
    main = hub_digest(tmp_path / "w1", tmp_path / "s1")
    assert hub_digest(tmp_path / "w2", tmp_path / "s2", revision="v2") != main
    assert hub_digest(tmp_path / "w3", tmp_path / "s3", revision=COMMIT_A) == main  # another store, hashed again
    assert hub_digest(tmp_path / "w4", tmp_path / "s1") == main  # the memo serves the same


def test_a_folder_given_by_path_keeps_the_digest_of_its_files(tmp_path, offline_hub):
    snapshot = make_hub_cache(offline_hub, REPO, minilm_folder(), commit=COMMIT_A, files=MODEL_FILES)
    workflow = minilm_workflow()
    workflow["input"] = {"format": "hf", "path": str(snapshot), "task": "feature-extraction"}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    assert resolved.input.digest_extra == {} and resolved.input.files is None and resolved.input.hub is None
    assert input_artifact(resolved, Store(tmp_path / "store")).digest == digest_tree(snapshot, "hf")
    assert hub_digest(tmp_path, tmp_path / "store") != digest_tree(snapshot, "hf")


def test_files_kiln_does_not_use_stay_out_of_the_digest(tmp_path, offline_hub):
    snapshot = make_hub_cache(offline_hub, REPO, minilm_folder(), commit=COMMIT_A, files=MODEL_FILES)
    before = hub_digest(tmp_path / "w1", tmp_path / "s1")
    (snapshot / "onnx").mkdir()
    (snapshot / "onnx" / "model.onnx").write_bytes(b"an export someone else made")
    (snapshot / "tf_model.h5").write_bytes(b"TensorFlow weights")
    (snapshot / "README.md").write_text("a model card")
    resolved = load_workflow(write_workflow(tmp_path / "w2", minilm_workflow()))
    assert "tf_model.h5" not in resolved.input.files and "onnx/model.onnx" not in resolved.input.files
    assert hub_digest(tmp_path / "w2", tmp_path / "s2") == before


def test_trust_remote_code_lists_the_code_and_enters_the_key(tmp_path, offline_hub):
    snapshot = make_hub_cache(offline_hub, REPO, minilm_folder(), commit=COMMIT_A, files=MODEL_FILES)
    (snapshot / "modeling_custom.py").write_text("raise SystemExit('never imported by validate')\n")
    plain = load_workflow(write_workflow(tmp_path / "w1", minilm_workflow()))
    assert "trust_remote_code" not in plain.input.attrs and "modeling_custom.py" not in plain.input.files
    path = write_workflow(tmp_path / "w2", minilm_workflow(trust_remote_code=True))
    trusted = load_workflow(path)
    assert trusted.input.attrs["trust_remote_code"] is True and "modeling_custom.py" in trusted.input.files
    assert trusted.input.digest_extra == {"commit": COMMIT_A, "trust_remote_code": True}
    done = cli_run("validate", str(path))
    assert done.returncode == 0, done.stderr
    assert "runs code from 1 file" in done.stdout
    assert f"input.trust_remote_code: {snapshot / 'modeling_custom.py'} (remote code of the Hub model)" in done.stdout


def test_trust_remote_code_on_a_local_folder_lists_its_python_files(tmp_path, offline_hub):
    folder = tmp_path / "model"
    shutil.copytree(minilm_folder(), folder)
    (folder / "modeling_custom.py").write_text("")
    workflow = minilm_workflow()
    workflow["input"] = {"format": "hf", "path": "model", "task": "feature-extraction", "trust_remote_code": True}
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    assert [use.render() for use in code_of(resolved)] == [
        f"input.trust_remote_code: {folder / 'modeling_custom.py'} (remote code of the model folder)"
    ]
    assert resolved.input.digest_extra == {"trust_remote_code": True}


def test_trust_remote_code_needs_format_hf(tmp_path, offline_hub):
    workflow = minilm_workflow(trust_remote_code=True)
    workflow["input"]["format"] = "onnx"
    assert "trust_remote_code goes with format: hf" in refused(write_workflow(tmp_path, workflow))


# --- refused, with the key, the value and the fix --------------------------------------------


def test_an_unknown_model_offline_is_refused_naming_how_to_get_it(tmp_path, offline_hub):
    stderr = refused(write_workflow(tmp_path, minilm_workflow()))
    assert f"input.model: {REPO} is not in the Hugging Face cache ({offline_hub}) and HF_HUB_OFFLINE is set" in stderr
    assert f"given:    {REPO}" in stderr
    assert f"`hf download {REPO}`" in stderr and "HF_HUB_CACHE" in stderr and "use `path:` for a local folder" in stderr


def test_an_unreachable_hub_is_offline(tmp_path, offline_hub, monkeypatch):
    import httpx2
    from huggingface_hub import HfApi

    def unreachable(*args: object, **kwargs: object) -> None:
        raise httpx2.ConnectError("[Errno -2] Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(HfApi, "model_info", unreachable)
    path = write_workflow(tmp_path, minilm_workflow())
    with pytest.raises(InputError, match="the Hub cannot be reached") as error:
        load_workflow(path)
    assert [p.where for p in error.value.problems] == ["input.model"]
    make_hub_cache(offline_hub, REPO, minilm_folder(), commit=COMMIT_A, files=MODEL_FILES)
    resolved = load_workflow(path)
    assert resolved.input.attrs["commit"] == COMMIT_A
    assert "the Hub cannot be reached" in resolved.input.notes[0]


def test_a_revision_the_cache_lacks_is_refused_listing_those_it_holds(tmp_path, minilm_cache):
    stderr = refused(write_workflow(tmp_path, minilm_workflow(revision="v9")))
    assert "input.revision: the Hugging Face cache" in stderr and f"holds no revision v9 of {REPO}" in stderr
    assert "given:    v9" in stderr
    assert f"expected: a revision the cache holds: main ({COMMIT_A[:12]})" in stderr
    assert f"`hf download {REPO} --revision v9`" in stderr


def test_a_model_that_is_also_a_local_folder_is_refused(tmp_path, offline_hub):
    shutil.copytree(minilm_folder(), tmp_path / "models" / "minilm")
    workflow = minilm_workflow()
    workflow["input"]["model"] = "models/minilm"
    stderr = refused(write_workflow(tmp_path, workflow))
    assert "input.model: 'models/minilm' is both a folder next to the workflow" in stderr
    assert "given:    models/minilm" in stderr
    assert "fix:      use `path:` for a local folder; `model:` names a Hub repo" in stderr


def test_a_repo_id_huggingface_hub_refuses_is_refused(tmp_path, offline_hub):
    workflow = minilm_workflow()
    workflow["input"]["model"] = "org/models/minilm"
    stderr = refused(write_workflow(tmp_path, workflow))
    assert "input.model: not a Hugging Face Hub repo id" in stderr and "given:    org/models/minilm" in stderr


@pytest.mark.parametrize("key", ["token", "hf_token", "use_auth_token"])
def test_a_token_in_the_workflow_is_refused_and_never_shown(tmp_path, minilm_cache, key):
    stderr = refused(write_workflow(tmp_path, minilm_workflow(**{key: TOKEN})))
    assert f"input.{key}: a token does not belong in the workflow file" in stderr
    assert f"given:    hf_…{TOKEN[-4:]} ({len(TOKEN)} characters)" in stderr
    assert "set HF_TOKEN in the environment" in stderr
    assert TOKEN not in stderr and "unknown key" not in stderr


def test_a_value_that_is_a_token_is_refused_and_never_shown(tmp_path, minilm_cache):
    workflow = minilm_workflow(revision=TOKEN)
    workflow["input"]["kwargs"] = {"auth": TOKEN}
    stderr = refused(write_workflow(tmp_path, workflow))
    assert "input.revision: this value is a Hugging Face token" in stderr and "input.kwargs.auth:" in stderr
    assert TOKEN not in stderr


def test_a_revision_without_a_model_is_refused(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["input"]["revision"] = "main"
    assert "revision goes with model:" in refused(write_workflow(tmp_path, workflow))


# --- online: the Hub's answers stood in for ---------------------------------------------------


@pytest.fixture
def online_hub(offline_hub: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The Hub answers that main is COMMIT_B holding MiniLM's files, and a download lays them out
    in the cache; what was asked is recorded."""
    asked: dict = {"info": [], "download": []}

    def ask(repo_id: str, revision: str) -> tuple[str, list[str]]:
        asked["info"].append((repo_id, revision))
        return COMMIT_B, [*MODEL_FILES, "README.md", "onnx/model.onnx", "tf_model.h5", "1_Pooling/config.json"]

    def download(repo_id: str, **options: object) -> str:
        asked["download"].append((repo_id, options))
        files = [f for f in MODEL_FILES if any(f == pattern for pattern in options["allow_patterns"])]
        return str(
            make_hub_cache(
                Path(str(options["cache_dir"])), repo_id, minilm_folder(), commit=str(options["revision"]), revisions=(), files=files
            )
        )

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub, "_ask_hub", ask)
    monkeypatch.setattr("huggingface_hub.snapshot_download", download)
    return asked


def test_online_validate_and_plan_say_run_downloads_and_download_nothing(tmp_path, online_hub, capsys):
    path = write_workflow(tmp_path, minilm_workflow())
    assert cli.main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{REPO} at main (commit {COMMIT_B[:12]}) is not in the Hugging Face cache" in out
    assert f"`engine run` downloads the {len(MODEL_FILES)} files Kiln uses of it" in out
    assert cli.main(["plan", str(path), "--store", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert "not downloaded yet" in out and "MISS export" in out
    assert online_hub["download"] == [] and online_hub["info"] == [(REPO, "main"), (REPO, "main")]


def test_run_downloads_only_what_kiln_uses_and_names_the_commit_by_its_revision(tmp_path, online_hub, monkeypatch):
    resolved = load_workflow(write_workflow(tmp_path, minilm_workflow()))
    assert not resolved.input.hub.present
    resolved.input = fetch_input(resolved.input, resolved.file)
    ((repo, options),) = online_hub["download"]
    assert repo == REPO and options["revision"] == COMMIT_B
    assert sorted(options["allow_patterns"]) == sorted(MODEL_FILES)  # no README, onnx/, TensorFlow or subfolder
    assert resolved.input.hub.present and resolved.input.path.is_dir()
    # the cache now names the commit by its branch: offline, main resolves to it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = load_workflow(resolved.file)
    assert again.input.attrs["commit"] == COMMIT_B and again.input.hub.present


def test_a_download_that_fails_is_refused_at_input_model(tmp_path, online_hub, monkeypatch):
    import httpx2

    def cut(repo_id: str, **options: object) -> str:
        raise httpx2.ReadTimeout("the read operation timed out")

    monkeypatch.setattr("huggingface_hub.snapshot_download", cut)
    resolved = load_workflow(write_workflow(tmp_path, minilm_workflow()))
    with pytest.raises(InputError) as error:
        fetch_input(resolved.input, resolved.file)
    (problem,) = error.value.problems
    assert problem.where == "input.model" and "could not be downloaded: the read operation timed out" in problem.message
    assert f"hf download {REPO} --revision {COMMIT_B}" in problem.hint


def test_a_cached_commit_is_not_asked_of_the_hub(tmp_path, online_hub, offline_hub):
    make_hub_cache(offline_hub, REPO, minilm_folder(), commit=COMMIT_A, files=MODEL_FILES)
    load_workflow(write_workflow(tmp_path, minilm_workflow(revision=COMMIT_A)))
    assert online_hub["info"] == []


def test_a_repo_without_weights_is_refused_before_any_download(tmp_path, offline_hub, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub, "_ask_hub", lambda repo_id, revision: (COMMIT_B, ["config.json", "README.md", "tf_model.h5"]))
    with pytest.raises(InputError, match="has no weights") as error:
        load_workflow(write_workflow(tmp_path, minilm_workflow()))
    assert [p.where for p in error.value.problems] == ["input.model"]


# --- runs -----------------------------------------------------------------------------------


def tiny_repo(tmp_path: Path, tiny_onnx: Path) -> Path:
    """A folder holding the tiny ONNX encoder as a Hub repo of format onnx holds it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copyfile(tiny_onnx, repo / "model.onnx")
    (repo / "config.json").write_text("{}")
    return repo


def tiny_hub_workflow(tmp_path: Path, tiny_onnx: Path) -> Path:
    """The tiny encoder as Hub repo kiln-test/tiny (format onnx): INT8 per-tensor or per-channel, judged by size and fidelity."""
    workflow = tiny_workflow(tiny_onnx)
    workflow["input"] = {"format": "onnx", "model": "kiln-test/tiny"}
    workflow["evaluate"] = [{"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}}, {"id": "size", "evaluator": "size"}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes"}, "constraints": [{"metric": "fidelity.cosine_mean", "min": 0.9}]}
    return write_workflow(tmp_path, workflow)


def written_files(*folders: Path) -> list[Path]:
    return [p for folder in folders for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]


def test_a_run_records_the_commit_and_never_the_token(tmp_path, offline_hub, tiny_onnx, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    make_hub_cache(offline_hub, "kiln-test/tiny", tiny_repo(tmp_path, tiny_onnx), commit=COMMIT_A)
    path = tiny_hub_workflow(tmp_path, tiny_onnx)
    store, out = tmp_path / "store", tmp_path / "out"
    done = cli_run("run", str(path), "--store", str(store), "-o", str(out), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lock = json.loads((out / "workflow.lock.json").read_text())
    assert lock["input"]["attrs"] == {"model": "kiln-test/tiny", "revision": "main", "commit": COMMIT_A}
    assert lock["input"]["digest"] == input_artifact(load_workflow(path), Store(store)).digest
    for file in written_files(out, store):
        assert TOKEN.encode() not in file.read_bytes(), file
    assert TOKEN not in done.stdout + done.stderr


def test_a_run_downloads_a_model_the_cache_lacks_first(tmp_path, online_hub, tiny_onnx, monkeypatch):
    """In process: the download is stood in for by laying the tiny model out at the commit the Hub named."""
    repo = tiny_repo(tmp_path, tiny_onnx)
    monkeypatch.setattr(hub, "_ask_hub", lambda repo_id, revision: (COMMIT_B, ["model.onnx", "config.json", "README.md"]))

    def download(repo_id: str, **options: object) -> str:
        online_hub["download"].append(sorted(options["allow_patterns"]))
        return str(make_hub_cache(Path(str(options["cache_dir"])), repo_id, repo, commit=str(options["revision"]), revisions=()))

    monkeypatch.setattr("huggingface_hub.snapshot_download", download)
    resolved = load_workflow(tiny_hub_workflow(tmp_path, tiny_onnx))
    report = run_workflow(resolved, Store(tmp_path / "store"), workers=1)
    assert online_hub["download"] == [["config.json", "model.onnx"]]
    assert report.input.attrs["commit"] == COMMIT_B
    assert all(result.state == "complete" for result in report.results)


@pytest.mark.slow
def test_minilm_from_the_hub_cache_exports_and_reruns_from_the_store(tmp_path, minilm_cache, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    path = write_workflow(tmp_path, minilm_workflow())
    store, out = tmp_path / "store", tmp_path / "out"
    first = cli_run("run", str(path), "--store", str(store), "-o", str(out), timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    lock = json.loads((out / "workflow.lock.json").read_text())
    assert lock["input"]["attrs"]["commit"] == COMMIT_A and lock["input"]["attrs"]["model"] == REPO
    (record,) = json.loads((out / "candidates.json").read_text())["candidates"]
    assert record["state"] == "complete" and record["metrics"]["size.file_bytes"] > 20e6
    assert (out / "cpu" / "model" / "model.onnx").is_file()
    for file in written_files(out, store):
        assert TOKEN.encode() not in file.read_bytes(), file
    second = cli_run("run", str(path), "--store", str(store), "-o", str(tmp_path / "again"), timeout=300)
    assert second.returncode == 0 and "passes: 0 run" in second.stdout, second.stdout
