"""Kiln against Hugging Face Optimum (optimum-onnx 0.1.0) on twelve architectures: export, INT8, speedup.

    python bench/architectures.py [--only ARCH ...] [--rounds 20] [--runs 10] [--threads 1]
                                  [--json PATH] [--keep] [--optimum-venv PATH]

Twelve random-weight transformers models (2 layers, hidden 128; Whisper and T5 at the tests'
d_model 64), saved with ``save_pretrained`` and no tokenizer files (bench/_architectures_setup.py):
bert, distilbert, roberta (text-classification), vit, resnet, convnext (image-classification),
whisper (automatic-speech-recognition), t5 (text2text-generation), llama, phi3, qwen2, gemma2
(text-generation). Each tool is asked for an FP32 ONNX export and an INT8 model for the CPU:

- Optimum: ``optimum-cli export onnx --model DIR --task TASK OUT`` (generative tasks with the
  ``-with-past`` suffix, which Optimum itself infers when no task is given), then
  ``optimum-cli onnxruntime quantize --onnx_model OUT --avx512_vnni|--avx2 -o OUT_INT8`` (dynamic
  INT8, per tensor; the flag from /proc/cpuinfo). It runs in its own environment (transformers 4).
- Kiln: ``engine optimize DIR --device cpu --precision int8 -o WF.yaml --store STORE -q``; the FP32
  model is the reference candidate's, the INT8 one the chosen candidate if it is INT8, else the
  fastest complete INT8 candidate (both read from the store by their digests).

Both tools' files are then timed by the same code (bench/_architectures_timing.py): onnxruntime CPU
sessions with ``--threads`` intra-op threads, synthetic feeds from each file's input signature
(batch 1, 32 new tokens, 32 past positions, pixel inputs of the model's size, Whisper's mel
features of its shape), warm-up runs, then FP32 and INT8 in interleaved rounds; the speedup is INT8
over the same tool's FP32, the median of per-round ratios with a 95% bootstrap interval
(``--sequence 1`` times one decode step of the generative models instead of a 32-token chunk). A model
of several files is timed as one pass through each file, summed (Optimum's merged decoder is left
out where the unmerged decoders it merges are there). A tool's failure is a row (its first error
line and exit code), never a crash of the bench.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # bench/, then Kiln's root
from _architectures_setup import ARCHITECTURES, ROOT, Architecture, cpu, ensure_optimum_venv, package_version  # noqa: E402
from _architectures_timing import first_error_line, interleaved, runner, shapes_for  # noqa: E402

TOOLS = ("optimum", "kiln")
#: what Optimum insists on beyond the model folder and the task, per architecture
OPTIMUM_EXTRA = {"whisper": ["--nb_max_frames", "48"]}  # its dummy audio is 3000 frames; the tiny Whisper takes 48
TIMEOUT_S = 1800


@dataclass
class Side:
    """One tool's outcome on one architecture."""

    tool: str
    export_ok: bool = False
    fp32_files: list[str] = field(default_factory=list)
    int8_ok: bool = False
    int8_files: list[str] = field(default_factory=list)
    exit_code: int | None = None
    error: str | None = None
    seconds: float = 0.0
    note: str = ""
    timing: dict[str, Any] | None = None
    timing_error: str | None = None
    fp32_paths: list[str] = field(default_factory=list)
    int8_paths: list[str] = field(default_factory=list)
    #: what the harness fed (batch, sequence, past, image side, mel bins and frames)
    shapes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    arch: str
    task: str
    sides: dict[str, Side] = field(default_factory=dict)


def _run(command: list[str], env: dict[str, str], log: Path, cwd: Path) -> tuple[int, str]:
    """Run ``command`` to its end (or the timeout), its output into ``log``; exit code and output."""
    try:
        done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        code, text = done.returncode, done.stdout + "\n" + done.stderr
    except subprocess.TimeoutExpired as expired:
        output = [part.decode(errors="replace") if isinstance(part, bytes) else part or "" for part in (expired.stdout, expired.stderr)]
        code, text = 124, f"timed out after {TIMEOUT_S} s\n{output[0]}{output[1]}"  # its output is bytes even with text=True
    log.write_text(f"$ {shlex.join(command)}\n{text}", encoding="utf-8")
    return code, text


def _onnx_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.onnx")) if folder.is_dir() else []


def timed_files(files: list[Path]) -> list[Path]:
    """The files one pass goes through: a merged decoder is left out beside the decoders it merges."""
    names = {f.name.replace("_quantized", "") for f in files}
    unmerged = {"decoder_model.onnx", "decoder_with_past_model.onnx"} <= names
    return [f for f in files if not (unmerged and "merged" in f.name)]


def isa_flag(host: dict[str, Any]) -> str:
    """Optimum's quantization preset for this host's CPU."""
    return "--avx512_vnni" if host["avx512_vnni"] else "--avx2"


def run_optimum(arch: Architecture, model: Path, work: Path, python: Path, isa: str) -> Side:
    """Optimum's export and dynamic INT8 of ``model`` in ``work``."""
    side, cli = Side("optimum"), str(python.parent / "optimum-cli")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    task = f"{arch.task}-with-past" if "generation" in arch.task or "speech" in arch.task else arch.task
    out, out_int8 = work / "optimum-fp32", work / "optimum-int8"
    extra = OPTIMUM_EXTRA.get(arch.name, [])
    side.note = f"--task {task}" + (f" {' '.join(extra)} (Optimum insists)" if extra else "")
    started = time.perf_counter()
    command = [cli, "export", "onnx", "--model", str(model), "--task", task, *extra, str(out)]
    code, text = _run(command, env, work / "optimum-export.log", work)
    fp32 = _onnx_files(out)
    side.export_ok, side.fp32_files = code == 0 and bool(fp32), [f.name for f in fp32]
    if not side.export_ok:
        side.exit_code, side.error = code, f"export: {first_error_line(text)}"
        side.seconds = time.perf_counter() - started
        return side
    command = [cli, "onnxruntime", "quantize", "--onnx_model", str(out), isa, "-o", str(out_int8)]
    code, text = _run(command, env, work / "optimum-quantize.log", work)
    side.seconds = time.perf_counter() - started
    int8 = _onnx_files(out_int8)
    side.int8_ok, side.int8_files = code == 0 and bool(int8), [f.name for f in int8]
    if not side.int8_ok:
        side.exit_code, side.error = code, f"quantize: {first_error_line(text)}"
        return side
    side.exit_code = 0
    side.fp32_paths = [str(f) for f in timed_files(fp32)]
    by_stem = {f.name.replace("_quantized", ""): f for f in int8}
    side.int8_paths = [str(by_stem[Path(f).name]) for f in side.fp32_paths if Path(f).name in by_stem]
    return side


def _speed(candidate: dict[str, Any]) -> float:
    """How fast a candidate measured against the reference: its speedup, else decode tokens per second."""
    metrics = candidate.get("metrics") or {}
    for name in ("latency.speedup", "generation.e2e_speedup", "generation.decode_speedup"):
        if isinstance(metrics.get(name), int | float):
            return float(metrics[name])
    return float("-inf")


def best_int8(candidates: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The chosen candidate if it is an INT8 one (not the FP32 reference), else the fastest complete INT8 one."""
    complete = [c for c in candidates if not c.get("reference") and c.get("state") == "complete" and c.get("model_digest")]
    chosen = [c for c in complete if c.get("chosen")]
    return chosen[0] if chosen else max(complete, key=_speed, default=None)


def run_kiln(model: Path, work: Path, store: Path) -> Side:  # long: the run, then what candidates.json says
    """``engine optimize`` on ``model``: its FP32 reference and best INT8 candidate, from the store."""
    from engine.store.store import Store

    side, out = Side("kiln"), work / "kiln-out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="160")
    command = [sys.executable, "-m", "engine", "optimize", str(model), "--device", "cpu", "--precision", "int8",
               "-o", str(work / "workflow.yaml"), "--store", str(store), "--output", str(out), "-q", "--force"]  # fmt: skip
    started = time.perf_counter()
    code, text = _run(command, env, work / "kiln.log", work)
    side.seconds, side.exit_code = time.perf_counter() - started, code
    records = out / "candidates.json"
    candidates = json.loads(records.read_text(encoding="utf-8"))["candidates"] if records.is_file() else []
    reference = next((c for c in candidates if c.get("reference") and c.get("model_digest")), None)
    objects = Store(store)
    if reference is None or reference.get("state") not in ("complete", "infeasible"):
        side.error = first_error_line(text) if code != 0 or not candidates else "no FP32 reference candidate"
        return side
    fp32 = _onnx_files(objects.object_path(reference["model_digest"]))
    side.export_ok, side.fp32_files = bool(fp32), [f.name for f in fp32]
    best = best_int8(candidates)
    int8 = _onnx_files(objects.object_path(best["model_digest"])) if best else []
    side.int8_ok, side.int8_files = bool(int8), [f.name for f in int8]
    if best is None:
        failed = [c for c in candidates if not c.get("reference")]
        why = next((s.get("error") for c in failed for s in c.get("steps") or [] if s.get("error")), None)
        side.error = f"no complete INT8 candidate ({len(failed)} tried): {str(why or first_error_line(text)).splitlines()[0][:300]}"
        return side
    chosen = "chosen" if best.get("chosen") else "fastest INT8 (the FP32 reference was chosen)"
    side.note = f"{best['path']} ({chosen}; {sum(1 for c in candidates if not c.get('reference'))} INT8 candidates)"
    side.fp32_paths = [str(f) for f in timed_files(fp32)]
    side.int8_paths = [str(f) for f in timed_files(int8)]
    if code not in (0, 1):
        side.error = first_error_line(text)
    return side


def time_side(side: Side, model: Path, args: argparse.Namespace) -> None:
    """FP32 against INT8 of one tool, by the shared harness; a file the harness cannot run is the row's timing error."""
    if not (side.fp32_paths and side.int8_paths):
        return
    if len(side.fp32_paths) != len(side.int8_paths):
        side.timing_error = f"{len(side.fp32_paths)} FP32 files but {len(side.int8_paths)} INT8 files"
        return
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    processor_file = model / "preprocessor_config.json"
    processor = json.loads(processor_file.read_text(encoding="utf-8")) if processor_file.is_file() else None
    shapes = shapes_for(config, sequence=args.sequence, past=args.past, processor=processor, source=args.source)
    side.shapes = asdict(shapes)
    try:
        fp32 = runner([Path(p) for p in side.fp32_paths], shapes, args.threads)
        int8 = runner([Path(p) for p in side.int8_paths], shapes, args.threads)
        side.timing = interleaved(fp32, int8, args.rounds, args.runs, args.warmup)
        side.timing["files_per_pass"] = len(side.fp32_paths)
    except Exception as error:  # noqa: BLE001 - a model the harness cannot feed is a row, not a crash
        side.timing_error = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"


def bench_one(arch: Architecture, base: Path, store: Path, python: Path, isa: str, args: argparse.Namespace) -> Row:
    """Build ``arch``, run both tools on it, time both."""
    from _architectures_table import print_row

    work = base / arch.name
    model = work / "model"
    work.mkdir(parents=True, exist_ok=True)
    arch.build(model)
    row = Row(arch.name, arch.task)
    for tool in TOOLS:
        try:
            row.sides[tool] = run_optimum(arch, model, work, python, isa) if tool == "optimum" else run_kiln(model, work, store)
        except Exception as error:  # noqa: BLE001 - the bench records a tool it could not drive and goes on
            row.sides[tool] = Side(tool, error=f"bench: {type(error).__name__}: {error}", note=traceback.format_exc(limit=2))
        time_side(row.sides[tool], model, args)
    print_row(row)
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(ARCHITECTURES), metavar="ARCH", help=f"of: {' '.join(ARCHITECTURES)}")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved FP32 / INT8 rounds (default 20)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per model per round (default 10)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs per model first (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads (default 1)")
    parser.add_argument("--sequence", type=int, default=32, help="new tokens per pass (default 32)")
    parser.add_argument("--past", type=int, default=32, help="past key/value positions fed (default 32)")
    parser.add_argument("--source", type=int, default=32, help="source tokens into T5's encoder (default 32)")
    parser.add_argument("--json", type=Path, help="results file (default: architectures.json in the work folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (models, exports, logs, Kiln's store)")
    parser.add_argument("--optimum-venv", type=Path, help="Optimum's environment (default ~/.cache/kiln-bench/optimum-venv-<hash>)")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.runs < 1:
        parser.error("--rounds at least 2, --runs at least 1")
    return args


def environment(python: Path, host: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """The host and the versions each side ran with, and the command line."""
    import onnxruntime
    import transformers

    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    status = [*git, "status", "--porcelain", "--", "engine", "passes", "evaluators", "targets"]
    dirty = subprocess.run(status, capture_output=True, text=True, check=False).stdout.split("\n")
    return {
        "command": shlex.join(["python", "bench/architectures.py", *argv]),
        "kiln_commit": commit or "?",
        "kiln_uncommitted": [line[3:] for line in dirty if line.strip()],  # Kiln runs from the working tree
        "host": host,
        "optimum_onnx": package_version(python, "optimum-onnx"),
        "optimum": package_version(python, "optimum"),
        "transformers_optimum_env": package_version(python, "transformers"),
        "transformers_kiln_env": transformers.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_optimum_env": package_version(python, "onnxruntime"),
    }


def main(argv: list[str] | None = None) -> int:
    from _architectures_table import print_header, print_table

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    python = ensure_optimum_venv(args.optimum_venv)
    host = cpu()
    meta = environment(python, host, argv)
    base = Path(tempfile.mkdtemp(prefix="kiln-architectures-"))
    print_header(meta, args, base)
    rows: list[Row] = []
    json_path = args.json or base / "architectures.json"
    try:
        for name in args.only or list(ARCHITECTURES):
            rows.append(bench_one(ARCHITECTURES[name], base, base / "kiln-store", python, isa_flag(host), args))
            json_path.write_text(json.dumps({**meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n", encoding="utf-8")
        print_table(rows, meta, args)
        print(f"results: {json_path}")
    finally:
        if args.keep or args.json is None:
            print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
