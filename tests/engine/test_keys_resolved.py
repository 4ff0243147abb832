"""A pass job's key is computed from its resolved config, however each value was reached (written
under ``config:``, searched, or left to the pass's defaults), and names Kiln's version for the
passes whose code ships with Kiln."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from engine_helpers import tiny_workflow, write_workflow

import engine
from engine.plan.planner import build_plan
from engine.run import run_workflow
from engine.store.store import Store
from engine.workflow import load_workflow

STATIC_WRITTEN = {
    "mode": "static",
    "calibration": "rows",
    "quant_format": "QDQ",
    "calibration_method": "MinMax",
    "activation_type": "quint8",
}
STATIC_DEFAULTS = {"mode": "static", "calibration": "rows"}
STATIC_SEARCHED = {"mode": ["static"], "calibration": {"values": ["rows"], "when": {"mode": "static"}}}


def _workflow(tiny_onnx: Path, step: dict[str, Any]) -> dict[str, Any]:
    """Static INT8 of the tiny encoder calibrated on six rows of a file, judged by size alone."""
    rows = tiny_onnx.parent / "rows.npz"
    if not rows.exists():
        ids = np.random.default_rng(0).integers(0, 1000, size=(6, 16), dtype=np.int64)
        np.savez(rows, input_ids=ids, attention_mask=np.ones_like(ids))
    workflow = tiny_workflow(tiny_onnx)
    workflow["data"] = {"rows": {"source": "npz", "path": str(rows)}}
    workflow["steps"] = [{"id": "int8", "pass": "ort_quantize", **step}]
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}]
    workflow["select"] = {"objective": {"metric": "size.file_bytes", "goal": "min"}}
    workflow["search"] = {"sampler": "grid", "baselines": False}
    return workflow


def _pass_keys(folder: Path, workflow: dict[str, Any]) -> list[str]:
    plan = build_plan(load_workflow(write_workflow(folder, workflow)))
    return [plan.spec(job_id).key("sha256:input", {"rows": "sha256:rows"}, "sha256:input")[0] for job_id in plan.job_order()]


def test_a_config_written_searched_or_defaulted_has_one_key(tmp_path, tiny_onnx):
    written = _pass_keys(tmp_path / "written", _workflow(tiny_onnx, {"config": STATIC_WRITTEN}))
    defaulted = _pass_keys(tmp_path / "defaulted", _workflow(tiny_onnx, {"config": STATIC_DEFAULTS}))
    searched = _pass_keys(tmp_path / "searched", _workflow(tiny_onnx, {"search": STATIC_SEARCHED}))
    assert len(written) == 1
    assert written == defaulted == searched


def test_a_value_searched_as_an_int_keys_as_the_float_its_option_takes(tmp_path, tiny_onnx):
    written = {"mode": "static", "calibration": "rows", "calibration_method": "Percentile", "percentile": 99.0}
    searched = {**STATIC_SEARCHED, "calibration_method": {"values": ["Percentile"], "when": {"mode": "static"}}}
    searched["percentile"] = {"values": [99], "when": {"mode": "static"}}
    assert _pass_keys(tmp_path / "written", _workflow(tiny_onnx, {"config": written})) == _pass_keys(
        tmp_path / "searched", _workflow(tiny_onnx, {"search": searched})
    )


def test_the_searched_config_is_served_by_the_written_ones_run(tmp_path, tiny_onnx):
    store = Store(tmp_path / "store")
    first = run_workflow(load_workflow(write_workflow(tmp_path / "a", _workflow(tiny_onnx, {"config": STATIC_WRITTEN}))), store)
    assert first.stats.passes_run == 1
    searched = load_workflow(write_workflow(tmp_path / "b", _workflow(tiny_onnx, {"search": STATIC_SEARCHED})))
    second = run_workflow(searched, store)
    assert second.stats.passes_run == 0
    assert second.stats.passes_cached == 1
    assert [r.model.digest for r in second.results if r.model] == [r.model.digest for r in first.results if r.model]


def test_kiln_version_enters_the_keys_of_built_in_passes(tmp_path, tiny_onnx, monkeypatch):
    workflow = _workflow(tiny_onnx, {"config": STATIC_DEFAULTS})
    before = _pass_keys(tmp_path / "before", workflow)
    monkeypatch.setattr(engine, "__version__", "999.0.0")
    after = _pass_keys(tmp_path / "after", workflow)
    assert len(before) == len(after) == 1 and before != after


def test_kiln_version_stays_out_of_a_plugin_pass_key(tmp_path, tiny_onnx, monkeypatch, test_plugins):
    workflow = tiny_workflow(tiny_onnx)
    workflow["steps"] = [{"id": "copy", "pass": "copy", "config": {"tag": "b"}}]
    before = _pass_keys(tmp_path / "before", workflow)
    monkeypatch.setattr(engine, "__version__", "999.0.0")
    assert _pass_keys(tmp_path / "after", workflow) == before
