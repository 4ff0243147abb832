"""What a run's records say, for the benchmarks: jobs per node, and how often a step ran.

Both read ``events.jsonl`` lines (engine/execute/hooks.py): ``job_node`` / ``eval_node`` lines
name the node each pass and evaluation ran on; ``job_end`` lines say whether a pass ``ran`` here,
came from the store (``hit``) or from another workflow of the fleet (``shared``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def read_events(path: Path) -> list[dict[str, Any]]:
    """The lines of one ``events.jsonl``."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def jobs_per_node(events: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How many jobs (passes and evaluations) ran on each node, by the node's label, sorted."""
    counts = Counter(e["node"].get("label") or e["node"].get("host") or "?" for e in events if e.get("event") in ("job_node", "eval_node"))
    return dict(sorted(counts.items()))


def step_runs(events: Iterable[dict[str, Any]], step: str) -> int:
    """How many of ``step``'s jobs ran (not from the store, not another workflow's)."""
    return sum(
        1
        for e in events
        if e.get("event") == "job_end" and e.get("status") == "ran" and (e["job"] == step or str(e["job"]).startswith(step + "("))
    )


def spread(counts: dict[str, int]) -> str:
    """``node_1 12 · node_2 11``: each node's job count."""
    return " · ".join(f"{label} {count}" for label, count in counts.items()) or "no node recorded"
