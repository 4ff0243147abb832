"""The model's lineage written into the ONNX file's ``metadata_props``: Olive's
``AddOliveMetadata``. What Kiln knows of the input goes under ``kiln.*`` keys (with
``lineage: true``, Olive's ``add_optimization_info``): the Kiln version, the step that wrote it,
the input artifact's digest and format (Olive's ``model_hash``), and from the input's attributes
the Hugging Face model id, commit and task when the workflow's input was a hub model. The
config's ``metadata`` (Olive's ``custom_metadata``) adds the user's own keys, and ``graph_name``
renames the graph. Metadata already in the model is kept; a key given again is replaced.

Deterministic: no timestamps, no paths, keys written sorted, so the same input and config give the
same bytes. The step id is part of what is written: a job shared by two steps (same input, same
config) carries the id of the step that ran it first.
"""

from __future__ import annotations

from importlib import metadata as distributions
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from engine.core import ModelArtifact, PassContext, PassResult
from passes.common.external_data import ExternalDataOptions, save_with_options
from passes.common.onnx_io import OnnxPass
from passes.common.pass_io import onnx_output

PREFIX = "kiln."


class AddMetadata(OnnxPass):
    name = "add_metadata"
    summary = "Write the model's lineage and user metadata into the ONNX file's metadata_props (Olive's AddOliveMetadata)."
    version = "1"
    accepts = ("onnx", "genai")
    produces = "onnx"
    keeps = ("genai",)
    libraries = ("onnx", "kiln-engine")

    class Config(ExternalDataOptions):
        metadata: dict[str, str | int | float | bool] = Field(
            default_factory=dict, description="Keys and values to add (values written as text); Olive's custom_metadata."
        )
        graph_name: str | None = Field(None, description="A new name for the ONNX graph (null: keep its name).")
        lineage: bool = Field(
            True,
            description=f"Write {PREFIX}* keys: Kiln's version, the step, the input's digest and format, its hub model and task when known.",
        )

        @field_validator("metadata")
        @classmethod
        def _own_keys(cls, values: dict[str, Any]) -> dict[str, Any]:
            taken = sorted(key for key in values if key.startswith(PREFIX) or not key)
            if taken:
                raise ValueError(f"keys starting with {PREFIX!r} are Kiln's lineage (and a key is not empty): {taken}")
            return dict(sorted(values.items()))

    config: Config

    def run(self, model: ModelArtifact, ctx: PassContext) -> PassResult:
        import onnx

        cfg = self.config
        proto = onnx.load(str(model.model_file))  # external data is read in too
        existing = {entry.key: entry.value for entry in proto.metadata_props}
        added = {key: _text(value) for key, value in cfg.metadata.items()}
        if cfg.lineage:
            added.update(lineage(model, ctx))
        props = {**existing, **added}
        onnx.helper.set_model_props(proto, dict(sorted(props.items())))
        if cfg.graph_name is not None:
            proto.graph.name = cfg.graph_name
        save_with_options(proto, Path(ctx.output_dir), cfg)
        details = {
            "added": added,
            "replaced": sorted(key for key in added if key in existing and existing[key] != added[key]),
            "kept": sorted(key for key in existing if key not in added),
            "graph_name": proto.graph.name,
        }
        return onnx_output(model, ctx, details, [])


def _text(value: str | int | float | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def lineage(model: ModelArtifact, ctx: PassContext) -> dict[str, str]:
    """What the pass context and the input artifact say of the model, as ``kiln.*`` keys."""
    try:
        version = distributions.version("kiln-engine")
    except distributions.PackageNotFoundError:
        version = "unknown"
    found = {
        f"{PREFIX}version": version,
        f"{PREFIX}step": ctx.step_id,
        f"{PREFIX}input_digest": model.digest,
        f"{PREFIX}input_format": model.format,
    }
    attrs = model.attrs or {}
    for attr, key in (("model", "hf_model"), ("commit", "hf_commit"), ("task", "task")):
        value = attrs.get(attr)
        if isinstance(value, str) and value:
            found[f"{PREFIX}{key}"] = value
    return found
