"""A fleet of workflows that share a job, run as one pool against one after another.

    python bench/fleet.py [--workflows A.yaml B.yaml ...] [--step export] [--rounds 1] [--workers N]

By default the three workflows of ``bench/workflows/fleet/``: all-MiniLM-L6-v2 exported the same
way in each (the shared job), then dynamic INT8 (two configs), BERT fusion, or OpenVINO
conversion, each sized only, so the run is mostly passes. Every mode starts from an empty store:

- fleet: ``engine run A B C --store S`` (one pool over one store: a job two workflows share runs
  once, the others take its record);
- one after another, separate stores: ``engine run A --store S1``, then B over S2, then C over S3
  (what running them apart costs: the shared job runs in each);
- one after another, one store: ``engine run A --store S``, then B, then C (the store serves the
  shared job to the later ones, but nothing runs at once across workflows).

Each figure is the wall time of the ``engine`` processes (their start included), and how often
``--step`` ran, counted from every workflow's ``events.jsonl`` (``job_end`` lines with status
``ran``: a store hit or a job another workflow of the fleet ran says ``hit``/``shared``). Rounds
rotate which mode goes first.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _records import read_events, step_runs  # noqa: E402

DEFAULT = sorted((ROOT / "bench" / "workflows" / "fleet").glob("*.yaml"))
MODES = ("fleet", "apart", "in turn")
TITLES = {"fleet": "fleet, one store", "apart": "one after another, separate stores", "in turn": "one after another, one store"}


def _engine(args: list[str], extra: list[str]) -> None:
    command = [sys.executable, "-m", "engine", "run", *args, *extra]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")


def run_mode(mode: str, workflows: list[Path], step: str, extra: list[str]) -> dict[str, Any]:
    """One mode from empty stores in a temporary folder: wall time and the step's runs."""
    with tempfile.TemporaryDirectory(prefix="kiln-fleet-") as tmp:
        out = Path(tmp) / "out"
        started = time.perf_counter()
        if mode == "fleet":
            _engine([*map(str, workflows), "--store", f"{tmp}/store", "--output", str(out)], extra)
        else:
            for i, workflow in enumerate(workflows):
                store = f"{tmp}/store{i}" if mode == "apart" else f"{tmp}/store"
                _engine([str(workflow), "--store", store, "--output", str(out / f"{i}-{workflow.stem}")], extra)
        wall = time.perf_counter() - started
        logs = sorted(out.glob("*/events.jsonl"))
        events = [e for log in logs for e in read_events(log)]
    passes = sum(1 for e in events if e.get("event") == "job_end" and e.get("status") == "ran")
    return {
        "mode": mode,
        "wall_s": wall,
        "step_runs": step_runs(events, step),
        "passes": passes,
        "logs": len(logs),
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workflows", type=Path, nargs="+", default=DEFAULT, help="the workflows (default: bench/workflows/fleet/)")
    parser.add_argument("--step", default="export", help="the step they share, whose runs are counted")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, help="passed to every engine run (default: the engine's own)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args()
    workflows = [w.resolve() for w in args.workflows]
    extra = ["--workers", str(args.workers)] if args.workers else []
    print("$ python bench/fleet.py " + shlex.join(sys.argv[1:]))
    print(f"host: {os.cpu_count()} CPU cores; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("workflows: " + ", ".join(_shown(w) for w in workflows) + f"; shared step: {args.step}")
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes}
    for round_ in range(args.rounds):
        shift = round_ % len(args.modes)
        for mode in args.modes[shift:] + args.modes[:shift]:
            run = run_mode(mode, workflows, args.step, extra)
            runs[mode].append(run)
            print(
                f"round {round_ + 1}: {TITLES[mode]}: {run['wall_s']:.1f} s; {args.step} ran {run['step_runs']}x, "
                f"{run['passes']} pass jobs ran in all ({run['logs']} events.jsonl; load average {run['load']:.1f})",
                flush=True,
            )
    _summary(runs, args.step)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _summary(runs: dict[str, list[dict[str, Any]]], step: str) -> None:
    wall = {mode: statistics.median(r["wall_s"] for r in found) for mode, found in runs.items()}
    base = wall.get("fleet")
    print(f"{'mode':<36} {'wall s':>8} {'vs fleet':>9} {step + ' ran':>12}")
    for mode, value in wall.items():
        ratio = f"{value / base:.2f}x" if base else "-"
        print(f"{TITLES[mode]:<36} {value:>8.1f} {ratio:>9} {runs[mode][-1]['step_runs']:>12}")


if __name__ == "__main__":
    main()
