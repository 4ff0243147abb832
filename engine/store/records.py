"""The shapes of the store's key records, checked on every read.

A record is trusted only when its key document hashes to the key it is filed under and its fields
have the types the runner reads. Anything else (a hand edit, a truncated write, a record from a
different engine) is a miss: the job runs again and overwrites it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt, TypeAdapter, ValidationError

from engine.core.artifact import known_format
from engine.core.hashing import sha256_json

Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _known(name: str) -> str:
    if not known_format(name):
        raise ValueError(f"unknown model format {name!r}")
    return name


Format = Annotated[str, AfterValidator(_known)]  # any registered format, plugins' included


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    key_doc: dict[str, Any]
    duration_s: StrictFloat | StrictInt | None = None


class PassRecord(_Record):
    kind: Literal["pass"]
    digest: Digest
    format: Format
    attrs: dict[str, Any] = {}
    details: dict[str, Any] = {}
    notes: list[str] = []


class EvalRecord(_Record):
    kind: Literal["eval"]
    values: dict[str, StrictFloat | StrictInt | None]
    details: dict[str, Any] = {}


class DatasetRecord(_Record):
    kind: Literal["dataset"]
    digest: Digest
    samples: StrictInt | None = None
    inputs: dict[str, list[int]] = {}


_ADAPTER: TypeAdapter[PassRecord | EvalRecord | DatasetRecord] = TypeAdapter(
    Annotated[PassRecord | EvalRecord | DatasetRecord, Field(discriminator="kind")]
)


def problem(key: str, record: Any) -> str | None:
    """Why ``record`` cannot be served for ``key``; None when it can."""
    if not isinstance(record, dict):
        return f"holds a {type(record).__name__}, not an object"
    if record.get("key") != key:
        return f"is filed under {key} but names key {record.get('key')!r}"
    doc = record.get("key_doc")
    try:
        actual = sha256_json(doc) if isinstance(doc, dict) else None
    except (TypeError, ValueError):
        actual = None
    if actual != key:
        return "holds a key document that does not hash to its key"
    try:
        _ADAPTER.validate_python(record)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<record>"
        return f"has a bad field {where}: {first['msg']}"
    return None
