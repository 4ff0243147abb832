"""EP compilation: the model compiled ahead of time for the target's execution provider.

onnxruntime's compile API (``onnxruntime.ModelCompiler``) lets an execution provider that compiles
subgraphs (OpenVINO, TensorRT, QNN, ...) do that work once, offline, and store the result in
``EPContext`` nodes: a session that opens the compiled model loads the provider's blob instead of
compiling again, which is the start-up win. The blob is embedded in the node (``embed: true``) or
written beside the model (``model_<Provider>.bin``, in the artifact's folder, so it travels with
it). Nodes the provider does not take stay ordinary ONNX nodes.

The pass compiles for the providers of the target it is planned for, with the target's provider
options (the OpenVINO EP needs ``device_type``, e.g. CPU, and compiles for that device), so it is
target-dependent. A compiled model loads only with that provider (and the same library version:
the OpenVINO EP checks the OpenVINO SDK version written into the node). Compiling for providers
that take no node is an error that says so (``ERROR_IF_NO_NODES_COMPILED``): the CPU provider
compiles nothing.

The compilation runs in a fresh process (``passes.compile._compile_child``): the OpenVINO EP
numbers its subgraphs with a counter that lives as long as the process and writes the number into
the EPContext node and the blob, so a second compilation in one process wrote other bytes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from engine.core import KilnError, ModelArtifact, PassConfig, PassContext, PassResult
from passes.common.graph_tools import qualified_op_counts, runtime_loadable
from passes.common.onnx_io import OnnxPass
from passes.common.pass_io import require
from passes.compile._compile_files import copy_the_rest, files_to_compile, summary
from passes.compile._target import CPU, Providers, target_providers

EP_CONTEXT = "EPContext"

_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class OrtCompile(OnnxPass):
    name = "ort_compile"
    summary = (
        "Compile the model ahead of time for the target's execution provider (OpenVINO, TensorRT, QNN...) with onnxruntime's "
        "compile API: an EPContext model that starts without compiling; the blob embedded or beside the model."
    )
    version = "1"
    accepts = ("onnx", "genai", "onnx_parts")
    produces = "onnx"
    keeps = ("genai", "onnx_parts")  # every model of the folder compiled, its other files copied
    target_dependent = True
    libraries = ("onnx", "onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino")

    class Config(PassConfig):
        embed: bool = Field(
            False,
            description=(
                "Embed the compiled blob in the EPContext node (true) or write it beside the model as model_<Provider>.bin in the "
                "artifact's folder (false: the model file stays small, and blobs over 2 GB are possible)."
            ),
        )
        graph_optimization_level: Literal["disable", "basic", "extended", "all"] = Field(
            "disable",
            description="onnxruntime graph optimizations applied before the provider compiles (onnxruntime's default for compiling: disable).",
        )

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        (onnxruntime,) = require("onnxruntime", self.name, "onnxruntime")
        if not hasattr(onnxruntime, "ModelCompiler"):
            raise KilnError(f"onnxruntime {onnxruntime.__version__} has no compile API (onnxruntime.ModelCompiler, from 1.22)")
        providers = target_providers(ctx, model)
        compiling = [name for name in providers.names if name != CPU]
        if not compiling:
            raise KilnError(
                f"ort_compile compiles for a target's execution provider, and the target's providers are {', '.join(providers.names)}: "
                "the CPU execution provider compiles nothing. Plan the step for a target with a compiling provider (OpenVINO, TensorRT, QNN...)."
            )
        available = list(onnxruntime.get_available_providers())
        missing = [name for name in compiling if name not in available]
        if missing:
            raise KilnError(
                f"execution provider {', '.join(missing)} is not in onnxruntime {onnxruntime.__version__} here (available: {', '.join(available)})"
            )
        workdir = Path(ctx.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        out_dir = Path(ctx.output_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        names = files_to_compile(model)
        started = time.perf_counter()
        answers = {name: self._compile_one(Path(model.path) / name, out_dir / name, workdir, providers, compiling) for name in names}
        seconds = round(time.perf_counter() - started, 3)
        copied = copy_the_rest(model, names, out_dir)
        details = self._details(Path(model.path), names, out_dir, providers.to_json(), summary(names, answers), seconds)
        if model.format != "onnx":
            details["copied"] = copied
        return PassResult(model=ModelArtifact.from_folder(model.format, out_dir, attrs=model.attrs), details=details)

    def _compile_one(self, source: Path, output: Path, workdir: Path, providers: Providers, compiling: list[str]) -> dict[str, Any]:
        """Compile one ONNX model in a fresh process; its answer, or an error naming the file."""
        loadable = runtime_loadable(source, workdir / f"input-{source.stem}")
        request = {
            "source": str(loadable.resolve()),
            "output": str(output.resolve()),
            "embed": self.config.embed,
            "level": _LEVELS[self.config.graph_optimization_level],
            **providers.to_json(),
        }
        answer = _compile_in_child(request, workdir)
        error = answer["error"]
        if error is not None and "unable to compile any nodes" in error.lower():
            raise KilnError(f"no node of {source.name} was compiled: {', '.join(compiling)} took none of it (onnxruntime: {error})")
        if error is not None:
            raise RuntimeError(f"onnxruntime's compile API failed on {source.name}: {answer['type']}: {error}")
        return answer

    def _details(
        self, source: Path, names: list[str], out_dir: Path, providers: dict[str, Any], messages: dict[str, Any], seconds: float
    ) -> dict[str, Any]:
        import onnx

        before = after = contexts = 0
        counts: dict[str, int] = {}
        sources: set[str] = set()
        for name in names:
            before += sum(qualified_op_counts(onnx.load(str(source / name), load_external_data=False)).values())
            compiled = onnx.load(str(out_dir / name), load_external_data=False)
            for op, count in qualified_op_counts(compiled).items():
                counts[op] = counts.get(op, 0) + count
            nodes = [node for node in compiled.graph.node if node.op_type == EP_CONTEXT]
            contexts += len(nodes)
            sources |= {onnx.helper.get_attribute_value(a).decode() for n in nodes for a in n.attribute if a.name == "source"}
            after += len(compiled.graph.node)
        return {
            **providers,
            "embed": self.config.embed,
            "graph_optimization_level": self.config.graph_optimization_level,
            "compiled_models": names,
            "ep_context_nodes": contexts,
            "compiled_by": sorted(sources),
            "nodes_before": before,
            "nodes_after": after,
            "op_counts_after": dict(sorted(counts.items())),
            "files": {path.name: path.stat().st_size for path in sorted(out_dir.iterdir()) if path.is_file()},
            "library_warnings": messages,
            "seconds": seconds,
        }

    def check_output(self, result: PassResult, ctx: PassContext) -> None:
        # the compiled models are written by the onnxruntime that loads them (their IR version is
        # that runtime's own), so only the checker and the EPContext nodes are checked here
        import onnx

        super(OnnxPass, self).check_output(result, ctx)
        for name in files_to_compile(result.model):
            model = onnx.load(str(Path(result.model.path) / name), load_external_data=False)
            onnx.checker.check_model(model)
            if not any(node.op_type == EP_CONTEXT for node in model.graph.node):
                raise ValueError(f"the compiled {name} has no EPContext node")


def _compile_in_child(request: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Compile in a fresh process (``passes.compile._compile_child``: why, there); its answer."""
    import json
    import subprocess
    import sys

    from passes.compile import _compile_child

    done = subprocess.run(
        [sys.executable, _compile_child.__file__], input=json.dumps(request), capture_output=True, text=True, cwd=workdir, check=False
    )
    answers = [line[len(_compile_child.MARKER) :] for line in done.stdout.splitlines() if line.startswith(_compile_child.MARKER)]
    if done.returncode != 0 or not answers:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
        raise RuntimeError(f"the onnxruntime compile process exited {done.returncode} without an answer; the end of its output:\n{tail}")
    answer: dict[str, Any] = json.loads(answers[-1])
    return answer
