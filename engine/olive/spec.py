"""One Olive pass type's translation: the Kiln pass, how each option carries over, Olive's defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.olive.options import Option


@dataclass(frozen=True)
class PassSpec:
    kiln: str | None  # None: not carried over (``reason`` says why)
    options: dict[str, Option] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    data: str | None = None  # the Kiln option an Olive data_config goes to
    static_only: frozenset[str] = frozenset()
    reason: str = ""
    #: options Kiln cannot carry over, each with why (listed when given a value other than Olive's default)
    dropped: dict[str, str] = field(default_factory=dict)
