"""Olive's external-data options (``save_as_external_data``, ``all_tensors_to_one_file``,
``external_data_name``, ``size_threshold``, ``convert_attribute``), shared by the ONNX passes that
take them, and the save that follows them. Left at their defaults the model is written as every
ONNX pass writes it (``save_onnx``: one file, weights over ~1.8 GB as external data)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, NonNegativeInt, field_validator

from engine.core import PassConfig
from passes.common.onnx_io import EXTERNAL_DATA_FILE, MODEL_FILE, clamp_ir_version, save_onnx

if TYPE_CHECKING:
    import onnx


class ExternalDataOptions(PassConfig):
    save_as_external_data: bool = Field(
        False,
        description="Write the weights to a separate file beside model.onnx (a model over ~1.8 GB is written so regardless).",
    )
    all_tensors_to_one_file: bool = Field(
        True, description="With save_as_external_data: all weights in one file (external_data_name); false: one file per tensor."
    )
    external_data_name: str | None = Field(
        None, description=f"With save_as_external_data and all_tensors_to_one_file: the data file's name (null: {EXTERNAL_DATA_FILE})."
    )
    size_threshold: NonNegativeInt = Field(
        1024, description="With save_as_external_data: only tensors of at least this many bytes go to the data file (0: all)."
    )
    convert_attribute: bool = Field(False, description="With save_as_external_data: tensors held in node attributes go out too.")

    @field_validator("external_data_name")
    @classmethod
    def _plain_name(cls, name: str | None) -> str | None:
        if name is not None and (not name or "/" in name or "\\" in name or name in (".", "..", MODEL_FILE)):
            raise ValueError(f"external_data_name is a file name beside {MODEL_FILE}, not {name!r}")
        return name


def save_with_options(model: onnx.ModelProto, out_dir: Path, options: ExternalDataOptions) -> Path:
    """Save ``model`` as ``out_dir/model.onnx`` following ``options``."""
    import onnx

    if not options.save_as_external_data:
        return save_onnx(model, out_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    clamp_ir_version(model)
    path = out_dir / MODEL_FILE
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=options.all_tensors_to_one_file,
        location=options.external_data_name or EXTERNAL_DATA_FILE,
        size_threshold=options.size_threshold,
        convert_attribute=options.convert_attribute,
    )
    return path
