"""The `engine` command: a thin layer over the functions in engine.run, engine.plan.planner and
engine.workflow. Heavy libraries load only inside the command that needs them, so `engine
--help` stays instant."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from engine import __version__
from engine.cli import exits
from engine.cli.exits import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_NO_CHOICE, EXIT_OK, EXIT_STORE_DAMAGED
from engine.cli.fleet import run_command
from engine.cli.recorded import recorded, refused, summary_target
from engine.core.errors import InputError, KilnError, Problem
from engine.optimize import options as optimize_options
from engine.text import display

WORKERS_HELP = "run up to N jobs at once (timings still run alone; default: one per core, at most 4, as memory allows; with --executor ray the cluster's CPUs)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="engine", description="Kiln: turn a trained model into the fastest model that still meets its accuracy bar, per target."
    )
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    running = argparse.ArgumentParser(add_help=False)  # the options of a run, shared by `run` and `optimize`
    running.add_argument("--store", type=Path, help="artifact store folder (default: the workflow's cache.dir, $KILN_STORE, ~/.cache/kiln)")
    running.add_argument("--quiet", "-q", action="store_true", help="print only the summary")
    running.add_argument("--workers", "-j", type=int, help=WORKERS_HELP)
    running.add_argument("--overlap-timing", action="store_true", help="let timing evaluations share the machine with other jobs")
    running.add_argument("--executor", choices=("local", "ray"), default="local", help="run jobs in local processes or as Ray tasks")
    running.add_argument("--ray-address", help="the Ray cluster to join (default: $RAY_ADDRESS, else a local one)")
    running.add_argument("--summary", type=Path, metavar="FILE", help="also write the run's short summary there, whatever its end (for CI)")
    running.add_argument("--summary-format", choices=("md", "json"), help="the summary's format (default: json for a .json file, else md)")
    run = sub.add_parser("run", parents=[running], help="validate, plan, run and select; write the best model(s) and records")
    run.add_argument("workflow", type=Path, nargs="+", help="a workflow; several, or a folder of them, run as one fleet")
    run.add_argument("--output", "-o", type=Path, help="output folder (default: the workflow's output.dir, else out/<name>)")
    optimize_options.add_arguments(sub.add_parser("optimize", parents=[running], help="write a model's workflow for a device, then run it"))

    validate = sub.add_parser("validate", help="check workflow files and report every problem at once")
    validate.add_argument("workflows", type=Path, nargs="+")

    plan = sub.add_parser("plan", help="print the job DAG and, per job, whether the cache has it (runs nothing)")
    plan.add_argument("workflow", type=Path)
    plan.add_argument("--store", type=Path)
    plan.add_argument("--explain", action="store_true", help="for each miss, say which part of its key changed since the last run")

    verify = sub.add_parser("verify", help="hash every object and check every record of a store; --repair removes the damaged ones")
    verify.add_argument("--store", type=Path, help="the store folder (default: $KILN_STORE, else ~/.cache/kiln)")
    verify.add_argument("--repair", action="store_true", help="remove damaged objects and bad records (the next run recomputes them)")

    doctor = sub.add_parser("doctor", help="what this machine offers Kiln, and per target kind what is missing and how to add it")
    doctor.add_argument("--store", type=Path, help="the store folder (default: $KILN_STORE, else ~/.cache/kiln)")

    runs = sub.add_parser("runs", help="list the runs recorded in a store's history")
    runs.add_argument("--store", type=Path, help="the store folder (default: $KILN_STORE, else ~/.cache/kiln)")
    runs.add_argument("--limit", "-n", type=int, default=20, help="the N latest runs (0: all)")
    show = sub.add_parser("show", help="the summary of a past run; --html writes its report.html again")
    show.add_argument("run", help="a run id, a unique prefix of one, or 'last'")
    show.add_argument("--store", type=Path, help="the store folder (default: $KILN_STORE, else ~/.cache/kiln)")
    show.add_argument("--html", type=Path, nargs="?", const=Path("report.html"), help="write the run's report to this file")
    show.add_argument("--format", choices=("json", "md"), help="print the run's short summary (as engine run --summary writes it)")
    compare = sub.add_parser("compare", help="what changed between two runs: workflow, versions, host, candidates, metrics, choice")
    compare.add_argument("run_a")
    compare.add_argument("run_b")
    compare.add_argument("--all-metrics", action="store_true", help="every metric that changed, not only those with an interval")
    compare.add_argument("--store", type=Path, help="the store folder (default: $KILN_STORE, else ~/.cache/kiln)")

    olive = sub.add_parser("import-olive", help="translate a Microsoft Olive config into a workflow; list what is not carried over")
    olive.add_argument("config", type=Path)
    olive.add_argument("--output", "-o", type=Path, help="the workflow file to write (default: print it)")
    schema = sub.add_parser("schema", help="print the workflow JSON Schema (for editors); --summary: the run summary's")
    schema.add_argument("--summary", action="store_true", help="the JSON Schema of `engine run --summary FILE.json`")
    for kind in ("passes", "evaluators", "targets", "data"):
        what = "data sources" if kind == "data" else kind
        extra = " (with the execution providers usable here), or a workflow's targets' availability" if kind == "targets" else ""
        listing = sub.add_parser(kind, help=f"list the {what}, or show one's options{extra}")
        listing.add_argument("name", nargs="?", help="a workflow file for `targets`" if kind == "targets" else None)
    return parser


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a run as Ctrl-C does: workers killed, store consistent


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return EXIT_OK
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _dispatch(args)
    except BrokenPipeError:
        return exits.closed_pipe()
    except InputError as error:
        print(display.wrap(str(error)), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("\ninterrupted: finished jobs are in the store; run the same command again to resume.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KilnError as error:
        if _store_damaged(error):
            print(f"error: the store is damaged: {error}\nrun `engine verify --repair` (then the command again)", file=sys.stderr)
            return EXIT_STORE_DAMAGED
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as error:  # noqa: BLE001 - the one place an engine bug is caught: to say so
        return exits.report_bug(error)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _store_damaged(error: KilnError) -> bool:
    from engine.store.store import StoreDamaged  # loaded already when the store raised it

    return isinstance(error, StoreDamaged)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        return run_command(args, _cmd_run, recorded)
    if args.command == "optimize":  # the workflow written and checked, then run as `engine run` runs it
        args.workflow = optimize_options.prepare(args)
        return _cmd_run(args) if args.workflow else EXIT_OK
    if args.command == "validate":
        return _cmd_validate(args)
    if args.command == "plan":
        return _cmd_plan(args)
    if args.command == "verify":
        return _cmd_verify(args)
    if args.command == "doctor":
        from engine.cli.doctor import print_doctor

        print_doctor(_plain_store_root(args))
        return EXIT_OK
    if args.command in ("runs", "show", "compare"):
        from engine.report.history_view import command

        command(args, _plain_store_root(args))
        return EXIT_OK
    if args.command == "import-olive":
        from engine.olive.cli import import_command

        return import_command(args.config, args.output)
    if args.command == "schema":
        from engine.cli.schema_doc import full_schema
        from engine.report.summary import schema

        print(json.dumps(schema() if args.summary else full_schema(), indent=2))
        return EXIT_OK
    return _cmd_list(args.command, args.name)


def _store_dir(args: argparse.Namespace, resolved: Any) -> Path:
    from engine.workflow import default_store_dir

    return args.store.resolve() if getattr(args, "store", None) else default_store_dir(resolved)


def _open_store(args: argparse.Namespace, resolved: Any) -> Any:
    """The store, created when new; a folder that cannot be one is bad input (exit 2)."""
    from engine.store.store import Store

    root = _store_dir(args, resolved)
    try:
        return Store(root).ensure()
    except OSError as error:
        where = "--store" if getattr(args, "store", None) else "cache.dir (or $KILN_STORE)"
        raise InputError(
            [
                Problem(
                    where=where,
                    message=f"cannot be used as the artifact store: {error.strerror or error}",
                    expected="a folder Kiln can create and write",
                    given=str(root),
                    hint="point --store at a writable folder",
                )
            ]
        ) from error


def _make_output(output: Path) -> None:
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(
            [
                Problem(
                    where="--output",
                    message=f"cannot be created: {error.strerror or error}",
                    expected="a folder Kiln can create and write",
                    given=str(output),
                    hint="choose another --output (or output.dir)",
                )
            ]
        ) from error


def _cmd_validate(args: argparse.Namespace) -> int:
    from engine.workflow import load_workflow

    code = EXIT_OK
    for file in args.workflows:
        try:
            resolved = load_workflow(file)
        except InputError as error:
            from engine.olive.cli import olive_hint

            print(display.wrap(str(error) + olive_hint(file)), file=sys.stderr)
            code = EXIT_BAD_INPUT
            continue
        notes = resolved.input.notes + _environments(args, resolved)  # a Hub model to download, ...
        skipped = [f"{t.id} ({t.availability.reason})" for t in resolved.targets.values() if not t.availability.ok]
        note = f"; targets unavailable here: {', '.join(skipped)}" if skipped else ""
        print(f"{file}: valid ({len(resolved.steps)} steps, {len(resolved.targets)} targets, {len(resolved.evaluators)} evaluations){note}")
        for line in notes:
            print(f"  {line}")
        _print_code(resolved)
    return code


def _environments(args: argparse.Namespace, resolved: Any) -> list[str]:
    """Find the environments the workflow declares, without building any (engine run does):
    targets in a built one are checked there; the notes name those not built yet."""
    from engine.execute.environments import prepare

    if not any(getattr(t.instance.config, "environment", None) for t in resolved.targets.values()) and not any(
        s.environment for s in resolved.steps.values()
    ):
        return []
    return prepare(resolved, _store_dir(args, resolved), build=False)


def _print_code(resolved: Any) -> None:
    """Every piece of code the workflow runs: a workflow file is as powerful as code."""
    from engine.workflow.code import code_of

    uses = code_of(resolved)
    if uses:
        print(f"  runs code from {len(uses)} file{'s' if len(uses) != 1 else ''} (with your rights, in worker processes):")
        for use in uses:
            print(f"    {use.render()}")


def _cmd_plan(args: argparse.Namespace) -> int:
    from engine.report.plan_status import explain_plan
    from engine.report.report import print_plan
    from engine.store.store import Store
    from engine.workflow import load_workflow

    resolved = load_workflow(args.workflow)
    _print_code(resolved)
    for line in resolved.input.notes + _environments(args, resolved):
        print(line)
    store = Store(_store_dir(args, resolved), read_only=True)  # a plan reads the store, never creates or writes it
    print_plan(explain_plan(resolved, store), explain_misses=args.explain)
    return EXIT_OK


def _plain_store_root(args: argparse.Namespace) -> Path:
    """The store a command without a workflow uses: --store, else $KILN_STORE, else ~/.cache/kiln."""
    if args.store:
        return Path(args.store)
    if os.environ.get("KILN_STORE"):
        return Path(os.environ["KILN_STORE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kiln"


def _cmd_verify(args: argparse.Namespace) -> int:
    from engine.store.store import Store
    from engine.store.verify import verify_store

    root = _plain_store_root(args)
    if not (root / "objects").is_dir() and not (root / "keys").is_dir():
        raise InputError([Problem(where="--store", message="is not a Kiln store (no objects/ or keys/ folder)", given=str(root))])
    report = verify_store(Store(root), repair=args.repair)
    for digest, why in report.bad_objects.items():
        print(f"object {digest}: {why}")
    for key, why in report.bad_records.items():
        print(f"record {key}: {why}")
    print(
        f"{root}: {report.objects_ok} objects and {report.records_ok} records verified; "
        f"{len(report.bad_objects)} damaged objects, {len(report.bad_records)} bad records"
    )
    if report.removed:
        print(f"repaired: removed {len(report.removed)} entries; the next run recomputes them")
        return EXIT_OK
    if not report.clean:
        print("run `engine verify --repair` to remove them")
    return EXIT_OK if report.clean else EXIT_NO_CHOICE


def _cmd_run(args: argparse.Namespace) -> int:
    from engine.execute.prestart import preload_if_new, prestarted

    with prestarted(args.workers if args.executor == "local" else 0):  # workers load Python and the engine meanwhile
        from engine.execute.outdir import check_output_dir
        from engine.olive.cli import olive_file, run_path
        from engine.workflow import load_workflow

        try:
            resolved = load_workflow(run_path(args.workflow) if olive_file(args.workflow) else args.workflow)
            output = args.output or Path(resolved.spec.output.dir or os.path.join("out", resolved.name))
            check_output_dir(output)
            store = _open_store(args, resolved)
        except KilnError as error:  # refused before it began: CI's summary still says why
            refused(summary_target(args), Path(args.workflow), error, EXIT_STORE_DAMAGED if _store_damaged(error) else EXIT_BAD_INPUT)
            raise
        preload_if_new(resolved, store)  # then the rest of the engine loads here while the workers import
        from engine.execute.hooks import EventLog, Fanout
        from engine.report.emit import write_outputs
        from engine.report.progress import live_progress
        from engine.report.report import Progress, console, print_summary
        from engine.run import run_workflow

        _make_output(output)
        if args.workers is not None and args.workers < 1:
            raise InputError([Problem(where="--workers", message="needs at least one worker", given=str(args.workers), hint="--workers 1")])
        executor = None
        if args.executor == "ray":
            from engine.execute.ray_executor import RayExecutor

            executor = RayExecutor(store.ensure(), address=args.ray_address or os.environ.get("RAY_ADDRESS"), targets=resolved)
        live = None if args.quiet or not console.is_terminal else live_progress(console, resolved)  # CI logs keep lines

        def execute() -> int:
            with EventLog(output / "events.jsonl") as events, live or contextlib.nullcontext():
                hooks = Fanout(events, live or Progress(quiet=args.quiet))
                report = run_workflow(
                    resolved, store, hooks, executor=executor, workers=args.workers, exclusive_timing=not args.overlap_timing
                )
            write_outputs(report, output)
            print_summary(report)
            runnable = [t for t in resolved.targets.values() if t.availability.ok]
            chosen = report.chosen()
            return EXIT_OK if runnable and all(t.id in chosen for t in runnable) else EXIT_NO_CHOICE

        return recorded(store, resolved, output, execute, summary=summary_target(args))


def _cmd_list(kind: str, name: str | None) -> int:
    from engine import registry
    from engine.report.report import print_host_reports, print_plugin, print_plugins, print_target_availability

    registry_kind = "datasources" if kind == "data" else kind
    if kind == "targets" and name is not None and (name.endswith((".yaml", ".yml", ".json")) or Path(name).is_file()):  # a workflow
        from engine.workflow import load_workflow

        print_target_availability(load_workflow(Path(name)))
        return EXIT_OK
    if name is None:
        print_plugins(registry_kind)
        if kind == "targets":
            print_host_reports()
        return EXIT_OK
    try:
        cls = registry.load(registry_kind, name)
    except registry.UnknownPlugin as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print_plugin(registry_kind, cls)
    if kind == "targets":
        print_host_reports(name)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
