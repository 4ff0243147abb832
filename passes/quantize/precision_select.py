"""What ``mixed_precision`` chooses from: a decoder's weight nodes by role and layer, read from their
names (ONNX Runtime GenAI's builder: ``/model/layers.3/attn/qkv_proj/MatMul``, ``/lm_head/MatMul``;
torch exports: ``model.layers.3.mlp.down_proj``), and the sensitivity scores that rank them.

- ``weight_snr`` (Olive's ``snr``, no data): the signal-to-noise ratio of each weight against its
  low-bit round-to-nearest copy; the lowest ratio is the most sensitive.
- ``output_error`` (measured, the ONNX counterpart of Olive's data-driven ``kld_gradient``): each
  unit alone is replaced by its low-bit copy (the rest float) and the model's first output
  (``logits``) is compared with the float model's on calibration samples. One onnxruntime session
  serves every unit: the candidate weights become graph inputs that default to their
  initializers, and each run feeds one unit's copies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

ROLES = ("lm_head", "embeddings", "qkv", "o_proj", "mlp_up", "mlp_down")
_LAYER = re.compile(r"(?:layers|layer|h|blocks)[._](\d+)(?:[./_]|$)")
_ROLE_PATTERNS = {
    "lm_head": re.compile(r"lm_head"),
    "embeddings": re.compile(r"embed"),
    "qkv": re.compile(r"(?:^|[/._])(?:q_proj|k_proj|v_proj|qkv_proj|query|key|value|c_attn)(?:[/._]|$)"),
    "o_proj": re.compile(r"(?:^|[/._])(?:o_proj|out_proj|attn[/._]c_proj|attention[/._]dense|self_attn[/._]dense)(?:[/._]|$)"),
    "mlp_up": re.compile(r"(?:^|[/._])(?:gate_proj|up_proj|gate_up_proj|fc1|c_fc|dense_h_to_4h)(?:[/._]|$)"),
    "mlp_down": re.compile(r"(?:^|[/._])(?:down_proj|fc2|mlp[/._]c_proj|dense_4h_to_h)(?:[/._]|$)"),
}
_SEPARATE_QKV = re.compile(r"(?<![a-z])(q|k|v)_proj")


@dataclass(frozen=True)
class Weight:
    """A candidate node: its name, weight initializer, role (or None), layer index (or None)."""

    node: str
    weight: str
    role: str | None
    layer: int | None
    size: int


def weights_of(model: onnx.ModelProto) -> list[Weight]:
    """The main graph's MatMul nodes with a constant float 2-D weight, and Gather nodes with a
    float embedding table, in graph order."""
    floats = {t.name: t for t in model.graph.initializer if t.data_type in (1, 10, 16) and len(t.dims) == 2}
    logits = {o.name for o in model.graph.output[:1]}
    found = []
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gather") or not node.name:
            continue
        weight = node.input[1] if node.op_type == "MatMul" else node.input[0]
        if weight not in floats:
            continue
        role = next((r for r, p in _ROLE_PATTERNS.items() if p.search(node.name) or p.search(weight)), None)
        if node.op_type == "MatMul" and role is None and set(node.output) & logits:
            role = "lm_head"
        if node.op_type == "Gather" and role != "embeddings":
            continue
        layer = _LAYER.search(node.name) or _LAYER.search(weight)
        size = int(np.prod(floats[weight].dims))
        found.append(Weight(node.name, weight, role, int(layer.group(1)) if layer else None, size))
    return found


def weight_named(name: str, size: int) -> Weight:
    """A candidate known by its name alone (a torch module's, ``model.layers.3.mlp.down_proj``):
    its role and layer read from the name, as ``weights_of`` reads them from ONNX node names."""
    role = next((r for r, p in _ROLE_PATTERNS.items() if p.search(name)), None)
    layer = _LAYER.search(name)
    return Weight(name, name, role, int(layer.group(1)) if layer else None, size)


def k_quant_preset(weights: list[Weight], algorithm: str) -> list[str]:
    """Olive's k_quant_* presets: the LM head; for k_quant_down also the MLP down projection, for
    k_quant_mixed also q/k/v, of the first and last eighth of the layers and every third between."""
    chosen = [w.node for w in weights if w.role == "lm_head"]
    if algorithm == "k_quant_last":
        return chosen
    roles = {"mlp_down", "qkv"} if algorithm == "k_quant_mixed" else {"mlp_down"}
    count = 1 + max((w.layer for w in weights if w.layer is not None), default=-1)
    for w in weights:
        if w.layer is None or w.role not in roles:
            continue
        if w.layer < count / 8 or w.layer >= 7 * count / 8 or (w.layer - count // 8) % 3 == 2:
            chosen.append(w.node)
    return chosen


def by_roles(weights: list[Weight], roles: list[str], first: int, last: int) -> list[str]:
    """The weights of ``roles``; layer roles only in the first ``first`` and last ``last`` layers
    (both 0: every layer)."""
    count = 1 + max((w.layer for w in weights if w.layer is not None), default=-1)
    chosen = []
    for w in weights:
        if w.role not in roles:
            continue
        if w.layer is None or (first == 0 and last == 0) or w.layer < first or w.layer >= count - last:
            chosen.append(w.node)
    return chosen


def units(weights: list[Weight]) -> dict[str, list[Weight]]:
    """Selection units: one per weight, except separate q / k / v projections of one layer, which
    share a precision (fused exports and the builder's GQA need them alike), as in Olive."""
    found: dict[str, list[Weight]] = {}
    for w in weights:
        key = _SEPARATE_QKV.sub("qkv_proj", w.node) if w.role == "qkv" else w.node
        found.setdefault(key, []).append(w)
    return found


def fake_quantize(weight: np.ndarray, bits: int, block_size: int, symmetric: bool) -> np.ndarray:
    """``weight`` [K, N] rounded to ``bits`` per block of ``block_size`` along K and back to float."""
    rows, cols = weight.shape
    blocks = -(-rows // block_size)
    padded = np.zeros((blocks * block_size, cols), dtype=np.float64)
    padded[:rows] = weight
    data = padded.reshape(blocks, block_size, cols)
    if symmetric:
        scale = np.max(np.abs(data), axis=1, keepdims=True) / (2 ** (bits - 1) - 1)
        scale = np.where(scale > 0, scale, 1.0)
        restored = np.clip(np.round(data / scale), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1) * scale
    else:
        low, high = np.min(data, axis=1, keepdims=True), np.max(data, axis=1, keepdims=True)
        scale = np.where(high > low, (high - low) / (2**bits - 1), 1.0)
        zero = np.round(-low / scale)
        restored = (np.clip(np.round(data / scale) + zero, 0, 2**bits - 1) - zero) * scale
    return restored.reshape(blocks * block_size, cols)[:rows].astype(weight.dtype)


def snr_db(clean: np.ndarray, noisy: np.ndarray) -> float:
    signal = float(np.sum(np.square(clean, dtype=np.float64)))
    noise = float(np.sum(np.square(clean.astype(np.float64) - noisy)))
    return 10 * float(np.log10(signal / noise)) if noise > 0 and signal > 0 else 300.0


def promote(scores: dict[str, float], sizes: dict[str, int], ratio: float) -> list[str]:
    """Olive's rule: units in order of sensitivity (highest score first) move to high precision
    until they hold at least ``1 - ratio`` of all the weights."""
    threshold = sum(sizes.values()) * (1 - ratio)
    chosen: list[str] = []
    held = 0
    for unit in sorted(scores, key=lambda u: (-scores[u], u)):
        if held >= threshold:
            break
        chosen.append(unit)
        held += sizes[unit]
    return chosen


def cache_dims(folder: Any) -> dict[str, int]:
    """The symbolic cache dimensions a genai folder's config gives (the head size)."""
    import json
    from pathlib import Path

    config = Path(folder) / "genai_config.json"
    if not config.is_file():
        return {}
    head = json.loads(config.read_text()).get("model", {}).get("decoder", {}).get("head_size")
    return {"kv_cache_dim": int(head), "head_size": int(head)} if head else {}


def decoder_feeds(model: onnx.ModelProto, given: dict[str, np.ndarray], dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """``given`` completed for a decoder with a key/value cache: an empty past (length 0) for
    every ``past_*`` input and an all-ones ``attention_mask`` where the dataset has none. ``dims``:
    values of symbolic dimensions other than batch and lengths (the head size)."""
    dims = dims or {}
    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}
    ids = next(iter(given.values()))
    batch, length = ids.shape[0], ids.shape[1] if ids.ndim > 1 else 1
    feeds = dict(given)
    for value in model.graph.input:
        if value.name in feeds or value.name in initializers:
            continue
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        if "attention_mask" in value.name:
            feeds[value.name] = np.ones((batch, length), dtype=dtype)
            continue
        if not value.name.startswith("past"):
            raise ValueError(f"the calibration data lacks the model input {value.name}")
        shape = [_dim(d, batch, dims, value.name) for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = np.zeros(shape, dtype=dtype)
    return feeds


def _dim(dim: Any, batch: int, dims: dict[str, int], name: str) -> int:
    if not dim.dim_param:
        return int(dim.dim_value)
    if "batch" in dim.dim_param:
        return batch
    if "sequence" in dim.dim_param or "past" in dim.dim_param:
        return 0
    if dim.dim_param in dims:
        return dims[dim.dim_param]
    raise ValueError(f"cannot size the empty cache input {name}: its dimension {dim.dim_param} is not known")


def output_errors(
    model: onnx.ModelProto, groups: dict[str, list[Weight]], batches: list[dict[str, Any]], quantize: Any, dims: dict[str, int]
) -> dict[str, float]:
    """Each unit's relative squared error of the first output when only it is ``quantize``d."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    exposed = type(model)()
    exposed.CopyFrom(model)
    tables = {t.name: t for t in exposed.graph.initializer}
    names = sorted({w.weight for members in groups.values() for w in members})
    for name in names:
        exposed.graph.input.append(helper.make_tensor_value_info(name, tables[name].data_type, list(tables[name].dims)))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(exposed.SerializeToString(), options, providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name
    feeds = [decoder_feeds(model, batch, dims) for batch in batches]
    references = [session.run([output], feed)[0].astype(np.float64) for feed in feeds]
    errors: dict[str, float] = {}
    for unit, members in groups.items():
        swapped = {w.weight: quantize(numpy_helper.to_array(tables[w.weight])) for w in members}
        total = 0.0
        for feed, reference in zip(feeds, references, strict=True):
            value = session.run([output], {**feed, **swapped})[0]
            total += float(np.sum((value - reference) ** 2) / max(np.sum(reference**2), 1e-30))
        errors[unit] = total / len(feeds)
    return errors
