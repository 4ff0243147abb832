"""What the decoder passes (``genai_build``, ``decoder_export``) share: the input as a Hugging
Face folder, the ``genai`` output check and the facts a report shows about a decoder folder.

A ``torch`` input is a factory (``factory.json`` + a Python file, or a file with
``attrs['function']``, see ``passes.export.sources.factory_spec``) whose function returns
``(PreTrainedModel, tokenizer)``: a transformers causal LM and its tokenizer. Both are saved with
``save_pretrained`` into the step's workdir, and that folder is the input the passes read.

Imports nothing heavy at module level: the engine imports pass modules to validate workflows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core import ModelArtifact, PassContext, PassResult
from engine.core.model_kind import TOKENIZER_VOCABULARY, TOKENIZER_WHY, orphan_tokenizer_settings, tokenizer_fix
from passes.common.onnx_io import MODEL_FILE, OnnxPass
from passes.common.pass_io import GENAI_CONFIG, ort_target_of

if TYPE_CHECKING:
    import onnx

#: op types a report counts in a decoder (attention kernels, quantized MatMuls and embeddings)
KEY_OPS = (
    "com.microsoft:GroupQueryAttention",
    "com.microsoft:MultiHeadAttention",
    "com.microsoft:MatMulNBits",
    "com.microsoft:GatherBlockQuantized",
    "MatMul",
    "Gather",
)
_PACKED_4BIT = (21, 22)  # onnx.TensorProto.UINT4 / INT4


def has_tokenizer(folder: Path) -> bool:
    """Whether the Hugging Face folder holds a tokenizer (a vocabulary file). A folder without
    one has none: token ids are then synthetic. Settings without a vocabulary are refused: from
    them transformers makes up a tokenizer with an empty vocabulary for some model types (Gemma),
    which would pass for the model's."""
    settings = orphan_tokenizer_settings(folder)
    if settings is not None:
        raise ValueError(tokenizer_refusal(folder, settings))
    return any((Path(folder) / name).is_file() for name in TOKENIZER_VOCABULARY)


def tokenizer_refusal(folder: Path, settings: str) -> str:
    return f"{Path(folder) / settings}: {TOKENIZER_WHY}; {tokenizer_fix(settings)}"


def hf_input(model: ModelArtifact, ctx: PassContext, pass_name: str) -> tuple[Path, list[str]]:
    """The input as a Hugging Face folder (config.json, weights, tokenizer) and notes: an ``hf``
    input as it is; a ``torch`` factory's (model, tokenizer) saved as one (see ``_factory_folder``)."""
    if model.format == "hf":
        folder = Path(model.path)
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} is not a Hugging Face folder: it has no config.json")
        return folder, []
    return _factory_folder(model, ctx, pass_name)


def _factory_folder(model: ModelArtifact, ctx: PassContext, pass_name: str) -> tuple[Path, list[str]]:
    """A factory's (model, tokenizer) saved with ``save_pretrained``.

    A factory may train its model (the example decoder trains for half a minute), and every
    decoder export of a workflow starts from it, so the folder is kept in the store's pass cache,
    shared by the decoder passes (``passcache/hf-factory/<key>``), keyed by the input's digest
    (the factory file, function and arguments) and the versions of torch, transformers and
    tokenizers. It is written to a scratch folder and renamed into place whole, with its digest
    beside it; a folder whose files no longer give that digest is built again, never served."""
    from engine.core import library_versions, sha256_json
    from passes.common import cached_folder
    from passes.export.sources import factory_spec

    function = factory_spec(model)[1]
    if ctx.cache_dir is None:
        return _save_factory(model, Path(ctx.workdir) / "hf", pass_name), [
            f"saved {function}()'s model and tokenizer as a Hugging Face folder"
        ]
    key = sha256_json({"input": model.digest, "libraries": library_versions(("torch", "transformers", "tokenizers"))})[:32]
    root = Path(ctx.cache_dir).parent / "hf-factory"
    folder = root / key
    if cached_folder.checked(folder, "hf"):
        return folder, [f"{function}()'s model and tokenizer from the store's factory cache ({key[:12]})"]
    scratch = Path(ctx.workdir) / "hf"
    if scratch.exists():
        shutil.rmtree(scratch)
    _save_factory(model, scratch, pass_name)
    root.mkdir(parents=True, exist_ok=True)
    if not cached_folder.keep(folder, "hf", lambda staged: shutil.copytree(scratch, staged)):
        return scratch, [f"saved {function}()'s model and tokenizer as a Hugging Face folder"]
    return folder, [f"saved {function}()'s model and tokenizer as a Hugging Face folder, kept in the store's factory cache ({key[:12]})"]


def _save_factory(model: ModelArtifact, folder: Path, pass_name: str) -> Path:
    from passes.export.sources import call_factory, factory_spec

    function = factory_spec(model)[1]
    made = call_factory(model)
    if not (isinstance(made, tuple) and len(made) == 2 and hasattr(made[0], "save_pretrained") and hasattr(made[1], "save_pretrained")):
        raise ValueError(
            f"{function}() must return (PreTrainedModel, tokenizer) for the {pass_name} pass: a transformers causal LM and its tokenizer"
        )
    folder.mkdir(parents=True, exist_ok=True)
    made[0].save_pretrained(folder)
    made[1].save_pretrained(folder)
    return folder


def execution_provider_of(fingerprint: dict[str, Any] | None) -> str:
    """The ONNX Runtime GenAI execution provider a decoder is built for on the target with this
    fingerprint: ``cuda`` for an onnxruntime target on a CUDA GPU (or TensorRT, whose fallback
    is CUDA), ``dml`` for DirectML, ``cuda`` for an ``onnxruntime-genai`` target with device
    cuda; ``cpu`` otherwise (no target, a CPU target, another runtime)."""
    if not fingerprint:
        return "cpu"
    options = fingerprint.get("options") or {}
    if fingerprint.get("runtime") == "onnxruntime-genai":
        device = str(options.get("device") or "cpu").lower()
        return "cuda" if device in ("cuda", "gpu") else "dml" if device == "dml" else "cpu"
    target = ort_target_of(fingerprint)
    provider = target.gpu_provider if target is not None else None
    if provider == "DmlExecutionProvider":
        return "dml"
    if provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider"):
        return "cuda"
    return "cpu"


def external_files(proto: onnx.ModelProto) -> set[str]:
    """Names of the external-data files the model's initializers point to."""
    found = set()
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                found.add(Path(entry.value).name)
    return found


def weights_bytes(proto: onnx.ModelProto) -> int:
    """Bytes of the model's initializers (inline or external), from their types and shapes."""
    import onnx

    total = 0
    for tensor in proto.graph.initializer:
        count = 1
        for dim in tensor.dims:
            count *= int(dim)
        if tensor.data_type in _PACKED_4BIT:
            total += (count + 1) // 2
        else:
            total += count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return total


def decoder_facts(folder: Path) -> dict[str, Any]:
    """What a report shows about a decoder folder: key op counts, weight bytes, files and sizes."""
    import onnx

    from passes.common.graph_tools import qualified_op_counts

    proto = onnx.load(str(folder / MODEL_FILE), load_external_data=False)
    counts = qualified_op_counts(proto)
    return {
        "ops": {op.split(":")[-1]: counts[op] for op in KEY_OPS if counts.get(op)},
        "nodes": sum(counts.values()),
        "weights_bytes": weights_bytes(proto),
        "files": {item.name: item.stat().st_size for item in sorted(folder.iterdir()) if item.is_file()},
        "inputs": [value.name for value in proto.graph.input],
        "outputs": [value.name for value in proto.graph.output],
    }


#: the block sizes ONNX Runtime's MatMulNBits kernels take (contrib_ops/cpu/quantization/matmul_nbits.cc:
#: "Only block sizes 16, 32, 64, 128, and 256 are supported"); a model with another fails when opened
MATMULNBITS_BLOCKS = (16, 32, 64, 128, 256)


def unsupported_blocks(model_file: Path) -> dict[int, list[str]]:
    """MatMulNBits nodes whose block_size ONNX Runtime cannot run, by block size (node names)."""
    import onnx

    found: dict[int, list[str]] = {}
    for node in onnx.load(str(model_file), load_external_data=False).graph.node:
        if node.op_type != "MatMulNBits":
            continue
        block = next((int(a.i) for a in node.attribute if a.name == "block_size"), None)
        if block is not None and block not in MATMULNBITS_BLOCKS:
            found.setdefault(block, []).append(node.name)
    return found


class GenaiPass(OnnxPass):
    """Base of passes that write a ``genai`` folder: the ONNX checks, plus a genai_config.json
    that names the model file."""

    produces = "genai"

    def check_output(self, result: PassResult, ctx: PassContext) -> None:
        super().check_output(result, ctx)
        config_file = Path(result.model.path) / GENAI_CONFIG
        if not config_file.is_file():
            raise ValueError(f"the output folder has no {GENAI_CONFIG}")
        decoder = json.loads(config_file.read_text()).get("model", {}).get("decoder", {})
        if decoder.get("filename") != MODEL_FILE:
            raise ValueError(f"{GENAI_CONFIG} names the decoder file {decoder.get('filename')!r}, not {MODEL_FILE}")
        blocks = unsupported_blocks(Path(result.model.path) / MODEL_FILE)
        if blocks:
            shown = "; ".join(f"block_size {size} in {len(names)} node(s), e.g. {names[0]}" for size, names in sorted(blocks.items()))
            raise ValueError(
                f"the model holds MatMulNBits that ONNX Runtime cannot open ({shown}): its kernels take block sizes "
                f"{', '.join(map(str, MATMULNBITS_BLOCKS))}. A quantized checkpoint with group_size -1 (one group per row) "
                "becomes a block of the whole row; quantize with group_size 32, 64 or 128 instead"
            )
