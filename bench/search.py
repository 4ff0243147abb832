"""Grid vs random vs TPE on one space over all-MiniLM-L6-v2 (25 points by default).

    python bench/search.py [WORKFLOW] [--budget N] [--seeds 0 1 2 ...]

1. The grid runs the whole space cold, in a fresh store: every pass and every evaluation is
   measured once. Its chosen candidate is "the grid's best".
2. random and tpe then run against the same store, with a budget of N candidates. Each point
   they propose is answered from what the grid measured, so all three see one landscape (on a
   noisy 2-core machine, re-measuring would compare noise). For each: how many candidates it
   evaluated before it had the grid's best, and the cold cost of the candidates it proposed up
   to then (the passes' and evaluations' own seconds, as the grid measured them, each shared
   job counted once). Several points often sit within noise of the best, so it also reports
   when each sampler first had a feasible candidate within 5% of the best objective.
3. The goal: TPE has the grid's best within 30% of the grid's evaluations (the space's size),
   averaged over the seeds. With the default budget (the whole space) every sampler gets there,
   since none proposes a point twice, so the mean is over every seed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.run import run_workflow  # noqa: E402
from engine.select.results import RunReport  # noqa: E402
from engine.store.store import Store  # noqa: E402
from engine.workflow import load_workflow  # noqa: E402


def with_search(workflow: Path, folder: Path, **search: object) -> Path:
    document = yaml.safe_load(workflow.read_text())
    document["search"] = {**document.get("search", {}), **search}
    out = folder / f".bench-{search['sampler']}-{search.get('seed', 0)}.yaml"
    out.write_text(yaml.safe_dump(document, sort_keys=False))
    return out


def job_costs(report: RunReport, store: Store) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Per candidate (by params), the keys of its jobs and evaluations; per key, the seconds it
    took when first measured. A prefix of candidates costs the union of its keys, each once."""
    keys: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}
    for result in report.results:
        own = [report.jobs[j].key for j in result.candidate.jobs if report.jobs[j].key] + list(result.eval_keys.values())
        keys[repr(result.candidate.params)] = [k for k in own if k]
        for key in own:
            if key:
                seconds[key] = float((store.lookup(key) or {}).get("duration_s") or 0.0)
    return keys, seconds


def prefix_cost(order: list[str], keys: dict[str, list[str]], seconds: dict[str, float]) -> float:
    seen = {k for params in order for k in keys.get(params, [])}
    return sum(seconds.get(k, 0.0) for k in seen)


def _within(value: float, best: float, goal: str, tolerance: float) -> bool:
    return value <= best * (1 + tolerance) if goal == "min" else value >= best * (1 - tolerance)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workflow", nargs="?", type=Path, default=ROOT / "bench" / "workflows" / "minilm-search.yaml")
    parser.add_argument("--budget", type=int, default=None, help="candidates per sampler run (default: the space's size)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-search-") as tmp:
        folder = Path(tmp)
        store = Store(folder / "store")
        workflow = args.workflow.resolve()
        # workflows refer to data relative to themselves: keep the copies beside the original
        local = workflow.parent
        try:
            started = time.perf_counter()
            grid = run_workflow(load_workflow(with_search(workflow, local, sampler="grid")), store, workers=1)
            grid_wall = time.perf_counter() - started
            best = next(r for r in grid.results if r.chosen)
            objective = grid.resolved.spec.select.primary.metric
            keys, seconds_of = job_costs(grid, store)
            grid_order = [repr(r.candidate.params) for r in grid.results]
            print(
                f"space: {len(grid.results)} points · grid wall {grid_wall:.0f} s cold · {grid.stats.passes_run} passes, {grid.stats.evals_run} evaluations"
            )
            print(f"grid's best: {best.label} · {objective} = {best.metrics[objective]:.2f}")
            at = grid.results.index(best) + 1
            print(f"grid: reached it after {at} candidates, {prefix_cost(grid_order[:at], keys, seconds_of):.0f} s of work")
            goal = grid.resolved.spec.select.primary.goal
            near = {
                repr(r.candidate.params)
                for r in grid.results
                if r.feasible and objective in r.metrics and _within(r.metrics[objective], best.metrics[objective], goal, 0.05)
            }
            at_near = next(i for i, p in enumerate(grid_order, 1) if p in near)
            # points as good as the best (the same value: two settings can make the same model)
            equal = {repr(r.candidate.params) for r in grid.results if r.feasible and r.metrics.get(objective) == best.metrics[objective]}
            models = len({r.model.digest for r in grid.results if r.model is not None})
            print(
                f"{len(equal)} point(s) score exactly the best's value (settings that make the same model); {models} distinct models in all"
            )
            print(f"within 5% of the best (and feasible): {len(near)} candidates; the grid met one after {at_near} candidates")
            budget = args.budget or len(grid.results)
            for sampler in ("random", "tpe"):
                needed, seconds, found = [], [], 0
                near_needed: list[int] = []
                for seed in args.seeds:
                    path = with_search(workflow, local, sampler=sampler, max_candidates=budget, seed=seed)
                    report = run_workflow(load_workflow(path), store, workers=1)  # one point at a time: what each proposal learned
                    order = [repr(r.candidate.params) for r in report.results]
                    target = next((p for p in order if p in equal), None) or repr(best.candidate.params)
                    hit = next((i for i, p in enumerate(order, 1) if p in near), None)
                    if hit is not None:
                        near_needed.append(hit)
                    if target in order:
                        found += 1
                        index = order.index(target) + 1
                        needed.append(index)
                        seconds.append(prefix_cost(order[:index], keys, seconds_of))
                reached = (
                    f"median {statistics.median(needed):.0f} candidates ({', '.join(map(str, needed))}), {statistics.median(seconds):.0f} s of work"
                    if needed
                    else "never"
                )
                print(f"{sampler}: found the grid's best in {found}/{len(args.seeds)} seeds within {budget} candidates · {reached}")
                if found == len(args.seeds):
                    mean = statistics.mean(needed)
                    share = mean / len(grid.results)
                    print(
                        f"{sampler}: mean {mean:.1f} candidates to the grid's best = {share:.0%} of the grid's {len(grid.results)}"
                        + (f" (goal <= 30%: {'met' if share <= 0.30 else 'NOT met'})" if sampler == "tpe" else "")
                    )
                print(
                    f"{sampler}: met a within-5% candidate in {len(near_needed)}/{len(args.seeds)} seeds · after {', '.join(map(str, near_needed)) or '-'} candidates"
                )
        finally:
            for file in local.glob(".bench-*.yaml"):
                file.unlink()


if __name__ == "__main__":
    main()
