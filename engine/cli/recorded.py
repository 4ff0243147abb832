"""A run recorded in its store's history (as running first, then with its end), and its short
summary written where ``--summary`` says, whatever the run's end: the same document ``engine show
RUN --format json|md`` prints, since both are computed from the history's row."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import __version__
from engine.cli.exits import EXIT_BAD_INPUT, EXIT_BUG, EXIT_CLOSED_PIPE, EXIT_INTERRUPTED, EXIT_OK, EXIT_STORE_DAMAGED
from engine.core.errors import InputError, KilnError

#: where a run's summary goes and as what: (path, "md" | "json")
SummaryTarget = tuple[Path, str]


def summary_target(args: argparse.Namespace) -> SummaryTarget | None:
    """``--summary FILE`` with its format: ``--summary-format``, else by the suffix (.json: JSON,
    anything else, ``$GITHUB_STEP_SUMMARY`` included: Markdown)."""
    path = getattr(args, "summary", None)
    if path is None:
        return None
    from engine.report.summary import summary_format

    return path, summary_format(path, getattr(args, "summary_format", None))


def recorded(store: Any, resolved: Any, output: Path, execute: Callable[[], int], summary: SummaryTarget | None = None) -> int:
    """Run ``execute`` recorded in the store's history; its summary written to ``summary``."""
    from sqlalchemy.exc import SQLAlchemyError

    from engine.core.hashing import sha256_file
    from engine.report.history import History
    from engine.store.store import StoreDamaged

    history: History | None = None
    run_id = None
    try:
        history = History(store.root)
        run_id = history.start(resolved.file, sha256_file(resolved.file), resolved.name, list(resolved.targets), output, __version__)
    except SQLAlchemyError as error:  # a damaged history does not stop the run: it goes unrecorded
        print(f"warning: this run is not recorded in the history of {store.root}: {error}", file=sys.stderr)
    started, status, code = time.perf_counter(), "failed", EXIT_BUG
    try:
        code = int(execute())
        status = "ok" if code == EXIT_OK else "no-choice"
        return code
    except KeyboardInterrupt:
        status, code = "interrupted", EXIT_INTERRUPTED
        raise
    except KilnError as error:
        code = EXIT_STORE_DAMAGED if isinstance(error, StoreDamaged) else EXIT_BAD_INPUT
        raise
    except BrokenPipeError:
        code = EXIT_CLOSED_PIPE
        raise
    finally:
        wall = time.perf_counter() - started
        kept = output if status in ("ok", "no-choice") else None
        if history is not None and run_id is not None:
            history.finish(run_id, status, code, wall, kept)
        if summary is not None:
            _write(summary, history, run_id, resolved, output, kept, status, code, wall)


def _write(
    summary: SummaryTarget,
    history: Any,
    run_id: str | None,
    resolved: Any,
    output: Path,
    kept: Path | None,
    status: str,
    code: int,
    wall: float,
) -> None:
    """The summary from the history's row (as ``engine show`` reads it); from the same facts in
    hand when the history could not record the run. A summary that cannot be written is a
    warning: the run's own exit code stands."""
    from engine.report.summary import build_summary

    def document() -> dict[str, Any]:
        if history is not None and run_id is not None:
            run = history.find(run_id)
            return build_summary(run.row, run["records"])
        from engine.report.report_html import read_records

        row = {"id": None, "name": resolved.name, "workflow_path": str(resolved.file), "status": status, "exit_code": code}
        row |= {"wall_s": wall, "targets": list(resolved.targets), "output_dir": str(output), "kiln_version": __version__}
        return build_summary(row, read_records(kept) if kept is not None and (kept / "candidates.json").is_file() else None)

    _save(summary, document)


def _save(summary: SummaryTarget, document: Callable[[], dict[str, Any]]) -> None:
    """Write ``document()`` where ``summary`` says; a summary that cannot be read or written is a
    warning on stderr (the run's own exit code stands)."""
    from engine.report.summary import write_summary

    path, fmt = summary
    try:
        write_summary(path, document(), fmt)
    except OSError as error:
        print(f"warning: the summary could not be written to {path}: {error.strerror or error}", file=sys.stderr)


def refused(summary: SummaryTarget | None, workflow: Path, error: Exception, code: int) -> None:
    """The summary of a run refused before it began (an invalid workflow, an output folder or store
    it cannot use: exit 2, or 4 for a damaged store): no run id, no targets, the first problem as
    the reason, so a CI job's summary says why instead of going missing."""
    if summary is None:
        return
    from engine.report.summary import build_summary

    first = error.problems[0].render() if isinstance(error, InputError) and error.problems else str(error)
    more = len(error.problems) - 1 if isinstance(error, InputError) else 0
    reason = first.replace("\n    ", "; ") + (f" (and {more} more problem(s) on stderr)" if more > 0 else "")
    row = {"id": None, "name": workflow.stem, "workflow_path": str(workflow), "status": "refused", "exit_code": code}
    row |= {"exit_reason": reason, "targets": [], "kiln_version": __version__}
    _save(summary, lambda: build_summary(row, None))
