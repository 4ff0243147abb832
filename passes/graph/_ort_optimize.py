"""``optimize_model`` for ort_fusion, with onnxruntime's graph optimizer in a child process when
the model is past 2 GB (passes.common.child).

onnxruntime's ``optimize_model`` at ``opt_level`` >= 1 first has an onnxruntime session optimize
and save the model (the session holds the weights and their rewritten copies), then loads what it
saved and runs the Python fusions on it. On a 4.3 GB encoder that one process peaked at 21.2 GiB
(5.3x), most of it the session's memory still held by the allocator during the fusions. Here the
first half runs in a child with the same arguments ``optimize_model`` would give it (its disabled
optimizers, external data where the input has it), and the second half is ``optimize_model`` at
level 0 on the child's output: the same two steps in the same order, so the same model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from passes.common.onnx_io import EXTERNAL_DATA_THRESHOLD
from passes.quantize.onnx_facts import file_bytes

#: what onnxruntime's optimize_model disables at each level (onnxruntime/transformers/optimizer.py)
_DISABLED = ["ConstantSharing"]
_DISABLED_ABOVE_1 = ["MatMulScaleFusion", "MatMulAddFusion", "MatmulTransposeFusion", "GemmActivationFusion", "BiasSoftmaxFusion"]
#: what optimize_model logs when given only_onnxruntime at level 0 (here: the level-1+ half already ran)
_LEVEL_0_WARNING = "Please specify a positive value for opt_level"


def optimize_model(optimizer: Any, source: Path, workdir: Path, options: dict[str, Any], **fusion: Any) -> tuple[Any, list[str]]:
    """``optimizer.optimize_model(source, **fusion, **options)``, and what its child logged (empty
    when it ran in this process: the caller collects that itself)."""
    level = options["opt_level"]
    if level == 0 or file_bytes(source) <= EXTERNAL_DATA_THRESHOLD:
        return optimizer.optimize_model(str(source), **fusion, **options), []
    import onnx
    from onnx.external_data_helper import uses_external_data

    from passes.common.child import run_in_child

    header = onnx.load(str(source), load_external_data=False)
    external = any(uses_external_data(t) for t in header.graph.initializer)
    disabled = _DISABLED + (_DISABLED_ABOVE_1 if level > 1 and not options["only_onnxruntime"] else [])
    optimized = workdir / f"model_o{level}_{'gpu' if options['use_gpu'] else 'cpu'}.onnx"
    logged = run_in_child(_onnxruntime_half, source, optimized, level, options["use_gpu"], options["provider"], disabled, external)
    fused = optimizer.optimize_model(str(optimized), **fusion, **{**options, "opt_level": 0})
    return fused, logged


def _onnxruntime_half(
    source: Path, optimized: Path, level: int, use_gpu: bool, provider: str | None, disabled: list[str], external: bool
) -> list[str]:
    """The child's side: onnxruntime's optimizer as ``optimize_model`` runs it, and what it logged."""
    from onnxruntime.transformers.optimizer import optimize_by_onnxruntime

    from passes.common.graph_tools import quiet_library

    with quiet_library() as messages:
        optimize_by_onnxruntime(
            str(source),
            use_gpu=use_gpu,
            provider=provider,
            optimized_model_path=str(optimized),
            opt_level=level,
            disabled_optimizers=disabled,
            save_as_external_data=external,
        )
    return messages


def without_level_0_warning(messages: list[str]) -> list[str]:
    return [m for m in messages if _LEVEL_0_WARNING not in m]
