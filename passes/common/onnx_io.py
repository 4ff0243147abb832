"""Writing and checking ONNX files so that the runtime that consumes them can load them.

onnx 1.23 writes IR 14 / opset 28 by default, which onnxruntime 1.31 refuses ("Unsupported model
IR version"); every pass that writes ONNX goes through ``save_onnx``, which clamps both.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from engine.core import Pass, PassContext, PassResult

if TYPE_CHECKING:
    import onnx

MODEL_FILE = "model.onnx"
EXTERNAL_DATA_FILE = "model.onnx.data"
#: protobuf cannot serialize a message over 2 GiB: larger weights go to external data
EXTERNAL_DATA_THRESHOLD = 1_800_000_000

# The highest IR version and default-domain opset each onnxruntime release loads. Kept by hand:
# onnxruntime exposes no API for it. Releases not listed take the entry of the nearest older one.
_ORT_LIMITS: list[tuple[tuple[int, int], tuple[int, int]]] = [
    ((1, 16), (9, 19)),
    ((1, 18), (10, 21)),
    ((1, 20), (10, 21)),
    ((1, 22), (11, 22)),
    ((1, 23), (11, 23)),
    ((1, 24), (12, 24)),
    ((1, 31), (13, 26)),
]


def ort_limits() -> tuple[int, int]:
    """(max IR version, max opset) of the installed onnxruntime."""
    import onnxruntime

    major, minor = (int(part) for part in onnxruntime.__version__.split(".")[:2])
    limits = _ORT_LIMITS[0][1]
    for version, bound in _ORT_LIMITS:
        if (major, minor) >= version:
            limits = bound
    return limits


def default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 0


def clamp_ir_version(model: onnx.ModelProto) -> onnx.ModelProto:
    """Lower the IR version to what onnxruntime loads (the opset is the exporter's choice and is
    checked, not rewritten: rewriting opsets changes semantics)."""
    max_ir, _ = ort_limits()
    if model.ir_version > max_ir:
        model.ir_version = max_ir
    return model


def save_onnx(model: onnx.ModelProto, out_dir: Path) -> Path:
    """Save ``model`` as ``out_dir/model.onnx`` (weights over ~1.8 GB as external data)."""
    import onnx

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    clamp_ir_version(model)
    path = out_dir / MODEL_FILE
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    if weight_bytes > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(
            model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=EXTERNAL_DATA_FILE, size_threshold=1024
        )
    else:
        onnx.save_model(model, str(path))
    return path


def check_onnx(path: Path, checker: bool = True) -> None:
    """Raise ValueError unless ``path`` passes the loadability check candidates get
    (``engine.core.loadable.onnx_load_problem``: onnx.checker, its external data files, its op
    domains, every graph output produced by a node) and fits onnxruntime's limits. A ``genai``
    decoder holds onnxruntime's own ops in the default domain (SimplifiedLayerNormalization,
    written by ONNX Runtime GenAI's model builder): the check judges those as onnxruntime's.
    ``checker=False`` skips the loadability check (only the limits are checked)."""
    import onnx

    from engine.core.loadable import onnx_load_problem

    if checker:
        problem = onnx_load_problem(Path(path))
        if problem is not None:
            raise ValueError(f"{Path(path).name} is not a model onnxruntime can load: {problem}")
    model = onnx.load(str(path), load_external_data=False)
    max_ir, max_opset = ort_limits()
    if model.ir_version > max_ir:
        raise ValueError(f"IR version {model.ir_version} is above {max_ir}, the highest the installed onnxruntime loads")
    opset = default_opset(model)
    if opset > max_opset:
        raise ValueError(f"opset {opset} is above {max_opset}, the highest the installed onnxruntime loads")


class OnnxPass(Pass):
    """Base of passes that write ONNX (or a ``genai`` / ``seq2seq`` folder of ONNX files): the
    output gets the loadability check candidates get (``check_onnx``) and the runtime's IR / opset
    limits before it is accepted, so a pass never reports success for a model no runtime opens."""

    produces = "onnx"

    def check_output(self, result: PassResult, ctx: PassContext) -> None:
        super().check_output(result, ctx)
        if result.model.format == SEQ2SEQ_FORMAT:  # an encoder and a decoder: each checked
            for name in seq2seq_parts(result.model.path):
                check_onnx(Path(result.model.path) / name)
            return
        check_onnx(result.model.model_file)


#: an encoder-decoder folder (``passes.common.seq2seq_folder``): seq2seq.json names its two parts
SEQ2SEQ_FORMAT, SEQ2SEQ_MANIFEST, SEQ2SEQ_PARTS = "seq2seq", "seq2seq.json", ("encoder", "decoder")


def seq2seq_parts(folder: Path) -> list[str]:
    """The ONNX files seq2seq.json names, encoder first; ValueError naming the file and the key."""
    import json

    path = Path(folder) / SEQ2SEQ_MANIFEST
    try:
        document = json.loads(path.read_text())
        names = [str(document[part]["filename"]) for part in SEQ2SEQ_PARTS]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path}: expected {{'encoder': {{'filename': ...}}, 'decoder': {{'filename': ...}}}} ({type(error).__name__}: {error})"
        ) from error
    missing = [name for name in names if not (Path(folder) / name).is_file()]
    if missing:
        raise ValueError(f"{path} names {', '.join(missing)}, which {folder} does not hold")
    return names
