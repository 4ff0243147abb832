"""Mutated workflows fed to `engine validate`: whatever the file holds, the answer is exit 0 or
2, a message and never a traceback, within a second of CPU time.

A seeded mutator (no extra dependency): each case starts from a small valid workflow and either
changes its structure (drop, retype, rename, duplicate, nest a key) or its text (cut, insert
syntax characters, duplicate lines, add anchors and aliases), in YAML or JSON. A failure prints
the seed of the case, so it replays alone.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import io
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from engine_helpers import engine_cmd, tiny_workflow

from engine.cli.main import main

# The structural and textual mutators and the richer base workflow are bench/adversarial.py's (one copy for both)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _adversarial_cases import mutate_structure, mutate_text, richer_workflow

CASES = 300


def base_workflows(model: Path) -> list[dict[str, Any]]:
    simple = tiny_workflow(model)
    return [simple, richer_workflow(simple)]


def hostile_paths(folder: Path) -> list[str]:
    """Paths no reader may follow: a symlink loop, a folder, a FIFO, endless devices."""
    loop, fifo = folder / "loop.onnx", folder / "pipe.jsonl"
    if not loop.is_symlink():
        os.symlink(loop, loop)
    if not fifo.exists():
        os.mkfifo(fifo)
    return [str(loop), str(folder), str(fifo), "/dev/zero", "/dev/urandom"]


def mutate_semantics(workflow: dict[str, Any], rng: random.Random, folder: Path) -> dict[str, Any]:
    """Well-formed but wrong: hostile paths, huge or inverted ranges, ranges on bools, values
    listed twice, inverted constraint bounds, over-long ids."""
    workflow = copy.deepcopy(workflow)
    step = workflow["steps"][-1]
    action = rng.choice(["path", "data", "huge", "inverted", "bool_range", "duplicates", "bounds", "long_id", "version"])
    if action == "path":
        workflow["input"]["path"] = rng.choice(hostile_paths(folder))
    elif action == "data":
        workflow["data"]["rows"] = {"source": "jsonl", "path": rng.choice(hostile_paths(folder)), "text_column": "text"}
    elif action == "huge":
        high = rng.choice([10**7, 10**12, 2**63])
        if rng.random() < 0.5:
            workflow["targets"][0].pop("intra_op_threads", None)
            workflow["targets"][0]["search"] = {"intra_op_threads": {"low": 1, "high": high, "step": 1}}
        else:
            step["search"] = {"num_bins": {"low": 2, "high": high}}
            step["config"] = {"mode": "static", "calibration": "rows"}
            workflow["search"] = rng.choice([{"max_candidates": 3}, {}])
    elif action == "inverted":
        step["search"] = {"num_bins": {"low": 100, "high": 2}}
    elif action == "bool_range":
        step["search"] = {"per_channel": {"low": 0, "high": 1}}
    elif action == "duplicates":
        step["search"] = {"per_channel": [False] * rng.randint(2, 1000) + [True]}
    elif action == "bounds":
        workflow["select"]["constraints"] = [{"metric": "fidelity.cosine_mean", "min": 10, "max": 1}]
    elif action == "long_id":
        workflow[rng.choice(["steps", "targets", "evaluate"])][0]["id"] = "a" * rng.randint(65, 300)
    else:
        workflow["version"] = rng.choice([True, 1.0, "1"])
    return workflow


def make_case(seed: int, bases: list[dict[str, Any]], folder: Path) -> Path:
    rng = random.Random(seed)
    if rng.random() < 0.15:
        return _write(folder, seed, mutate_semantics(bases[0], rng, folder), rng.random() < 0.4)
    workflow = mutate_structure(rng.choice(bases), rng) if rng.random() < 0.6 else rng.choice(bases)
    as_json = rng.random() < 0.4
    text = json.dumps(workflow, indent=1, default=str) if as_json else yaml.safe_dump(workflow, sort_keys=False, allow_unicode=True)
    if rng.random() < 0.5 or workflow in bases:
        text = mutate_text(text, rng)
    path = folder / f"case{seed}.{'json' if as_json else 'yaml'}"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def _write(folder: Path, seed: int, workflow: dict[str, Any], as_json: bool) -> Path:
    path = folder / f"case{seed}.{'json' if as_json else 'yaml'}"
    path.write_text(json.dumps(workflow, indent=1) if as_json else yaml.safe_dump(workflow, sort_keys=False), encoding="utf-8")
    return path


def validate(path: Path) -> tuple[int, str, float]:
    """Exit code, output, and the CPU seconds this thread spent (validation is single-threaded).
    The bound is on the work a case costs (a range of 10**12 values enumerated, an alias bomb
    expanded), which wall time does not measure on a 2-core host with another test beside this
    one (1.13 s of wall once, for a case that takes 0.1 s alone)."""
    out, err = io.StringIO(), io.StringIO()
    started = time.thread_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["validate", str(path)])
    return code, out.getvalue() + err.getvalue(), time.thread_time() - started


@pytest.fixture
def frozen_heap() -> Iterator[None]:
    """What the test process holds from earlier tests (models, graphs) left out of garbage
    collection: a collection of that whole heap costs more than a second on its own and falls
    on whatever code triggered it (1.66 s of CPU once, for a case that takes 0.03 s), which is
    not the case's work."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def test_the_unmutated_bases_are_valid(tmp_path, tiny_onnx):
    for index, workflow in enumerate(base_workflows(tiny_onnx)):
        path = tmp_path / f"base{index}.yaml"
        path.write_text(yaml.safe_dump(workflow, sort_keys=False))
        code, output, _ = validate(path)
        assert code == 0, output


@pytest.mark.parametrize("chunk", range(3))
def test_mutated_workflows_exit_0_or_2_without_a_traceback_each_within_a_second(tmp_path, tiny_onnx, chunk, frozen_heap):
    bases = base_workflows(tiny_onnx)
    codes = []
    for seed in range(chunk * CASES // 3, (chunk + 1) * CASES // 3):
        path = make_case(seed, bases, tmp_path)
        try:
            validate(path)  # untimed: the first time a key is met may import its plugin (0.4-1.2 s of CPU once)
            code, output, seconds = validate(path)
        except BaseException as error:  # noqa: BLE001 - the bug this test exists to catch; show the case
            pytest.fail(f"seed {seed}: {type(error).__name__}: {error}\n--- {path.name}\n{path.read_text()[:3000]}")
        assert code in (0, 2), f"seed {seed}: exit {code}\n{output}"
        assert "Traceback" not in output, f"seed {seed}\n{output}"
        assert seconds < 1.0, f"seed {seed}: {seconds:.2f} s of CPU"
        assert code == 0 or "problem" in output, f"seed {seed}: exit 2 without a message\n{output}"
        codes.append(code)
    assert 2 in codes  # the mutator does break workflows


def test_semantic_mutants_exit_0_or_2_in_process(tmp_path, tiny_onnx):
    bases = base_workflows(tiny_onnx)
    codes = []
    for seed in range(40):
        path = _write(tmp_path, seed, mutate_semantics(bases[0], random.Random(seed), tmp_path), seed % 3 == 0)
        code, output, _ = validate(path)
        assert code in (0, 2), f"seed {seed}: exit {code}\n{output}\n{path.read_text()[:2000]}"
        assert "Traceback" not in output, f"seed {seed}\n{output}"
        codes.append(code)
    assert codes.count(2) > 30  # only a huge space with max_candidates is valid


def test_a_sample_of_mutants_exits_0_or_2_as_a_fresh_process(tmp_path, tiny_onnx):
    """Each case in its own `python -m engine validate`: nothing in-process hides a crash."""
    bases = base_workflows(tiny_onnx)
    for seed in range(20):
        rng = random.Random(10_000 + seed)
        if seed % 2:
            path = _write(tmp_path, seed, mutate_semantics(bases[0], rng, tmp_path), seed % 4 == 1)
        else:
            path = make_case(10_000 + seed, bases, tmp_path)
        done = subprocess.run([*engine_cmd(), "validate", str(path)], capture_output=True, text=True, timeout=60)
        output = done.stdout + done.stderr
        assert done.returncode in (0, 2), f"seed {seed}: exit {done.returncode}\n{output}\n{path.read_text()[:2000]}"
        assert "Traceback" not in output and "bug in Kiln" not in output, f"seed {seed}\n{output}"
