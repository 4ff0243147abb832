"""--workers 2 against --workers 1 on pass-heavy work (one MiniLM export, eight INT8 passes).

    python bench/workers.py [WORKFLOW] [--rounds N]

Each round runs the workflow cold (a fresh store) with 1 worker and with 2, alternating which
goes first, and prints the wall times; the summary gives the medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from _engine import engine_run

ROOT = Path(__file__).resolve().parents[1]


def cold_run(workflow: Path, workers: int) -> float:
    with tempfile.TemporaryDirectory(prefix="kiln-workers-") as tmp:
        wall, _ = engine_run(workflow, f"{tmp}/store", f"{tmp}/out", "--workers", str(workers), ok=(0,))
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workflow", nargs="?", type=Path, default=ROOT / "bench" / "workflows" / "minilm-passes.yaml")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    walls: dict[int, list[float]] = {1: [], 2: []}
    for round_ in range(args.rounds):
        for workers in (1, 2) if round_ % 2 == 0 else (2, 1):
            walls[workers].append(cold_run(args.workflow, workers))
            print(f"round {round_ + 1}: --workers {workers}: {walls[workers][-1]:.1f} s", flush=True)
    one, two = statistics.median(walls[1]), statistics.median(walls[2])
    print(f"median wall: --workers 1 {one:.1f} s · --workers 2 {two:.1f} s · ratio {one / two:.2f}x")


if __name__ == "__main__":
    main()
