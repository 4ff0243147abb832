"""onnxruntime's compile API in a process of its own, for the ort_compile pass.

Run as a script (``python _compile_child.py``) with a JSON request on stdin: ``source``,
``output``, ``embed``, ``level`` (a ``GraphOptimizationLevel`` name), ``providers`` and
``provider_options`` (one mapping per provider). It compiles, then prints one line
``KILN-COMPILE <json>`` with ``error`` (null, or the exception's message), ``type`` (the
exception's class) and ``warnings`` (what Python warned meanwhile).

Why a process: the OpenVINO execution provider numbers the subgraphs it compiles with a counter
that lives as long as the process (``OpenVINOExecutionProvider_OpenVINO-EP-subgraph_<n>_0``), and
that number goes into the EPContext node's ``partition_name`` and into the compiled blob. In a
process that had compiled before (a pooled worker runs many jobs), the same model compiled to
other bytes; in a fresh process every compilation is the first. The file imports onnxruntime
only, not Kiln: it runs in whichever environment the pass runs in.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

MARKER = "KILN-COMPILE "


def compile_model(request: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    for name, provider_options in zip(request["providers"], request["provider_options"], strict=True):
        options.add_provider(name, provider_options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            compiler = onnxruntime.ModelCompiler(
                options,
                request["source"],
                embed_compiled_data_into_model=request["embed"],
                flags=onnxruntime.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED,
                graph_optimization_level=getattr(onnxruntime.GraphOptimizationLevel, request["level"]),
            )
            compiler.compile_to_file(request["output"])
            error, kind = None, None
        except Exception as failure:  # noqa: BLE001 - every failure goes back to the pass, which raises it there
            error, kind = str(failure), type(failure).__name__
    found = [f"{w.category.__name__}: {str(w.message).strip()[:300]}" for w in caught]
    return {"error": error, "type": kind, "warnings": found}


def main() -> int:
    answer = compile_model(json.loads(sys.stdin.read()))
    sys.stdout.write(MARKER + json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
