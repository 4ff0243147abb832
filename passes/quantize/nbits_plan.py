"""Per-node precision for ``int4_weights``: which MatMul / Gather nodes get other bits or another
block size than the pass's defaults, and which stay float.

A plan comes from two places, applied in this order (a later one wins for a node):

1. the model itself: ``mixed_precision`` writes its choice into the ONNX model's metadata
   (``metadata_props`` entry ``kiln.mixed_precision``, JSON ``{"default": {...}, "overrides":
   {node name: {"bits": 8}}}``), as Olive's ``SelectiveMixedPrecision`` writes
   ``mixed_precision_info`` into the model's attributes for the quantizer that follows. Being in
   the model, the choice is part of the model's digest, so the quantizing job's key follows it;
2. the step's own ``overrides`` option: node names or shell-style patterns (``*``, ``?``, ``[``)
   mapped to ``{"bits": 8}``, ``{"bits": 16}`` (kept float, as Olive's ``high_bits: 16``) and/or
   ``{"block_size": 64}`` (Olive's ``customized_weight_config``, whose ``group_size`` is our
   ``block_size``).
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import onnx

#: the metadata_props entry mixed_precision writes and int4_weights reads (then removes)
METADATA_KEY = "kiln.mixed_precision"
#: bits meaning "keep this node in float" (Olive's PrecisionBits.BITS16)
FLOAT_BITS = 16
_PATTERN_CHARS = frozenset("*?[")


class NodeOverride(BaseModel):
    """One node's (or pattern's) precision, where it differs from the pass's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bits: Literal[4, 8, 16] | None = Field(None, description="4 or 8 bits, or 16: keep the node in float. null: the pass's bits.")
    block_size: Literal[16, 32, 64, 128, 256] | None = Field(None, description="This node's block size. null: the pass's block_size.")


@dataclass(frozen=True, order=True)
class Spec:
    """What a node is quantized to: ``bits`` (16: left float) and ``block_size``."""

    bits: int
    block_size: int


def is_pattern(name: str) -> bool:
    return any(char in _PATTERN_CHARS for char in name)


def read_metadata(model: onnx.ModelProto) -> dict[str, Any] | None:
    """The plan ``mixed_precision`` wrote into ``model``, or None."""
    for entry in model.metadata_props:
        if entry.key == METADATA_KEY:
            return dict(json.loads(entry.value))
    return None


def write_metadata(model: onnx.ModelProto, plan: dict[str, Any]) -> None:
    """Store ``plan`` in ``model``'s metadata (replacing an earlier one), canonically serialized."""
    drop_metadata(model)
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(plan, sort_keys=True, separators=(",", ":"))


def drop_metadata(model: onnx.ModelProto) -> bool:
    kept = [entry for entry in model.metadata_props if entry.key != METADATA_KEY]
    if len(kept) == len(model.metadata_props):
        return False
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    return True


def resolve_specs(
    candidates: list[str], default: Spec, layers: list[dict[str, NodeOverride]]
) -> tuple[dict[str, Spec], list[str], list[str]]:
    """Each candidate's spec where it differs from ``default``, after applying ``layers`` of
    overrides in order (exact names and patterns; within a layer an exact name beats a pattern).

    Returns (specs, unknown exact names, patterns that matched nothing), the last two per layer
    flattened: the caller decides whether they are errors."""
    specs: dict[str, Spec] = {}
    unknown: list[str] = []
    unmatched: list[str] = []
    known = set(candidates)
    for layer in layers:
        for key in sorted(layer, key=lambda k: (not is_pattern(k), k)):  # patterns first, exact names last (they win)
            names = [n for n in candidates if fnmatch.fnmatchcase(n, key)] if is_pattern(key) else ([key] if key in known else [])
            if not names:
                (unmatched if is_pattern(key) else unknown).append(key)
            override = layer[key]
            for name in names:
                current = specs.get(name, default)
                specs[name] = Spec(override.bits or current.bits, override.block_size or current.block_size)
    return {name: spec for name, spec in specs.items() if spec != default}, unknown, unmatched


def metadata_overrides(plan: dict[str, Any] | None) -> dict[str, NodeOverride]:
    if not plan:
        return {}
    return {name: NodeOverride(**value) for name, value in dict(plan.get("overrides") or {}).items()}


def groups(specs: dict[str, Spec]) -> dict[Spec, list[str]]:
    """The nodes of each spec, specs in order, names sorted."""
    found: dict[Spec, list[str]] = {}
    for name in sorted(specs):
        found.setdefault(specs[name], []).append(name)
    return dict(sorted(found.items()))
