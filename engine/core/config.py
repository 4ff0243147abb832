"""Typed, strict, frozen configuration: the base every pass, evaluator and target config extends."""

from __future__ import annotations

import json
from importlib import metadata
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationInfo, field_validator

ID_PATTERN = r"^[A-Za-z][A-Za-z0-9_\-]*$"
"""Names a person chooses (workflow, step, target, evaluation): they also name files and folders,
so a letter first, then letters, digits, '_' and '-': never a '/', a '..' or an absolute path."""
ID_MAX_LENGTH = 64
"""The longest such name (they name folders, and are shown in tables)."""


MAX_INT_OPTION = 2**31 - 1
"""The largest integer an option holds unless its field says otherwise: counts (threads, runs,
samples) end in C ints, and a count past this is a typo that would run for ever."""


def _integers(value: Any) -> list[int]:
    """The integers in ``value`` and in the lists and mappings it holds (two levels)."""
    found: list[int] = []
    level = [value]
    for _ in range(3):
        nested: list[Any] = []
        for item in level:
            if isinstance(item, int) and not isinstance(item, bool):
                found.append(item)
            elif isinstance(item, (list, tuple)):
                nested.extend(item)
            elif isinstance(item, dict):
                nested.extend(item.values())
        level = nested
    return found


def _bool_only(annotation: Any) -> bool:
    """Whether a field takes a boolean and nothing else (``bool``, ``bool | None``)."""
    if annotation is bool:
        return True
    args = [arg for arg in get_args(annotation) if arg is not type(None)]
    return get_origin(annotation) in (Union, UnionType) and bool(args) and all(arg is bool for arg in args)


def strict_booleans(model: type[BaseModel]) -> None:
    """Make every boolean field of ``model`` strict: it takes true or false only. pydantic's lax
    mode reads "true", "yes", "off", 1 and 0 as booleans; in a workflow file those are typos or
    strings meant for something else, so they are refused (every other field keeps pydantic's
    coercions). Called when a subclass is defined; its schema is rebuilt with the change."""
    changed = False
    for field in model.model_fields.values():
        if _bool_only(field.annotation) and not any(isinstance(meta, Strict) for meta in field.metadata):
            field.metadata.append(Strict())
            changed = True
    if changed:
        model.model_rebuild(force=True)


class StrictConfig(BaseModel):
    """Unknown keys are errors, values are validated, instances are immutable; numbers are
    finite and integers at most ``MAX_INT_OPTION``; a boolean is true or false, never "yes" or 1."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        strict_booleans(cls)

    @field_validator("*", mode="after")
    @classmethod
    def _bounded_integers(cls, value: Any, info: ValidationInfo) -> Any:
        for number in _integers(value):
            if abs(number) > MAX_INT_OPTION:
                raise ValueError(f"{number} is out of range: '{info.field_name}' takes integers up to {MAX_INT_OPTION:,}")
        return value

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


def _requirement(text: str) -> str:
    """A PEP 508 requirement, normalized (``Six == 1.16`` → ``six==1.16``)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        requirement = Requirement(text)
    except InvalidRequirement as error:
        raise ValueError(f"{text!r} is not a valid requirement (PEP 508): {error}") from None
    requirement.name = canonicalize_name(requirement.name)
    return str(requirement)


class EnvironmentSpec(StrictConfig):
    """A virtual environment a target's or a step's jobs run in (engine.execute.environments builds it)."""

    requirements: list[Annotated[str, AfterValidator(_requirement)]] = Field(
        min_length=1,
        description="PEP 508 requirements installed into the environment (e.g. onnxruntime-openvino==1.24.1); Kiln and the main environment's packages stay importable behind them.",
    )

    @field_validator("requirements", mode="after")
    @classmethod
    def _sorted(cls, value: list[str]) -> list[str]:
        return sorted(set(value))

    def key(self, python: str | None = None, platform: str | None = None) -> str:
        """sha256 of (sorted normalized requirements, Python major.minor, platform tag): one
        environment per key. ``python``/``platform`` default to this interpreter's."""
        import hashlib
        import sys
        import sysconfig

        document = {
            "requirements": sorted(set(self.requirements)),
            "python": python or f"{sys.version_info.major}.{sys.version_info.minor}",
            "platform": platform or sysconfig.get_platform(),
        }
        return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()

    def not_built(self) -> str:
        return f"environment {self.key()[:12]} not built yet (built by engine run)"


def _resource_amounts(value: dict[str, float]) -> dict[str, float]:
    for name, amount in value.items():
        if not name or amount <= 0:
            raise ValueError(f"each resource needs a name and an amount above 0 (got {name!r}: {amount!r})")
    return value


class PlacementSpec(StrictConfig):
    """Where a target's jobs may run: only on a node that has every one of ``resources``
    (engine.execute.nodes). A target no node can hold is unavailable, with that reason."""

    resources: Annotated[dict[str, float], AfterValidator(_resource_amounts)] = Field(
        min_length=1,
        description="Resources a node must have, e.g. {gpu_h100: 1}, {GPU: 1} or Ray's {'accelerator_type:H100': 1}; a Ray node's custom resources are given by `ray start --resources`, this machine's by $KILN_NODE_RESOURCES (a JSON object).",
    )
