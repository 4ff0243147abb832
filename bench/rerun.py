"""Warm re-run time and the engine's overhead over the passes' and evaluations' own time.

    python bench/rerun.py [WORKFLOW] [--rounds N]

1. A cold run into a fresh store: wall time vs the time the passes and evaluations report for
   themselves (measured inside the workers); the difference is the engine's overhead (planning,
   hashing, worker start-up, records, outputs).
2. N warm re-runs of the same workflow (everything from the cache), as the CLI runs them: wall
   times, median, and how many passes / evaluations ran (must be 0).
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
from pathlib import Path

from _engine import engine_run

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"passes: (\d+) run \(([\d.]+) s\), (\d+) cached · evaluations: (\d+) run \(([\d.]+) s\), (\d+) cached")


def summarized_run(workflow: Path, store: Path, out: Path) -> tuple[float, tuple[int, float, int, int, float, int]]:
    wall, done = engine_run(workflow, store, out)
    match = SUMMARY.search(done.stdout)
    if match is None:
        raise SystemExit(f"engine run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    groups = match.groups()
    return wall, (int(groups[0]), float(groups[1]), int(groups[2]), int(groups[3]), float(groups[4]), int(groups[5]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workflow", nargs="?", type=Path, default=ROOT / "workflows" / "bert-cpu.yaml")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        store, out = Path(tmp) / "store", Path(tmp) / "out"
        cold_wall, (p_run, p_s, _, e_run, e_s, _) = summarized_run(args.workflow, store, out)
        own = p_s + e_s
        print(f"workflow: {args.workflow.name}")
        print(f"cold run: wall {cold_wall:.1f} s · {p_run} passes ({p_s:.1f} s) + {e_run} evaluations ({e_s:.1f} s) = {own:.1f} s of work")
        print(
            f"engine overhead (wall - work): {cold_wall - own:.1f} s ({(cold_wall - own) / cold_wall:.0%} of wall; {(cold_wall - own) / max(p_run + e_run, 1):.2f} s per job)"
        )
        warm = []
        for _ in range(args.rounds):
            wall, (p_run, _, p_hit, e_run, _, e_hit) = summarized_run(args.workflow, store, out)
            if p_run or e_run:
                raise SystemExit(f"a warm re-run ran {p_run} passes and {e_run} evaluations; expected none")
            warm.append(wall)
        print(
            f"warm re-runs ({args.rounds}): {', '.join(f'{w:.2f}' for w in warm)} s · median {statistics.median(warm):.2f} s · 0 passes and 0 evaluations run, {p_hit} + {e_hit} from the cache"
        )


if __name__ == "__main__":
    main()
