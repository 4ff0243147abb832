"""A workflow reads its data with the custom source: the function runs when the data is read,
and its samples feed the evaluations."""

from __future__ import annotations

import json
import subprocess

from engine_helpers import engine_cmd, tiny_workflow, write_workflow

MAKER = """
import numpy as np


def rows(model, n=4):
    ids = (np.arange(n * 16, dtype=np.int64).reshape(n, 16) * 7) % 1000
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}
"""


def test_a_custom_source_feeds_the_evaluations(tmp_path, tiny_onnx):
    (tmp_path / "make_data.py").write_text(MAKER)
    workflow = tiny_workflow(tiny_onnx)
    workflow["data"] = {"rows": {"source": "custom", "file": "make_data.py", "function": "rows", "options": {"n": 6}}}
    workflow["evaluate"] = [workflow["evaluate"][0]]
    workflow["select"] = {"objective": {"metric": "fidelity.cosine_mean", "goal": "max"}, "constraints": []}
    path = write_workflow(tmp_path, workflow)
    checked = subprocess.run([*engine_cmd(), "validate", str(path)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and f"data.rows.file: {tmp_path / 'make_data.py'}, function rows" in checked.stdout  # named
    done = subprocess.run(
        [*engine_cmd(), "run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    assert all(r["state"] == "complete" for r in records)
    assert [r["metrics"]["fidelity.samples"] for r in records if not r["reference"]] == [6.0, 6.0]  # the function's samples
