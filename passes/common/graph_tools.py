"""Helpers the graph, precision and weight-quantization passes share.

- ``quiet_library``: run a library call without letting it print. onnxruntime's tools log through
  loggers named after their files (``fusion_attention``, ``onnx_model_bert``: the transformers
  optimizer puts its own folder on ``sys.path``), call ``logging.basicConfig`` at import
  (``matmul_nbits_quantizer``), ``print`` progress bars (its vendored neural-compressor code) and
  raise Python warnings. All of that is collected so a pass can report it instead.
- ``runtime_loadable``: a copy of a model that onnxruntime can open (IR version clamped).
- ``add_contrib_opset``: onnxruntime's Python tools write com.microsoft nodes without importing
  the domain, which onnx.checker rejects; ``topological_sort``: some append the nodes they
  create at the end of the graph, which onnx.checker rejects too.
- op counts that keep the domain of non-standard ops (``com.microsoft:FusedMatMul``).

Nothing here imports onnx or onnxruntime at module level (pass modules are imported to validate
workflows, which must stay fast).
"""

from __future__ import annotations

import io
import logging
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING

from engine.core.errors import KilnError
from passes.common.library_logs import LogCollector, cap, first_line
from passes.common.onnx_io import clamp_ir_version, default_opset, ort_limits, save_onnx

if TYPE_CHECKING:
    import onnx

CONTRIB_DOMAIN = "com.microsoft"


@contextmanager
def quiet_library() -> Iterator[list[str]]:
    """Collect what a library logs (WARNING+), warns and prints on stdout while the block runs.

    The yielded list is filled when the block ends, with distinct messages in first-seen order.
    While the collector sits on the root logger, ``logging.basicConfig`` called by a library
    import is a no-op (it only acts on a root logger without handlers), so no stderr handler is
    left behind. stdout is redirected for the whole process while the block runs (progress bars
    are printed, not logged).
    """
    collector = LogCollector(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(collector)
    printed = io.StringIO()
    result: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught, redirect_stdout(printed):
            warnings.simplefilter("always")
            yield result
    finally:
        root.removeHandler(collector)
    seen: dict[str, None] = {}
    for message in collector.messages:
        text = first_line(message.message)
        if text:
            seen.setdefault(f"{message.level}: {text}", None)
    for warning in caught:
        seen.setdefault(f"{warning.category.__name__}: {str(warning.message).strip()[:300]}", None)
    for line in printed.getvalue().replace("\r", "\n").splitlines():
        if line.strip() and not line.lstrip().startswith("Progress:"):
            seen.setdefault(f"stdout: {line.strip()[:300]}", None)
    result.extend(cap(list(seen)))


def runtime_loadable(model_file: Path, workdir: Path) -> Path:
    """``model_file``, or a copy in ``workdir/input`` with the IR version lowered to what the
    installed onnxruntime loads. Raises KilnError when the opset is above what it runs."""
    import onnx

    header = onnx.load(str(model_file), load_external_data=False)
    max_ir, max_opset = ort_limits()
    opset = default_opset(header)
    if opset > max_opset:
        raise KilnError(
            f"the input model uses opset {opset}; the installed onnxruntime runs at most opset {max_opset}. Fix: export with opset <= {max_opset}"
        )
    if header.ir_version <= max_ir:
        return model_file
    return save_onnx(clamp_ir_version(onnx.load(str(model_file))), workdir / "input")


def add_contrib_opset(model: onnx.ModelProto) -> bool:
    """Import com.microsoft (version 1) when a node uses it and the model does not import it.
    Returns whether the import was added."""
    from passes.quantize.onnx_facts import iter_nodes

    imported = {entry.domain for entry in model.opset_import}
    if CONTRIB_DOMAIN in imported or not any(node.domain == CONTRIB_DOMAIN for node in iter_nodes(model.graph)):
        return False
    entry = model.opset_import.add()
    entry.domain, entry.version = CONTRIB_DOMAIN, 1
    return True


def name_unnamed_nodes(model: onnx.ModelProto) -> int:
    """Give every unnamed node of the main graph a unique name made from its op type and first
    output (deterministic). onnxruntime's fusions create unnamed Cast nodes, and tools that keep
    nodes in a dict by name (the GPTQ code) silently drop all but one of them. Returns how many
    nodes were named."""
    taken = {node.name for node in model.graph.node if node.name}
    named = 0
    for node in model.graph.node:
        if node.name:
            continue
        base = f"{node.op_type}_{node.output[0]}" if node.output else node.op_type
        name, suffix = base, 1
        while name in taken:
            name, suffix = f"{base}_{suffix}", suffix + 1
        node.name = name
        taken.add(name)
        named += 1
    return named


def topological_sort(model: onnx.ModelProto) -> None:
    """Sort the main graph's nodes in place so every input is produced before it is used
    (onnx.checker requires it; some onnxruntime tools append the nodes they create at the end).
    An already sorted graph keeps its order."""
    from onnxruntime.transformers.onnx_model import OnnxModel

    OnnxModel.graph_topological_sort(model.graph)


def qualified_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node count per op type; ops outside the default domain are named ``domain:op``."""
    from passes.quantize.onnx_facts import iter_nodes

    counts = Counter(f"{n.domain}:{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in iter_nodes(model.graph))
    return dict(sorted(counts.items()))


def op_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Op types whose count changed, with the change (negative: fewer nodes of that type)."""
    delta = {op: after.get(op, 0) - before.get(op, 0) for op in sorted(set(before) | set(after))}
    return {op: n for op, n in delta.items() if n}


def contrib_ops(counts: dict[str, int]) -> dict[str, int]:
    """The entries of ``qualified_op_counts`` outside the default domain."""
    return {op: n for op, n in counts.items() if ":" in op}
