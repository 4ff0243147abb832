"""The workflow's datasets: their keys (known before anything runs), then reading them into the
store once per run, and where the jobs that use them find them."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.core.artifact import ModelArtifact
from engine.core.errors import InputError
from engine.core.refs import RefKind, referenced
from engine.execute.gate import Gate
from engine.execute.hooks import Hooks
from engine.execute.protocol import Executor
from engine.plan import keys
from engine.plan.jobs import DatasetInput, WorkOrder
from engine.store.store import Store
from engine.workflow.resolve import ResolvedWorkflow


def located(resolved: ResolvedWorkflow, where: str, compute: Callable[[], str]) -> str:
    """``compute()`` (a digest of user files), with a refused file placed in the workflow."""
    try:
        return compute()
    except InputError as error:
        problems = [replace(p, where=f"{where} ({p.where})", file=str(resolved.file)) for p in error.problems]
        raise InputError(problems) from None


def input_artifact(resolved: ResolvedWorkflow, store: Store) -> ModelArtifact:
    spec = resolved.input
    extra = {"function": spec.attrs["function"], "kwargs": spec.attrs.get("kwargs", {})} if spec.format == "torch" else None
    if spec.digest_extra:  # a Hub model's commit, trust_remote_code: a folder given by path keeps its digest
        extra = {**(extra or {}), **spec.digest_extra}
    where = "input.model" if spec.hub is not None else "input.path"
    digest = located(resolved, where, lambda: store.cached_digest(spec.path, spec.format, extra, spec.files))
    return ModelArtifact(format=spec.format, path=spec.path, digest=digest, attrs=dict(spec.attrs))


class Datasets:
    def __init__(self, resolved: ResolvedWorkflow, store: Store, input_model: ModelArtifact) -> None:
        self.resolved, self.store, self.input = resolved, store, input_model
        self.keys: dict[str, str] = {}
        self.docs: dict[str, dict[str, Any]] = {}
        self.paths: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        #: set once a dataset is read (or failed): jobs that use it wait for it (engine.execute.runner reads
        #: datasets alongside the first passes when more than one job may run at once)
        self.ready: dict[str, threading.Event] = {name: threading.Event() for name in resolved.datasets}
        for name, entry in resolved.datasets.items():
            file_digests = {
                option: located(resolved, f"data.{name}.{option}", lambda p=Path(path): store.cached_digest(p, "file"))
                for option, path in referenced(entry.cls.Config, entry.config, RefKind.FILE).items()
            }
            if getattr(entry.cls, "hub_dataset", False):  # a Hub dataset's snapshot, hashed by content (its path never enters the key)
                folder = Path(entry.config["folder"])
                file_digests["folder"] = located(resolved, f"data.{name}.name", lambda f=folder: store.cached_digest(f, "hf_dataset"))
            self.keys[name], self.docs[name] = keys.dataset_key(entry.cls, entry.config, file_digests, input_model.digest)

    def materialize(self, executor: Executor, hooks: Hooks, gate: Gate | None = None) -> None:
        """Read every dataset the store does not have yet (those built from a model's signature
        are built where that model is, by the job that reads them); with a ``gate`` (engine.execute.gate)
        each read takes a place in it, as a pass does."""
        try:
            for name, entry in self.resolved.datasets.items():
                if not entry.cls.needs_signature:
                    self._materialize(name, entry, executor, hooks, gate)
                self.ready[name].set()
        finally:  # interrupted: nobody waits forever (they find the dataset missing)
            for event in self.ready.values():
                event.set()

    def _materialize(self, name: str, entry: Any, executor: Executor, hooks: Hooks, gate: Gate | None) -> None:
        key = self.keys[name]
        record = self.store.lookup(key)
        if record is None:
            hooks.dataset_started(name)
            order = WorkOrder(
                kind="dataset", key=key, key_doc=self.docs[name], plugin=entry.cls.name, config=entry.config, input_model=self.input
            )
            with gate.shared() if gate is not None else contextlib.nullcontext():
                outcome = executor.run(order, timeout_s=entry.cls.default_timeout_s)
            if not outcome.ok:
                self.errors[name] = outcome.error or "failed"
                hooks.dataset_failed(name, outcome.error)
                return
            record, status = outcome.record or {}, "shared" if outcome.shared else "ran"  # shared: another run read it
        else:
            status = "hit"
        self.paths[name] = str(self.store.object_path(record["digest"]) / "dataset.npz")
        hooks.dataset_done(name, status, record.get("samples"))

    def wait(self, names: Iterable[str]) -> None:
        for name in names:
            if name in self.ready:
                self.ready[name].wait()

    def unreadable(self, names: Iterable[str]) -> str | None:
        """Why a job that reads ``names`` cannot run (one of them could not be read), if so."""
        names = list(names)
        self.wait(names)
        missing = [name for name in names if name in self.errors]
        return f"dataset {missing[0]} could not be read: {self.errors[missing[0]]}" if missing else None

    def inputs(self, names: Iterable[str]) -> dict[str, DatasetInput]:
        names = list(names)
        self.wait(names)
        out = {}
        for name in names:
            entry = self.resolved.datasets[name]
            out[name] = (
                DatasetInput(path=self.paths[name]) if name in self.paths else DatasetInput(source=entry.cls.name, config=entry.config)
            )
        return out
