"""The engine imports every plugin module to read its Config: none may pull in a heavy library."""

from __future__ import annotations

import ast
import subprocess
import sys

HEAVY = ("onnxruntime", "onnx", "transformers", "torch", "sklearn", "PIL", "psutil", "openvino")


def imported(modules: list[str], watched: tuple[str, ...]) -> list[str]:
    code = f"import sys, {', '.join(modules)}; print(sorted(m for m in {watched!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return ast.literal_eval(result.stdout.strip())


def test_the_evaluators_import_neither_runtimes_nor_numpy() -> None:
    modules = ["evaluators.accuracy", "evaluators.size", "evaluators.memory", "evaluators.custom", "evaluators.throughput"]
    modules += ["evaluators.generation", "evaluators.perplexity", "evaluators.logit_fidelity"]
    assert imported(modules, (*HEAVY, "numpy")) == []


def test_the_data_sources_import_nothing_beyond_numpy() -> None:
    modules = [f"evaluators.data.{name}" for name in ("tabular", "npz", "image_folder", "sklearn", "text_lines")]
    assert imported(modules, HEAVY) == []
