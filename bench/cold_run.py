"""Cold-run wall time of a workflow, and where it went.

    python bench/cold_run.py [WORKFLOW] [--runs N] [--one-shot] [--workers N]

Runs ``engine run`` N times (3 by default), each from an empty store (a fresh temporary
``KILN_STORE``), then once more warm on the last run's store, as the CLI runs them, and prints per
run the wall time and, from its events.jsonl, where the time went: the engine's start until the
first job, each dataset / pass / evaluation job (start to end, and what the worker measured
itself for passes), the idle gaps between jobs and the end (outputs, report). Then the median of
the cold runs and the warm run. ``--one-shot`` sets ``KILN_POOL=0`` (a fresh worker process per
job, no warm pool) for comparison. The default workflow is bench/workflows/minilm-ov-nncf.yaml,
the job Olive took 37 s for on the same 2-core machine (median of 3 cold runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _engine import engine_run

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "bench" / "workflows" / "minilm-ov-nncf.yaml"
STARTS = {"dataset_start": "name", "job_start": "job", "eval_start": "evaluation"}
ENDS = {"dataset_end": "name", "job_end": "job", "eval_end": "evaluation"}


def spans(events: list[dict[str, Any]]) -> list[tuple[str, float, float, Any]]:
    """(label, start, end, seconds the worker reported) of every job that ran, in start order."""
    open_: dict[str, float] = {}
    found = []
    for event in events:
        kind = event["event"]
        if kind in STARTS:
            label = f"{kind.split('_')[0]} {event.get('candidate', '')} {event[STARTS[kind]]}".replace("  ", " ")
            open_[label] = event["t"]
        elif kind in ENDS:
            label = f"{kind.split('_')[0]} {event.get('candidate', '')} {event[ENDS[kind]]}".replace("  ", " ")
            if label in open_:
                found.append((label, open_.pop(label), event["t"], event.get("seconds")))
    return sorted(found, key=lambda span: span[1])


def breakdown(started: float, ended: float, events: list[dict[str, Any]]) -> list[str]:
    jobs = spans(events)
    if not jobs:
        return ["  (nothing ran: everything came from the store)"]
    lines = [f"  {'start → first job':<44} {jobs[0][1] - started:6.2f} s"]
    busy_until = jobs[0][1]
    idle = 0.0
    for label, start, end, seconds in jobs:
        idle += max(0.0, start - busy_until)
        busy_until = max(busy_until, end)
        own = f"  (worker: {seconds:.2f} s)" if isinstance(seconds, (int, float)) else ""
        lines.append(f"  {label:<44} {end - start:6.2f} s  at {start - started:6.2f}{own}")
    lines.append(f"  {'idle between jobs':<44} {idle:6.2f} s")
    lines.append(f"  {'last job → exit (outputs, report)':<44} {ended - busy_until:6.2f} s")
    for event in events:  # what was measured, to compare pooled and one-shot workers
        if event["event"] == "candidate_end" and event.get("metrics"):
            shown = {k: v for k, v in event["metrics"].items() if k in ("latency.p50_ms", "latency.others_cores", "fidelity.cosine_mean")}
            lines.append(f"  candidate {event['candidate']}: {shown}")
    return lines


def timings(out: Path) -> list[str]:
    """Per candidate timed: its speedup's interval, rounds and why its timing stopped (candidates.json)."""
    path = out / "candidates.json"
    if not path.is_file():
        return []
    lines = []
    for record in json.loads(path.read_text())["candidates"]:
        intervals = record.get("intervals") or {}
        for name, evaluation in (record.get("evaluations") or {}).items():
            details = evaluation.get("details") or {}
            if "stopped_because" not in details:
                continue
            ratio = next((intervals[f"{name}.{k}"] for k in ("speedup", "decode_speedup") if f"{name}.{k}" in intervals), None)
            shown = f"{ratio['estimate']:.3f}x [{ratio['low']:.3f}, {ratio['high']:.3f}]" if ratio else "(the reference)"
            chosen = "  (chosen)" if record.get("chosen") else ""
            lines.append(
                f"  timing {record['id']} {name}: {shown} in {details.get('rounds')} rounds, {details.get('sessions')} sessions: "
                f"{details['stopped_because']}{chosen}"
            )
    return lines


def one_run(workflow: Path, store: Path, out: Path, extra: list[str]) -> tuple[float, list[str]]:
    started = time.time()
    wall, _ = engine_run(workflow, store, out, *extra)
    ended = started + wall
    events_file = out / "events.jsonl"
    events = [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.is_file() else []
    return wall, breakdown(started, ended, events) + timings(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workflow", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--runs", type=int, default=3, help="cold runs, each from an empty store")
    parser.add_argument("--one-shot", action="store_true", help="KILN_POOL=0: a fresh worker process per job")
    parser.add_argument("--workers", type=int, default=None, help="passed on as --workers")
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the runs' stores and outputs in this folder (default: a temporary one)"
    )
    args = parser.parse_args()
    if args.one_shot:
        os.environ["KILN_POOL"] = "0"
    extra = [] if args.workers is None else ["--workers", str(args.workers)]
    colds: list[float] = []
    with contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory(prefix="kiln-cold-") as tmp:
        for index in range(args.runs):
            store = Path(tmp) / f"store{index}"
            wall, lines = one_run(args.workflow, store, Path(tmp) / f"out{index}", extra)
            colds.append(wall)
            print(f"cold run {index + 1}: {wall:.2f} s wall", *lines, sep="\n", flush=True)
        warm, lines = one_run(args.workflow, store, Path(tmp) / "out-warm", extra)
        print(f"warm re-run: {warm:.2f} s wall", *lines, sep="\n")
    mode = "one-shot workers" if args.one_shot else "warm pool"
    print(
        f"\n{args.workflow.name} ({mode}): cold median {statistics.median(colds):.2f} s over {len(colds)} runs "
        f"({', '.join(f'{c:.1f}' for c in colds)}), warm re-run {warm:.2f} s"
    )


if __name__ == "__main__":
    main()
