"""``engine run A.yaml B.yaml ...`` (or a folder of workflows): a fleet, run as one pool.

Every workflow is read and checked first (any problem in any file: exit 2, nothing runs); they
then run at once, each in its own thread, over one store and one executor shared through one
gate (engine.execute.fleet), so a job two workflows share runs once. Each writes its own output
folder (its ``output.dir``, else ``out/<name>``; with ``--output DIR``: ``DIR/<name>``) and is
recorded in the store's history; the terminal gets each workflow's summary, then the fleet's.
The fleet's exit code is 0 only when every workflow chose a model for every available target.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.cli.exits import EXIT_BAD_INPUT, EXIT_BUG, EXIT_NO_CHOICE, EXIT_OK
from engine.core.errors import InputError, KilnError, Problem

WORKFLOW_SUFFIXES = (".yaml", ".yml", ".json")


def workflow_files(given: list[Path]) -> list[Path]:
    """The files named, a folder standing for the workflow files directly in it (sorted)."""
    files: list[Path] = []
    for path in given:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in WORKFLOW_SUFFIXES and p.is_file())
            if not found:
                raise InputError(
                    [
                        Problem(
                            where="workflow",
                            message="holds no workflow file",
                            expected="a folder of .yaml, .yml or .json workflows",
                            given=str(path),
                            hint="name the workflow files instead",
                        )
                    ]
                )
            files.extend(found)
        else:
            files.append(path)
    return files


def run_command(args: argparse.Namespace, run_one: Callable[[argparse.Namespace], int], recorded: Callable[..., int]) -> int:
    """``engine run``: one workflow as before, several (or a folder) as a fleet."""
    files = workflow_files(args.workflow)
    if len(files) == 1 and not args.workflow[0].is_dir():
        args.workflow = files[0]
        return run_one(args)
    if getattr(args, "summary", None) is not None:
        raise InputError(
            [
                Problem(
                    where="--summary",
                    message="takes the run of one workflow; a fleet is several runs",
                    expected="one workflow with --summary",
                    given=f"{len(files)} workflows",
                    hint="run each workflow with its own --summary, or read each run's summary with `engine show RUN --format json|md`",
                )
            ]
        )
    return run_fleet(args, files, recorded)


def _load_all(files: list[Path]) -> list[Any]:
    """Every workflow read and checked; the problems of all of them raised at once."""
    from engine.olive.cli import olive_file, run_path
    from engine.workflow import load_workflow

    loaded, problems = [], []
    for path in files:
        try:
            loaded.append(load_workflow(run_path(path) if olive_file(path) else path))
        except InputError as error:
            problems.extend(error.problems)
    if problems:
        raise InputError(problems)
    return loaded


def _outputs(args: argparse.Namespace, workflows: list[Any]) -> list[Path]:
    from engine.execute.outdir import check_output_dir

    outputs = []
    for resolved in workflows:
        if args.output:
            output = args.output / resolved.name
        else:
            output = Path(resolved.spec.output.dir or os.path.join("out", resolved.name))
        if output.resolve() in [o.resolve() for o in outputs]:
            raise InputError(
                [
                    Problem(
                        where="output.dir",
                        file=str(resolved.file),
                        message="is the output folder of another workflow of this run",
                        given=str(output),
                        hint="give each workflow its own name or output.dir",
                    )
                ]
            )
        check_output_dir(output)
        outputs.append(output)
    return outputs


def _store(args: argparse.Namespace, workflows: list[Any]) -> Any:
    from engine.store.store import Store
    from engine.workflow import default_store_dir

    if args.store:
        return Store(args.store.resolve()).ensure()
    roots = {default_store_dir(resolved) for resolved in workflows}
    if len(roots) > 1:
        given = ", ".join(sorted(str(root) for root in roots))
        raise InputError(
            [
                Problem(
                    where="cache.dir",
                    message="the workflows name different stores; a fleet runs over one",
                    given=given,
                    hint="pass --store DIR (or give them the same cache.dir)",
                )
            ]
        )
    return Store(roots.pop()).ensure()


def run_fleet(
    args: argparse.Namespace, files: list[Path], recorded: Callable[..., int]
) -> int:  # long: reads, runs and reports the fleet in order
    from engine.execute.executor import LocalExecutor
    from engine.execute.fleet import SharedExecutor
    from engine.report.report import console

    if args.workers is not None and args.workers < 1:
        raise InputError([Problem(where="--workers", message="needs at least one worker", given=str(args.workers), hint="--workers 1")])
    workflows = _load_all(files)
    outputs = _outputs(args, workflows)
    store = _store(args, workflows)
    if args.executor == "ray":
        from engine.execute.ray_executor import RayExecutor

        inner: Any = RayExecutor(store, address=args.ray_address or os.environ.get("RAY_ADDRESS"), targets=_all_targets(workflows))
    else:
        inner = LocalExecutor(store)
    shared = SharedExecutor(inner, store, args.workers or inner.default_workers() or 1, exclusive_timing=not args.overlap_timing)
    results: dict[int, tuple[int, Any, str | None]] = {}
    threads = [
        threading.Thread(target=_one, args=(i, resolved, output, store, shared, recorded, results), name=f"fleet-{resolved.name}")
        for i, (resolved, output) in enumerate(zip(workflows, outputs, strict=True))
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        shared.stop()
        raise
    finally:
        inner.close()
    return _report(workflows, outputs, results, console)


def _all_targets(workflows: list[Any]) -> Any:
    """Every workflow's targets by id, for the Ray executor's resources (the same id in two
    workflows: the later one's)."""

    class Targets:
        targets = {tid: entry for resolved in workflows for tid, entry in resolved.targets.items()}

    return Targets()


def _one(index: int, resolved: Any, output: Path, store: Any, shared: Any, recorded: Callable[..., int], results: dict[int, Any]) -> None:
    from engine.execute.hooks import EventLog, Fanout
    from engine.report.emit import write_outputs
    from engine.report.report import Progress
    from engine.run import run_workflow

    holder: dict[str, Any] = {}

    def execute() -> int:
        output.mkdir(parents=True, exist_ok=True)
        with EventLog(output / "events.jsonl") as events:
            report = run_workflow(resolved, store, Fanout(events, Progress(quiet=True)), executor=shared, workers=shared.gate.workers)
        write_outputs(report, output)
        holder["report"] = report
        runnable = [t for t in resolved.targets.values() if t.availability.ok]
        chosen = report.chosen()
        return EXIT_OK if runnable and all(t.id in chosen for t in runnable) else EXIT_NO_CHOICE

    try:
        code = recorded(store, resolved, output, execute)
        results[index] = (code, holder.get("report"), None)
    except KilnError as error:
        results[index] = (EXIT_BAD_INPUT, None, str(error))
    except Exception as error:  # noqa: BLE001 - one workflow's failure is reported with the fleet's
        results[index] = (EXIT_BUG, None, f"{type(error).__name__}: {error}")


def _report(workflows: list[Any], outputs: list[Path], results: dict[int, Any], console: Any) -> int:
    from rich.table import Table

    from engine.report.report import print_summary

    table = Table(title="fleet", title_justify="left")
    for column in ("workflow", "file", "chosen", "output", "exit"):
        table.add_column(column)
    codes = []
    for i, (resolved, output) in enumerate(zip(workflows, outputs, strict=True)):
        code, report, error = results.get(i, (EXIT_BUG, None, "it did not finish"))
        codes.append(code)
        console.rule(f"{resolved.name} ({resolved.file})")
        if report is not None:
            print_summary(report)
        if error:
            console.print(f"[red]{resolved.name} failed[/red]: {error}")
        chosen = ", ".join(f"{t}: {r.label}" for t, r in report.chosen().items()) if report is not None else "-"
        table.add_row(resolved.name, str(resolved.file), chosen or "none", str(output), str(code))
    console.print(table)
    worst = max(codes, default=EXIT_OK)
    fleet = EXIT_OK if worst == EXIT_OK else worst if worst > EXIT_NO_CHOICE else EXIT_NO_CHOICE
    console.print(
        f"fleet: {sum(c == EXIT_OK for c in codes)} of {len(codes)} workflows chose a model for every available target; exit {fleet}"
    )
    return fleet
