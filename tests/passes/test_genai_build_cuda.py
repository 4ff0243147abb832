"""genai_build for the CUDA execution provider, checked on a CPU: ONNX Runtime GenAI 0.18's model
builder writes an fp32 CUDA decoder onnxruntime refuses to open (packed Attention nodes without
present outputs); the pass refuses fp32 for cuda with fp16 as the fix, the fp16 and int4 CUDA
builds open in onnxruntime, and a pass never reports success for a decoder folder that fails the
loadability check candidates get."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from decoder_passes import run_pass
from genai_models import TinyGenai

from engine.core import ModelArtifact, PassContext, PassError, PassResult
from engine.core.loadable import onnx_load_problem
from passes.generate._common import GenaiPass
from passes.generate.genai_build import GenaiBuild


@pytest.fixture(scope="module")
def llama(tiny_genai: TinyGenai) -> ModelArtifact:
    return ModelArtifact.from_folder("hf", tiny_genai.hf)


@pytest.fixture(scope="module")
def fp32_cuda(tiny_genai: TinyGenai, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the builder itself writes for ``-p fp32 -e cuda`` (run directly, as the pass refuses it)."""
    root = tmp_path_factory.mktemp("fp32-cuda")
    out = root / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "GIT_DIR": os.devnull}
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(tiny_genai.hf), "-o", str(out)]
    command += ["-p", "fp32", "-e", "cuda", "-c", str(root / "cache"), "--extra_options", "hf_token=false"]
    subprocess.run(command, cwd=root, env=env, check=True, capture_output=True)
    return out


class _Copy(GenaiPass):
    """A pass that hands on a given decoder folder as its output (to test the contract around run)."""

    name = "copy_genai"
    summary = "copy a genai folder"
    accepts = ("hf",)
    source: Path

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        shutil.copytree(self.source, ctx.output_dir, dirs_exist_ok=True)
        return PassResult(model=ModelArtifact.from_folder("genai", Path(ctx.output_dir)))


def test_the_builders_fp32_cuda_decoder_fails_the_loadability_check(fp32_cuda: Path) -> None:
    import onnxruntime

    problem = onnx_load_problem(fp32_cuda / "model.onnx")
    assert problem is not None and "present.0.key" in problem and "produced by no node" in problem
    with pytest.raises(Exception, match=r"present\.0\.key"):  # onnxruntime agrees: the graph is invalid
        onnxruntime.InferenceSession(str(fp32_cuda / "model.onnx"), providers=["CPUExecutionProvider"])


def test_a_pass_never_reports_success_for_a_decoder_onnxruntime_cannot_open(fp32_cuda: Path, llama: ModelArtifact, tmp_path: Path) -> None:
    _Copy.source = fp32_cuda
    with pytest.raises(PassError, match=r"present\.0\.key.*produced by no node"):
        run_pass(_Copy, llama, tmp_path)


def test_fp32_for_cuda_is_refused_with_fp16_as_the_fix(llama: ModelArtifact, tmp_path: Path) -> None:
    with pytest.raises(PassError, match=r"precision fp32 is not built for the cuda execution provider.*use precision fp16"):
        run_pass(GenaiBuild, llama, tmp_path, precision="fp32", execution_provider="cuda")
    assert not (tmp_path / "work" / "builder.log").exists()  # refused before the builder ran


@pytest.mark.parametrize("precision", ["fp16", "int4"])
def test_cuda_builds_open_in_onnxruntime(precision: str, llama: ModelArtifact, tmp_path: Path) -> None:
    import onnx
    import onnxruntime

    result = run_pass(GenaiBuild, llama, tmp_path, precision=precision, execution_provider="cuda")
    model_file = result.model.model_file
    assert onnx_load_problem(model_file) is None
    graph = onnx.load(str(model_file), load_external_data=False).graph
    assert sum(node.op_type == "GroupQueryAttention" for node in graph.node) == 2
    # CPU onnxruntime opens it (every op has a CPU kernel here); the outputs are the cache's
    session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    assert {"present.0.key", "present.1.value"} <= {value.name for value in session.get_outputs()}
