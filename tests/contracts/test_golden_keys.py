"""Cache keys pinned by golden values.

Every result in a user's store is found by its key, so a key that changes by accident (a
refactor that reorders a document, a default that moves) silently throws the whole cache away.
These tests compute, for every example workflow, the keys that can be known before anything
runs (datasets, first-level pass jobs, the reference evaluations) and compare them with the
values recorded in ``golden_keys.json``. Library versions, Kiln's own version (which built-in
passes' keys name) and the host are masked, so the values hold on any machine and with any
release; tests/engine/test_keys_resolved.py checks that Kiln's version does enter those keys.

A deliberate change bumps ``engine.core.hashing.SCHEME`` and re-records the file:
``KILN_UPDATE_GOLDEN=1 python -m pytest tests/contracts/test_golden_keys.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from engine.core.hashing import SCHEME
from engine.plan import keys

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden_keys.json")
WORKFLOWS = sorted(p for p in (ROOT / "workflows").iterdir() if p.suffix in {".json", ".yaml", ".yml"})


@pytest.fixture
def masked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Library versions, Kiln's version and the host fingerprint fixed, and the timings' quiet
    wait at its default (tests/alone.py sets KILN_QUIET_WAIT_S for tests run beside others, and
    an evaluation's key holds its resolved options): the keys then depend on Kiln's hashing alone."""
    import engine.core.target as target_module

    def versions(names: Any) -> dict[str, str]:
        return {str(name): "masked" for name in names or ()}

    monkeypatch.setattr(keys, "library_versions", versions)
    monkeypatch.setattr(target_module, "library_versions", versions)
    monkeypatch.setattr(keys, "kiln_version", lambda: "masked")
    monkeypatch.setattr(keys, "host_fingerprint", lambda: {"host": "masked"})
    monkeypatch.setattr(keys, "accelerator_fingerprint", lambda: {"accelerators": "masked"})
    monkeypatch.setenv("KILN_STORE", str(tmp_path / "store"))
    monkeypatch.delenv("KILN_QUIET_WAIT_S", raising=False)


def known_keys(workflow: Path, store_root: Path) -> dict[str, str]:
    """Every key of a workflow's plan, by a readable name. A job's output digest is stood in by
    one derived from the job's own key, so keys downstream of jobs that have not run are pinned too."""
    from engine.core.target import Availability
    from engine.execute.runner import Runner
    from engine.plan.jobs import EvalSpec
    from engine.plan.planner import build_plan
    from engine.store.store import Store
    from engine.workflow import load_workflow

    resolved = load_workflow(workflow)
    for entry in resolved.targets.values():  # every target planned, here or on a host with its device
        entry.availability = Availability(True)
    runner = Runner(resolved, Store(store_root), plan=build_plan(resolved))
    out: dict[str, str] = {f"input {runner.input.format}": runner.input.digest}
    for name, key in sorted(runner.datasets.keys.items()):
        out[f"dataset {name}"] = key
    digests: dict[str, str] = {}
    for job_id in runner.plan.job_order():
        job = runner.plan.jobs[job_id]
        parent = runner.input.digest if job.parent is None else digests[job.parent]
        key = runner.job_key(job_id, parent)[0]
        digests[job_id] = "sha256:output-of-" + key[:16]
        chain, walker = [], job_id
        while walker:
            chain.append(runner.plan.jobs[walker].label)
            walker = runner.plan.jobs[walker].parent
        out[f"pass {job.target or '-'} {' > '.join(reversed(chain))}"] = key
    for target in resolved.targets:
        if resolved.targets[target].instance.config.environment is not None:
            continue  # fingerprinted inside its environment (its library versions), which this test does not build
        reference = runner.plan.reference(target)
        reference_digest = None if reference is None else (digests[reference.jobs[-1]] if reference.jobs else runner.input.digest)
        for candidate in runner.plan.candidates_of(target):
            model = digests[candidate.jobs[-1]] if candidate.jobs else runner.input.digest
            for entry in (e for e in resolved.evaluators.values() if e.candidates):
                against = None if candidate.reference else reference_digest
                out[f"eval {target} {runner.plan.label(candidate)} {entry.id}"] = runner.eval_key(
                    EvalSpec.of(entry), model, against, target, candidate.settings
                )[0]
    return out


def test_scheme_is_recorded_with_the_golden_values() -> None:
    assert json.loads(GOLDEN.read_text())["scheme"] == SCHEME, (
        "the key scheme changed: re-record golden_keys.json (see this file's docstring)"
    )


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_example_workflow_keys_are_unchanged(workflow: Path, masked: None, tmp_path: Path) -> None:
    got = known_keys(workflow, tmp_path / "store")
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {"scheme": SCHEME, "workflows": {}}
    if os.environ.get("KILN_UPDATE_GOLDEN"):
        golden["scheme"] = SCHEME
        golden["workflows"][workflow.name] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    want = golden["workflows"].get(workflow.name)
    assert want is not None, f"no golden keys for {workflow.name}: record them (see this file's docstring)"
    changed = sorted(name for name in set(want) | set(got) if want.get(name) != got.get(name))
    assert not changed, f"keys changed without a scheme bump: {changed}"


def test_pass_key_document_is_pinned(masked: None) -> None:
    """The key of a pass job from its parts alone: a change in how the document is built shows here."""

    class Pass:
        name, version, libraries, target_dependent = "golden_pass", 3, ("onnx",), True

    key, doc = keys.pass_key(Pass, {"mode": "dynamic", "per_channel": True}, "sha256:in", {"calib": "sha256:d"}, {"runtime": "ort"})
    assert doc["kind"] == "pass" and doc["target"] == {"runtime": "ort"} and doc["libraries"] == {"onnx": "masked"}
    got = {"pass_key": key}

    class Eval:
        name, version, libraries, needs_reference, timing = "golden_eval", 2, (), True, True

    key, doc = keys.eval_key(Eval, {"runs": 10}, "sha256:m", "sha256:r", {"runtime": "ort"}, {})
    assert doc["host"] == {"host": "masked"} and doc["reference"] == "sha256:r"
    got["eval_key"] = key

    class Source:
        name, version, libraries = "golden_source", 1, ()

    key, doc = keys.dataset_key(Source, {"path": "a.txt", "samples": 4}, {"path": "sha256:f"}, None)
    assert doc["config"] == {"path": "sha256:f", "samples": 4}
    got["dataset_key"] = key
    golden = json.loads(GOLDEN.read_text())
    if os.environ.get("KILN_UPDATE_GOLDEN"):
        golden["sdk"] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    assert got == golden.get("sdk"), "a key built from fixed parts changed: bump the scheme and re-record"
