"""Does the choice survive a busy machine? The same workflow, each run from a clean store, on a
quiet machine and beside a CPU hog, alternating (quiet, loaded, quiet, ...).

    python bench/noise.py [WORKFLOW] [--runs N] [--hogs K]

For every run it prints the chosen model's digest, its speedup over the reference with the
interval, the verdict, and how busy the machine was while timing (other processes' cores); then
whether all runs chose the same model bytes (or why not: a difference the tie rule explains is
named), and the chosen speedup on loaded runs relative to quiet ones (goal: within ±10%).

The hog is ``K`` busy-loop child processes (default 1: one of this kind of machine's two cores),
started before the run and stopped after it by this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _engine import engine_run

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def hogs(count: int) -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def run_once(workflow: Path, folder: Path, loaded: bool, hog_count: int) -> dict[str, Any]:
    store, out = folder / "store", folder / "out"
    with hogs(hog_count if loaded else 0):
        wall, _ = engine_run(workflow, store, out)
    records = json.loads((out / "candidates.json").read_text())["candidates"]
    chosen = [c for c in records if c["chosen"]]
    timed = [c for c in records if "latency" in (c.get("evaluations") or {}) and c["evaluations"]["latency"].get("details")]
    others = [c["evaluations"]["latency"]["details"]["noise"]["others_cores_mean"] for c in timed]
    loaded_evals = sum(1 for c in records if c.get("measured_under_load"))
    row: dict[str, Any] = {"loaded": loaded, "wall_s": wall, "others_cores": statistics.median(others) if others else 0.0}
    row["loaded_timings"] = loaded_evals
    row["timings"] = len(timed)
    if chosen:
        c = chosen[0]
        interval = (c.get("intervals") or {}).get("latency.speedup") or {}
        row |= {
            "candidate": c["id"],
            "path": c["path"],
            "digest": c["model_digest"],
            "speedup": c["metrics"].get("latency.speedup"),
            "low": interval.get("low"),
            "high": interval.get("high"),
            "verdict": c.get("verdict"),
            "tied_with": c.get("tied_with") or [],
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workflow", nargs="?", type=Path, default=ROOT / "bench" / "workflows" / "noise.yaml")
    parser.add_argument("--runs", type=int, default=3, help="runs per condition (quiet and loaded)")
    parser.add_argument("--hogs", type=int, default=1, help="busy-loop processes beside a loaded run")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-noise-") as tmp:
        for index in range(2 * args.runs):
            loaded = index % 2 == 1
            row = run_once(args.workflow.resolve(), Path(tmp) / str(index), loaded, args.hogs)
            rows.append(row)
            interval = f"[{row['low']:.2f}, {row['high']:.2f}]" if row.get("low") is not None else ""
            print(
                f"run {index + 1} {'loaded' if loaded else 'quiet '}: chose {row.get('candidate', '—')} ({row.get('path', '')}) "
                f"digest {str(row.get('digest'))[:12]} speedup {row.get('speedup') or float('nan'):.2f}x {interval} · "
                f"others {row['others_cores']:.2f} cores · {row['loaded_timings']}/{row['timings']} timings flagged loaded · "
                f"wall {row['wall_s']:.0f} s",
                flush=True,
            )
            if row.get("verdict"):
                print(f"      why: {row['verdict']}", flush=True)
    digests = {row.get("digest") for row in rows}
    print()
    print(f"same model bytes: {sum(1 for r in rows if r.get('digest') == rows[0].get('digest'))} of {len(rows)} runs")
    if len(digests) > 1:
        for row in rows:
            if row.get("digest") != rows[0].get("digest"):
                print(f"  differs: {row.get('candidate')} ({row.get('path')}); tied with {row.get('tied_with')}: {row.get('verdict')}")
    quiet = [r["speedup"] for r in rows if not r["loaded"] and r.get("speedup")]
    busy = [r["speedup"] for r in rows if r["loaded"] and r.get("speedup")]
    if quiet and busy:
        ratio = statistics.median(busy) / statistics.median(quiet)
        verdict = "within" if abs(ratio - 1) <= 0.10 else "OUTSIDE"
        print(
            f"chosen speedup: quiet median {statistics.median(quiet):.3f}x, loaded median {statistics.median(busy):.3f}x, "
            f"loaded/quiet {ratio:.3f} ({verdict} ±10%)"
        )


if __name__ == "__main__":
    main()
