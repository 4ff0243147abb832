"""The run history: an embedded SQLite database beside the store (``<store>/history.sqlite``).

A run is written twice, each time in one transaction: as ``running`` when it starts (with its
process id and host), and complete when it ends (its candidates, metrics, choices and the
environment, read from the records the run wrote into its output folder). A run killed in
between keeps its ``running`` row; once its process is gone it is shown as ``interrupted``.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from engine.core.errors import InputError, Problem

HISTORY_NAME = "history.sqlite"

_meta = sa.MetaData()
runs = sa.Table(
    "runs",
    _meta,
    sa.Column("id", sa.String, primary_key=True),
    sa.Column("started", sa.Float, nullable=False),
    sa.Column("finished", sa.Float),
    sa.Column("workflow_path", sa.String, nullable=False),
    sa.Column("workflow_digest", sa.String),
    sa.Column("name", sa.String),
    sa.Column("targets", sa.JSON),
    sa.Column("status", sa.String, nullable=False),  # running, ok, no-choice, failed, interrupted
    sa.Column("exit_code", sa.Integer),
    sa.Column("wall_s", sa.Float),
    sa.Column("output_dir", sa.String),
    sa.Column("kiln_version", sa.String),
    sa.Column("host", sa.String),
    sa.Column("host_summary", sa.String),
    sa.Column("pid", sa.Integer),
    sa.Column("records", sa.JSON),  # candidates.json, workflow.lock.json, deploy settings: the report's input
)
candidates = sa.Table(
    "candidates",
    _meta,
    sa.Column("run", sa.String, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("id", sa.String, primary_key=True),
    sa.Column("target", sa.String, nullable=False),
    sa.Column("path", sa.String),
    sa.Column("params", sa.JSON),
    sa.Column("settings", sa.JSON),
    sa.Column("state", sa.String),
    sa.Column("chosen", sa.Boolean),
    sa.Column("feasible", sa.Boolean),
)
metrics = sa.Table(
    "metrics",
    _meta,
    sa.Column("run", sa.String, primary_key=True),
    sa.Column("candidate", sa.String, primary_key=True),
    sa.Column("name", sa.String, primary_key=True),
    sa.Column("value", sa.Float),
    sa.Column("low", sa.Float),
    sa.Column("high", sa.Float),
)
choices = sa.Table(
    "choices",
    _meta,
    sa.Column("run", sa.String, primary_key=True),
    sa.Column("target", sa.String, primary_key=True),
    sa.Column("candidate", sa.String),
    sa.Column("verdict", sa.String),
)
environment = sa.Table(
    "environment",
    _meta,
    sa.Column("run", sa.String, primary_key=True),
    sa.Column("kind", sa.String, primary_key=True),  # library, host
    sa.Column("name", sa.String, primary_key=True),
    sa.Column("value", sa.String),
)


@dataclass
class RunRow:
    """One run as the history holds it (``status`` already says ``interrupted`` for a dead run)."""

    row: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.row[key]

    @property
    def id(self) -> str:
        return str(self.row["id"])


class History:
    def __init__(self, store_root: Path) -> None:
        self.path = Path(store_root) / HISTORY_NAME
        # runs sharing a store write their rows one short transaction at a time: wait for the lock
        self.engine = sa.create_engine(f"sqlite:///{self.path}", connect_args={"timeout": 30})
        _meta.create_all(self.engine)

    # -- writing ----------------------------------------------------------------------------
    def start(self, workflow: Path, digest: str | None, name: str, targets: list[str], output_dir: Path, version: str) -> str:
        """Record a run as started; returns its id."""
        run_id = uuid.uuid4().hex[:12]
        with self.engine.begin() as db:
            db.execute(
                runs.insert().values(
                    id=run_id,
                    started=time.time(),
                    workflow_path=str(workflow),
                    workflow_digest=digest,
                    name=name,
                    targets=targets,
                    status="running",
                    output_dir=str(output_dir),
                    kiln_version=version,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                )
            )
        return run_id

    def finish(self, run_id: str, status: str, exit_code: int, wall_s: float, output_dir: Path | None = None) -> None:
        """Record a run's end: its status, and, from its output folder, what it found."""
        records = _read_output(output_dir) if output_dir is not None else None
        with self.engine.begin() as db:
            values: dict[str, Any] = {"finished": time.time(), "status": status, "exit_code": exit_code, "wall_s": wall_s}
            if records is not None:
                lock = records["lock"]
                values["records"] = records
                values["host_summary"] = _host_summary(lock)
                values["workflow_digest"] = (lock.get("workflow") or {}).get("sha256")
                _insert_records(db, run_id, records)
            db.execute(runs.update().where(runs.c.id == run_id).values(**values))

    # -- reading ----------------------------------------------------------------------------
    def runs(self, limit: int | None = None) -> list[RunRow]:
        query = sa.select(runs).order_by(runs.c.started.desc())
        if limit:
            query = query.limit(limit)
        with self.engine.connect() as db:
            return [RunRow(_alive(dict(r._mapping))) for r in db.execute(query)]

    def find(self, ref: str) -> RunRow:
        """The run named by ``ref``: its id, a unique prefix of it, or ``last``."""
        with self.engine.connect() as db:
            if ref == "last":
                found = list(db.execute(sa.select(runs).order_by(runs.c.started.desc()).limit(1)))
            else:
                found = list(db.execute(sa.select(runs).where(runs.c.id.startswith(ref, autoescape=True)).limit(2)))
        if len(found) != 1:
            why = "matches more than one run" if found else "names no run in the history"
            raise InputError(
                [
                    Problem(
                        where="RUN",
                        message=why,
                        expected="a run id, a unique prefix of one, or 'last'",
                        given=ref,
                        hint=f"`engine runs --store {self.path.parent}` lists them",
                        file=str(self.path),
                    )
                ]
            )
        return RunRow(_alive(dict(found[0]._mapping)))

    def candidates(self, run_id: str) -> list[dict[str, Any]]:
        with self.engine.connect() as db:
            rows = db.execute(sa.select(candidates).where(candidates.c.run == run_id))
            return [dict(r._mapping) for r in rows]

    def metrics(self, run_id: str) -> dict[tuple[str, str], dict[str, Any]]:
        """(candidate, metric name) -> {value, low, high}."""
        with self.engine.connect() as db:
            rows = db.execute(sa.select(metrics).where(metrics.c.run == run_id))
            return {(r.candidate, r.name): {"value": r.value, "low": r.low, "high": r.high} for r in rows}

    def choices(self, run_id: str) -> dict[str, dict[str, Any]]:
        with self.engine.connect() as db:
            rows = db.execute(sa.select(choices).where(choices.c.run == run_id))
            return {r.target: {"candidate": r.candidate, "verdict": r.verdict} for r in rows}

    def environment(self, run_id: str) -> dict[str, dict[str, str | None]]:
        """kind -> {name: value}."""
        found: dict[str, dict[str, str | None]] = {}
        with self.engine.connect() as db:
            for r in db.execute(sa.select(environment).where(environment.c.run == run_id)):
                found.setdefault(r.kind, {})[r.name] = r.value
        return found


def open_history(store_root: Path) -> History:
    """The history of an existing store; a folder with no history is bad input (exit 2)."""
    if not (Path(store_root) / HISTORY_NAME).is_file():
        raise InputError(
            [
                Problem(
                    where="--store",
                    message="holds no run history",
                    expected=f"a store folder with {HISTORY_NAME} (written by `engine run`)",
                    given=str(store_root),
                    hint="point --store at the store your runs used",
                )
            ]
        )
    return History(store_root)


def _read_output(output_dir: Path) -> dict[str, Any] | None:
    """The records a run wrote into its output folder, or None when it wrote none."""
    from engine.report.report_html import read_records

    return read_records(output_dir) if (output_dir / "candidates.json").is_file() else None


def _insert_records(db: sa.Connection, run_id: str, records: dict[str, Any]) -> None:
    for c in records["candidates"].get("candidates", []):
        db.execute(
            candidates.insert().values(
                run=run_id,
                id=c["id"],
                target=c["target"],
                path=c.get("path"),
                params=c.get("params"),
                settings=c.get("settings"),
                state=c.get("state"),
                chosen=bool(c.get("chosen")),
                feasible=c.get("feasible"),
            )
        )
        intervals = c.get("intervals") or {}
        for name, value in (c.get("metrics") or {}).items():
            interval = intervals.get(name) or {}
            low, high = (interval.get("low"), interval.get("high")) if isinstance(interval, dict) else (None, None)
            db.execute(metrics.insert().values(run=run_id, candidate=c["id"], name=name, value=_float(value), low=low, high=high))
        if c.get("chosen"):
            db.execute(choices.insert().values(run=run_id, target=c["target"], candidate=c["id"], verdict=c.get("verdict")))
    lock = records["lock"]
    rows = [{"kind": "library", "name": k, "value": v} for k, v in (lock.get("libraries") or {}).items()]
    host = {"platform": lock.get("platform"), "python": lock.get("python"), **(lock.get("host") or {})}
    rows += [{"kind": "host", "name": k, "value": v if isinstance(v, str) or v is None else json.dumps(v)} for k, v in host.items()]
    if lock.get("accelerators"):
        rows.append({"kind": "host", "name": "accelerators", "value": json.dumps(lock["accelerators"], sort_keys=True)})
    for row in rows:
        db.execute(environment.insert().values(run=run_id, **row))


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _host_summary(lock: dict[str, Any]) -> str:
    host = lock.get("host") or {}
    parts = [str(host[k]) for k in ("cpu", "machine") if host.get(k)] + ([f"{host['cores']} cores"] if host.get("cores") else [])
    return ", ".join(parts) or str(lock.get("platform") or "")


def _alive(row: dict[str, Any]) -> dict[str, Any]:
    """A ``running`` run whose process is gone (on this host) was killed: ``interrupted``."""
    if row["status"] == "running" and row.get("host") == socket.gethostname() and not _pid_alive(row.get("pid")):
        row["status"] = "interrupted"
    return row


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
