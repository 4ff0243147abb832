"""Typed, strict, frozen configuration: the base every pass, evaluator and target config extends."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from pydantic import BaseModel, ConfigDict

ID_PATTERN = r"^[A-Za-z][A-Za-z0-9_\-]*$"
"""Names a person chooses (workflow, step, target, evaluation): they also name files and folders,
so a letter first, then letters, digits, '_' and '-': never a '/', a '..' or an absolute path."""


class StrictConfig(BaseModel):
    """Unknown keys are errors, values are validated, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    def to_json(self) -> dict[str, Any]:
        """The full config with defaults included: what enters a cache key."""
        return self.model_dump(mode="json")


def library_versions(distributions: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    """Installed versions of the named distributions (``None`` when one is not installed)."""
    versions: dict[str, str | None] = {}
    for name in distributions:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
