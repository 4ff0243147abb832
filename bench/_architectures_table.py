"""bench/architectures.py's output: a markdown table (it goes into docs/benchmarks.md as printed) and the
notes under it (each failure's first error line and exit code, what each tool was asked, which
Kiln candidate was timed)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

COLUMNS = ("arch", "task", "tool", "export", "ONNX files", "INT8", "FP32 ms", "INT8 ms", "INT8 speedup [95%]")


def _files(names: list[str]) -> str:
    return ", ".join(name.removesuffix(".onnx") for name in names) or "—"


def _ms(timing: dict[str, Any] | None, key: str) -> str:
    return f"{timing[key]:.3f}" if timing else "—"


def _speedup(side: Any) -> str:
    if side.timing:
        t = side.timing
        return f"{t['speedup']:.2f}x [{t['low']:.2f}, {t['high']:.2f}]"
    return "not timed" if side.timing_error else "—"


def _state(ok: bool, tried: bool, exit_code: int | None) -> str:
    if ok:
        return "ok"
    if not tried:
        return "—"
    return f"FAILED (exit {exit_code})" if exit_code not in (None, 0) else "FAILED"


def cells(row: Any, tool: str) -> list[str]:
    """One table line for ``tool`` on ``row``."""
    side = row.sides.get(tool)
    if side is None:
        return [row.arch, row.task, tool, "—", "—", "—", "—", "—", "—"]
    int8_tried = side.export_ok
    files = _files(side.fp32_files)
    if side.int8_files and sorted(f.replace("_quantized", "") for f in side.int8_files) != sorted(side.fp32_files):
        files += f" → INT8: {_files(side.int8_files)}"
    return [
        row.arch,
        row.task,
        tool,
        _state(side.export_ok, True, side.exit_code),
        files,
        _state(side.int8_ok, int8_tried, side.exit_code),
        _ms(side.timing, "fp32_ms"),
        _ms(side.timing, "int8_ms"),
        _speedup(side),
    ]


def markdown(rows: Iterable[Any], tools: tuple[str, ...] = ("optimum", "kiln")) -> str:
    """The table as markdown, one line per architecture and tool."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for row in rows:
        for tool in tools:
            lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells(row, tool)) + " |")
    return "\n".join(lines)


def notes(rows: Iterable[Any]) -> list[str]:
    """A line per failure (first error line, exit code), per timing the harness could not do, and
    per tool's settings worth knowing (Optimum's task and flags, Kiln's timed candidate)."""
    out = []
    for row in rows:
        for tool, side in row.sides.items():
            if side.error:
                out.append(f"{row.arch} {tool}: FAILED, exit {side.exit_code}: {side.error}")
            if side.timing_error:
                out.append(f"{row.arch} {tool}: not timed: {side.timing_error}")
            if side.note and not side.note.startswith("Traceback"):
                out.append(f"{row.arch} {tool}: {side.note}")
            if side.timing and side.timing.get("files_per_pass", 1) > 1:
                out.append(f"{row.arch} {tool}: timed as one pass through {side.timing['files_per_pass']} files, summed")
    return out


def print_header(meta: dict[str, Any], args: argparse.Namespace, base: Path) -> None:
    host = meta["host"]
    print(f"$ {meta['command']}")
    print(f"host: {host['model']}, {host['cores']} cores, flags {' '.join(host['flags']) or 'none named'}")
    print(
        f"optimum-onnx {meta['optimum_onnx']} (optimum {meta['optimum']}, transformers {meta['transformers_optimum_env']}) · "
        f"Kiln's transformers {meta['transformers_kiln_env']} · onnxruntime {meta['onnxruntime']} (both time with it)"
    )
    dirty = meta.get("kiln_uncommitted") or []
    print(f"Kiln at {meta.get('kiln_commit')}" + (f" with {len(dirty)} uncommitted files in engine/, passes/, ..." if dirty else ""))
    print(f"work folder: {base}")


def print_row(row: Any) -> None:
    """Progress: the row's lines as soon as it is done."""
    for tool in row.sides:
        print(" | ".join(cells(row, tool)), flush=True)


def print_table(rows: list[Any], meta: dict[str, Any], args: argparse.Namespace) -> None:
    print()
    print(
        f"Kiln vs Optimum {meta['optimum_onnx']}: INT8 speedup over the same tool's FP32 export, onnxruntime CPU, "
        f"{args.threads} intra-op thread(s), batch 1, {args.sequence} new token(s) after {args.past} past positions; "
        f"{args.rounds} interleaved rounds x {args.runs} runs, median of per-round ratios [95% bootstrap]"
    )
    print(markdown(rows))
    found = notes(rows)
    if found:
        print("\nnotes:")
        for line in found:
            print(f"- {line}")
