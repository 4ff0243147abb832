"""Every built-in pass that tests/contracts/test_plugins.py does not run twice (its DETERMINISTIC
list: fp16, int4_weights, onnx_simplify, ort_graph_optimize and dynamic ort_quantize on a tiny
MatMul model) runs twice here on one small real input, and both runs must write the same bytes:
every file of the output folder, names included. A job's key is made of its input's digest and
its config, so the key names the output only if the pass writes the same bytes every time.

The second run differs from the first in what must not matter: the input is a copy in another
folder, the work and output folders are others, and it runs with fewer threads (torch at one
thread, and one CPU for the threads, thread pools and processes started meanwhile). Passes of
their own environments (ort_compile with the OpenVINO EP, inc_*, quark_quantize) run both times in one process
of that environment: state a library keeps between runs in one process must not leak either.

What these runs found varying, each fixed in its pass (the pass's docstring says how): the byte
layout of the ORT format file (ort_serialize), the git commit the GenAI model builder stamps into
the model (genai_build), the OpenVINO EP's per-process subgraph counter (ort_compile) and MKL's
thread-count-dependent Cholesky factorization in GPTQ (gptq, quarot with method gptq).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.core import ModelArtifact, PassContext, PassResult
from engine.core.data import Dataset
from engine.core.evaluator import EvalContext, MetricResult

TINY_BERT = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def text(count: int, seed: int) -> Dataset:
    """Random token ids for the tiny BERT (its three inputs, no padding)."""
    ids = np.random.default_rng(seed).integers(0, TINY_BERT["vocab_size"], (count, 16))
    return Dataset(inputs={"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})


TEXT, CHECK = text(16, 0), text(8, 1)
WINDOWS = Dataset(inputs={"input_ids": np.random.default_rng(2).integers(1, 300, (4, 32)), "attention_mask": np.ones((4, 32), np.int64)})


# -- running a pass twice ---------------------------------------------------------------------------
def tree_digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, by path relative to it."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_of(model: ModelArtifact, folder: Path) -> ModelArtifact:
    """``model`` copied to ``folder``: each run reads its input from a folder of its own."""
    shutil.copytree(model.path, folder)
    return ModelArtifact.from_folder(model.format, folder, attrs=model.attrs)


def context(root: Path, data: dict[str, Dataset] | None = None, **options: Any) -> PassContext:
    ctx = PassContext(
        step_id="twice",
        workdir=root / "work",
        output_dir=root / "out",
        datasets={name: (lambda *_, d=d: d) for name, d in (data or {}).items()},
        **options,
    )
    ctx.workdir.mkdir(parents=True)
    return ctx


def run(pass_cls: Any, model: ModelArtifact, root: Path, config: dict[str, Any] | None = None, **ctx_options: Any) -> PassResult:
    """``pass_cls`` with ``config`` on a copy of ``model`` in ``root``, with the working directory
    in the step's workdir as the engine sets it."""
    ctx = context(root, **ctx_options)
    with contextlib.chdir(ctx.workdir):
        return pass_cls(pass_cls.Config(**(config or {})))(copy_of(model, root / "input"), ctx)


@contextlib.contextmanager
def fewer_threads() -> Iterator[None]:
    """torch at one thread, and this thread (with the threads and processes it starts) on one CPU
    where the platform lets a process choose its CPUs."""
    import torch

    pinned = hasattr(os, "sched_setaffinity")
    cpus, threads = os.sched_getaffinity(0) if pinned else set(), torch.get_num_threads()
    if pinned:
        os.sched_setaffinity(0, {min(cpus)})
    torch.set_num_threads(1)
    try:
        yield
    finally:
        if pinned:
            os.sched_setaffinity(0, cpus)
        torch.set_num_threads(threads)


def assert_same_bytes(first: dict[str, str], second: dict[str, str], name: str) -> None:
    differing = sorted(path for path in first.keys() | second.keys() if first.get(path) != second.get(path))
    assert not differing, f"{name} wrote different bytes in two runs on the same input: {', '.join(differing)}"


def twice(tmp_path: Path, name: str, once: Callable[[Path], PassResult], second: Any = None) -> PassResult:
    """``once(root)`` in two roots (the second with fewer threads, and within ``second``, a
    context manager, when given); asserts both output folders hold the same bytes."""
    first_result = once(tmp_path / "first")
    with fewer_threads(), second or contextlib.nullcontext():
        second_result = once(tmp_path / "second")
    assert_same_bytes(tree_digests(first_result.model.path), tree_digests(second_result.model.path), name)
    return first_result


# -- small real inputs ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    """A random-weight 2-layer BERT saved by transformers."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(**TINY_BERT, max_position_embeddings=64)).save_pretrained(folder)
    return ModelArtifact.from_folder("hf", folder)


@pytest.fixture(scope="module")
def bert_onnx(bert: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    from passes.export.torch_export import TorchExport

    return run(TorchExport, bert, tmp_path_factory.mktemp("bert-onnx")).model


@pytest.fixture(scope="module")
def bert_ir(bert_onnx: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    from passes.openvino.convert import OpenVinoConvert

    return run(OpenVinoConvert, bert_onnx, tmp_path_factory.mktemp("bert-ir")).model


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> ModelArtifact:
    from decoders import tiny_decoder

    return ModelArtifact.from_folder("hf", tiny_decoder(tmp_path_factory.mktemp("llama"), "llama"))


def attention_block(folder: Path) -> ModelArtifact:
    """x [batch, 8, 16], mask [batch, 8] -> one attention head whose padding mask adds finfo.min:
    static INT8 of the masked scores ruins it, so ort_quantize_accuracy ranks nodes and falls back."""
    rng = np.random.default_rng(0)
    weights = {name: (rng.standard_normal((16, 16)) * 0.3).astype(np.float32) for name in ("Wq", "Wk", "Wv", "Wo")}
    constants = {"one": np.array(1, np.float32), "lowest": np.array(np.finfo(np.float32).min, np.float32), "axes": np.array([1])}
    nodes = [helper.make_node("MatMul", ["x", w], [w + "_out"], name=w) for w in ("Wq", "Wk", "Wv")] + [
        helper.make_node("Transpose", ["Wk_out"], ["k_t"], name="key_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["Wq_out", "k_t"], ["scores"], name="scores"),
        helper.make_node("Sub", ["one", "mask"], ["padding"], name="invert_mask"),
        helper.make_node("Mul", ["padding", "lowest"], ["bias"], name="mask_bias"),
        helper.make_node("Unsqueeze", ["bias", "axes"], ["bias_rows"], name="bias_rows"),
        helper.make_node("Add", ["scores", "bias_rows"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "Wv_out"], ["context"], name="context"),
        helper.make_node("MatMul", ["context", "Wo"], ["y"], name="output"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 16]),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 8]),
    ]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 16])
    initializers = [numpy_helper.from_array(v, k) for k, v in {**weights, **constants}.items()]
    model = helper.make_model(
        helper.make_graph(nodes, "attention", inputs, [output], initializers), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 10
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    return ModelArtifact.from_folder("onnx", folder)


def sentences(count: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    mask = (np.arange(8)[None, :] < rng.integers(2, 9, count)[:, None]).astype(np.float32)
    return Dataset(inputs={"x": rng.standard_normal((count, 8, 16)).astype(np.float32), "mask": mask})


def fidelity(target: Any, reference: ModelArtifact, data: Dataset, workdir: Path) -> Callable[[str, ModelArtifact], MetricResult]:
    """A ``ctx.measure`` like the engine's: the fidelity evaluator on ``target`` against ``reference``."""
    from evaluators.fidelity import Fidelity

    def measure(evaluation: str, model: ModelArtifact) -> MetricResult:
        assert evaluation == "fidelity"
        ctx = EvalContext(target=target, workdir=workdir, reference=reference, datasets={"data": lambda *_: data})
        return Fidelity(Fidelity.Config(data="data")).evaluate(model, ctx)

    return measure


# -- exports and conversions ------------------------------------------------------------------------
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_torch_export(bert: ModelArtifact, tmp_path: Path, exporter: str) -> None:
    from passes.export.torch_export import TorchExport

    twice(tmp_path, f"torch_export ({exporter})", lambda root: run(TorchExport, bert, root, {"exporter": exporter}))


@pytest.mark.parametrize("source", ["onnx", "hf"])
def test_openvino_convert(bert: ModelArtifact, bert_onnx: ModelArtifact, tmp_path: Path, source: str) -> None:
    from passes.openvino.convert import OpenVinoConvert

    model = bert_onnx if source == "onnx" else bert
    twice(tmp_path, f"openvino_convert (from {source})", lambda root: run(OpenVinoConvert, model, root))


def test_decoder_export(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from decoders import tiny_decoder

    from passes.generate.decoder_export import DecoderExport

    qwen2 = ModelArtifact.from_folder("hf", tiny_decoder(tmp_path_factory.mktemp("qwen2"), "qwen2"))
    twice(tmp_path, "decoder_export", lambda root: run(DecoderExport, qwen2, root))


@contextlib.contextmanager
def another_git_commit(folder: Path) -> Iterator[None]:
    """GIT_DIR set to a new repository with one commit (the model builder reads a commit with git)."""
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    identity = ["-c", "user.name=kiln", "-c", "user.email=kiln@example.invalid"]
    subprocess.run(["git", *identity, "-C", str(folder), "commit", "-q", "--allow-empty", "-m", "other"], check=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GIT_DIR", str(folder / ".git"))
        yield


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_genai_build(llama: ModelArtifact, tmp_path: Path, precision: str) -> None:
    """The second build runs where git answers another commit: the model must not carry it."""
    from passes.generate.genai_build import GenaiBuild

    build = lambda root: run(GenaiBuild, llama, root, {"precision": precision})  # noqa: E731
    twice(tmp_path, f"genai_build ({precision})", build, second=another_git_commit(tmp_path / "repository"))


# -- graph passes -------------------------------------------------------------------------------------
def test_ort_fusion(bert: ModelArtifact, bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    """Reads the workflow's input (the Hugging Face folder) for the heads and hidden size."""
    from passes.graph.ort_fusion import OrtFusion

    def fuse(root: Path) -> PassResult:
        return run(OrtFusion, bert_onnx, root, input_model=copy_of(bert, root / "hf"))

    result = twice(tmp_path, "ort_fusion", fuse)
    assert result.details["fused_operators"]  # something was fused


@pytest.mark.parametrize("pass_name", ["onnx_simplify", "ort_graph_optimize", "fp16", "onnx_peephole"])
def test_graph_passes_on_a_bert_export(bert_onnx: ModelArtifact, tmp_path: Path, pass_name: str) -> None:
    """On a BERT export (test_plugins runs these on a MatMul, an Add and a Relu)."""
    from engine import registry

    twice(tmp_path, pass_name, lambda root: run(registry.load("passes", pass_name), bert_onnx, root))


def test_graph_surgery(bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    from passes.graph.graph_surgery import GraphSurgery

    surgeries = [
        {"surgeon": "RenameInputs", "old_names": ["input_ids"], "new_names": ["ids"]},
        {"surgeon": "DeduplicateNodes"},
        {"surgeon": "ReciprocalMulToDiv"},
    ]
    twice(tmp_path, "graph_surgery", lambda root: run(GraphSurgery, bert_onnx, root, {"surgeries": surgeries}))


@pytest.mark.parametrize("level", ["basic", "all"])
def test_ort_serialize_with_the_ort_format(bert_onnx: ModelArtifact, tmp_path: Path, level: str) -> None:
    """onnxruntime lays out model.ort differently at every save; the pass writes one layout."""
    import onnxruntime

    from passes.compile.ort_serialize import ORT_FILE, OrtSerialize

    result = twice(tmp_path, "ort_serialize", lambda root: run(OrtSerialize, bert_onnx, root, {"level": level, "ort_format": True}))
    assert result.notes == [] or "laid out" not in result.notes[0]
    feeds = {name: values[:2] for name, values in CHECK.inputs.items()}
    outputs = [
        onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        for path in (bert_onnx.model_file, result.model.path / ORT_FILE)
    ]
    np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-4)  # the rewritten file loads and computes the model


# -- quantization with onnxruntime ----------------------------------------------------------------------
@pytest.mark.parametrize("method", ["MinMax", "Entropy", "Percentile", "Distribution"])
def test_static_ort_quantize(bert_onnx: ModelArtifact, tmp_path: Path, method: str) -> None:
    """Calibrated static QDQ (test_plugins runs dynamic ort_quantize only)."""
    from passes.quantize.ort_quantize import OrtQuantize

    config = {"mode": "static", "calibration": "text", "calibration_method": method, "op_types_to_quantize": ["MatMul"]}
    twice(tmp_path, f"ort_quantize ({method})", lambda root: run(OrtQuantize, bert_onnx, root, config, data={"text": TEXT}))


def test_static_ort_quantize_16bit_activations(bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    """Static QDQ with quint16 activations (the A16W8 of NPUs)."""
    from passes.quantize.ort_quantize import OrtQuantize

    config = {
        "mode": "static",
        "calibration": "text",
        "activation_type": "quint16",
        "per_channel": True,
        "op_types_to_quantize": ["MatMul"],
    }
    twice(tmp_path, "ort_quantize (quint16)", lambda root: run(OrtQuantize, bert_onnx, root, config, data={"text": TEXT}))


def test_qnn_quantize(bert_onnx: ModelArtifact, tmp_path: Path) -> None:
    """Static QDQ under onnxruntime's QNN rules (every op type, tensor overrides), qnn_preprocess on."""
    from passes.quantize.qnn_quantize import QnnQuantize

    config = {"calibration": "text", "per_channel": True, "qnn_preprocess": True}
    twice(tmp_path, "qnn_quantize", lambda root: run(QnnQuantize, bert_onnx, root, config, data={"text": TEXT}))


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_ort_quantize_accuracy(tmp_path: Path, mode: str) -> None:
    from passes.quantize.ort_quantize_accuracy import OrtQuantizeAccuracy
    from targets.onnxruntime import OnnxRuntimeTarget

    source = attention_block(tmp_path / "source")
    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="cpu", runtime="onnxruntime"))
    config: dict[str, Any] = {"mode": mode, "validation": "fidelity", "metric": "cosine_mean", "min": 0.99, "nodes_per_step": 2}
    if mode == "static":
        config.update(calibration="calibration", calibration_batch_size=8)

    def tune(root: Path) -> PassResult:
        measure = fidelity(target, source, sentences(16, 2), root / "eval")
        data = {"calibration": sentences(32, 1)}
        return run(OrtQuantizeAccuracy, source, root, config, data=data, measure=measure, cache_dir=root / "cache")

    result = twice(tmp_path, f"ort_quantize_accuracy ({mode})", tune)
    assert mode == "dynamic" or result.details["iterations"] > 1  # the static case fell back at least once


@pytest.mark.parametrize("algorithm", ["hqq", "gptq"])
def test_int4_weights_algorithms(bert_onnx: ModelArtifact, tmp_path: Path, algorithm: str) -> None:
    """int4_weights' other algorithms (test_plugins runs its default, rtn)."""
    from passes.quantize.int4_weights import Int4Weights

    config: dict[str, Any] = {"algorithm": algorithm, "block_size": 16}
    if algorithm == "gptq":
        config["calibration"] = "text"
    twice(tmp_path, f"int4_weights ({algorithm})", lambda root: run(Int4Weights, bert_onnx, root, config, data={"text": TEXT}))


# -- OpenVINO and NNCF ------------------------------------------------------------------------------------
def openvino_target(**options: Any) -> Any:
    from targets.openvino import OpenVinoTarget

    return OpenVinoTarget(OpenVinoTarget.Config(id="ov", runtime="openvino", **options))


def test_nncf_quantize(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    from passes.openvino.nncf_quantize import NncfQuantize

    config = {"calibration": "text", "preset": "mixed", "model_type": "transformer"}
    twice(tmp_path, "nncf_quantize", lambda root: run(NncfQuantize, bert_ir, root, config, data={"text": TEXT}))


@pytest.mark.parametrize(
    "config",
    [{}, {"mode": "INT4_ASYM", "group_size": 32, "ratio": 0.5, "dataset": "text", "awq": True, "scale_estimation": True}],
    ids=["int8", "int4-data-aware"],
)
def test_nncf_compress_weights(bert_ir: ModelArtifact, tmp_path: Path, config: dict[str, Any]) -> None:
    from passes.openvino.nncf_compress_weights import NncfCompressWeights

    twice(tmp_path, "nncf_compress_weights", lambda root: run(NncfCompressWeights, bert_ir, root, config, data={"text": TEXT}))


def test_openvino_io_update_and_encapsulate(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    from passes.openvino.encapsulate import OpenVinoEncapsulate
    from passes.openvino.io_update import OpenVinoIoUpdate

    config = {"static": True, "input_shapes": [[1, 16], [1, 16], [1, 16]]}
    static = twice(tmp_path / "io", "openvino_io_update", lambda root: run(OpenVinoIoUpdate, bert_ir, root, config))
    twice(tmp_path / "enc", "openvino_encapsulate", lambda root: run(OpenVinoEncapsulate, static.model, root))


def test_nncf_quantize_accuracy(bert_ir: ModelArtifact, tmp_path: Path) -> None:
    """A max_drop tight enough that NNCF ranks the quantized ops and reverts some."""
    from passes.openvino.nncf_quantize_accuracy import NncfQuantizeAccuracy

    config = {"calibration": "text", "validation": "fidelity", "metric": "cosine_mean", "model_type": "transformer"}
    config.update(max_drop=2e-6, max_num_iterations=2)

    def quantize(root: Path) -> PassResult:
        measure = fidelity(openvino_target(inference_num_threads=1), bert_ir, CHECK, root / "eval")
        return run(NncfQuantizeAccuracy, bert_ir, root, config, data={"text": TEXT}, measure=measure)

    result = twice(tmp_path, "nncf_quantize_accuracy", quantize)
    assert result.details["reverted_ops"] > 0


# -- PyTorch weight quantization of decoders ----------------------------------------------------------
@pytest.mark.parametrize(
    ("pass_name", "config"),
    [
        ("rtn", {}),
        ("gptq", {"calibration": "windows", "samples": 4, "sequence_length": 32}),
        ("quarot", {}),
        ("quarot", {"method": "gptq", "calibration": "windows", "samples": 4, "sequence_length": 32}),
    ],
    ids=["rtn", "gptq", "quarot-rtn", "quarot-gptq"],
)
def test_torch_quant(llama: ModelArtifact, tmp_path: Path, pass_name: str, config: dict[str, Any]) -> None:
    """gptq's Cholesky factors depended on torch's thread count (the second run has one thread)."""
    from engine import registry

    cls = registry.load("passes", pass_name)
    twice(tmp_path, pass_name, lambda root: run(cls, llama, root, {"group_size": 32, **config}, data={"windows": WINDOWS}))


# -- passes of their own environments: both runs in one process there -----------------------------------
CHILD_PRELUDE = """
import hashlib, json, os, shutil, sys
from pathlib import Path
from engine.core import ModelArtifact, PassContext
root, source = Path(sys.argv[1]), Path(sys.argv[2])
def digests(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}
def run(cls, config, run_id, **ctx_options):
    base = root / run_id
    shutil.copytree(source.parent, base / "input")
    (base / "work").mkdir()
    os.chdir(base / "work")  # as the engine runs a pass
    ctx = PassContext(step_id="twice", workdir=base / "work", output_dir=base / "out", **ctx_options)
    return digests(cls(cls.Config(**config))(ModelArtifact.from_folder("onnx", base / "input"), ctx).model.path)
result = {}
"""


def in_environment(python: Path, tmp_path: Path, body: str, source: Path) -> dict[str, Any]:
    """Run ``body`` (which fills ``result``) with ``python``; returns ``result``."""
    script = tmp_path / "child.py"
    script.write_text(CHILD_PRELUDE + textwrap.dedent(body) + "\nprint('RESULT ' + json.dumps(result))\n")
    env = {**os.environ, "PYTHONPATH": ""}  # the environment's .pth puts Kiln after its own packages
    done = subprocess.run(
        [str(python), str(script), str(tmp_path / "runs"), str(source)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :]))


def mlp(folder: Path) -> Path:
    """x [batch, 16] -> MatMul -> Add -> Relu -> MatMul -> y [batch, 8], saved as folder/model.onnx."""
    rng = np.random.default_rng(0)
    weights = {"w1": rng.standard_normal((16, 32)), "b1": rng.standard_normal(32), "w2": rng.standard_normal((32, 8))}
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["a"], name="bias"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
    ]
    initializers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", d]) for n, d in (("x", 16), ("y", 8)))
    model = helper.make_model(helper.make_graph(nodes, "mlp", [x], [y], initializers), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    return folder / "model.onnx"


def test_ort_compile_with_the_openvino_ep(ov_ep_env: Path, tmp_path: Path) -> None:
    """The OpenVINO EP numbers its subgraphs per process, into the EPContext node and the blob."""
    body = """
    from passes.compile.ort_compile import OrtCompile
    from targets.onnxruntime import OnnxRuntimeTarget
    providers, options = ["OpenVINOExecutionProvider", "CPUExecutionProvider"], [{"device_type": "CPU"}, {}]
    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="ov", runtime="onnxruntime", providers=providers, provider_options=options))
    for embed in (True, False):
        result[str(embed)] = [run(OrtCompile, {"embed": embed}, f"{embed}-{attempt}", target=target) for attempt in (1, 2)]
    """
    result = in_environment(ov_ep_env, tmp_path, body, mlp(tmp_path / "mlp"))
    for embed, (first, second) in result.items():
        assert_same_bytes(first, second, f"ort_compile (embed {embed})")


def test_inc_passes(inc_env: Any, tmp_path: Path) -> None:
    body = """
    import numpy as np
    from engine.core.data import Dataset
    from engine.core.evaluator import EvalContext
    from evaluators.fidelity import Fidelity
    from passes.quantize.inc_quantize import IncQuantize
    from passes.quantize.inc_quantize_accuracy import IncQuantizeAccuracy
    from targets.onnxruntime import OnnxRuntimeTarget
    data = Dataset(inputs={"x": np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)})
    datasets = {"calibration": lambda *_: data}
    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="cpu", runtime="onnxruntime", intra_op_threads=1))
    reference = ModelArtifact.from_folder("onnx", source.parent)
    def measure(evaluation, model):
        ctx = EvalContext(target=target, workdir=root / "eval", reference=reference, datasets={"data": lambda *_: data})
        return Fidelity(Fidelity.Config(data="data")).evaluate(model, ctx)
    configs = {
        "dynamic": {},
        "static": {"mode": "static", "calibration": "calibration"},
        "static-qdq-kl": {"mode": "static", "calibration": "calibration", "quant_format": "QDQ", "calibration_method": "kl"},
    }
    for name, config in configs.items():
        result[f"inc_quantize ({name})"] = [run(IncQuantize, config, f"{name}-{n}", datasets=datasets) for n in (1, 2)]
    tuned = {"mode": "static", "calibration": "calibration", "validation": "fidelity", "metric": "cosine_mean", "max_trials": 3}
    tuned.update(tolerable_loss=0.0, loss_type="absolute", on_failure="best")
    result["inc_quantize_accuracy"] = [run(IncQuantizeAccuracy, tuned, f"tuned-{n}", datasets=datasets, measure=measure) for n in (1, 2)]
    """
    for name, (first, second) in in_environment(Path(inc_env.python), tmp_path, body, mlp(tmp_path / "mlp")).items():
        assert_same_bytes(first, second, name)


@pytest.mark.slow
def test_quark_quantize(quark_env: Any, tmp_path: Path) -> None:
    body = """
    import numpy as np
    from engine.core.data import Dataset
    from passes.quantize.quark_quantize import QuarkQuantize
    data = Dataset(inputs={"x": np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)})
    datasets = {"calibration": lambda *_: data}
    configs = {
        "a8w8": {"calibration": "calibration"},
        "u8-minmax-cle": {"calibration": "calibration", "activation": {"data_type": "UInt8", "symmetric": False, "calibration_method": "MinMax"},
                          "algorithms": [{"name": "cle"}]},
    }
    for name, config in configs.items():
        result[f"quark_quantize ({name})"] = [run(QuarkQuantize, config, f"{name}-{n}", datasets=datasets) for n in (1, 2)]
    """
    for name, (first, second) in in_environment(Path(quark_env.python), tmp_path, body, mlp(tmp_path / "mlp")).items():
        assert_same_bytes(first, second, name)
