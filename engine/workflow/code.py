"""The code a workflow runs: every Python file it names whose code Kiln executes.

A workflow file is as powerful as code: a torch ``factory``, a custom evaluator's ``file``, an
accuracy ``postprocess`` or a custom data source's ``file`` runs with the user's rights (in a
worker process, not in the engine).
``engine validate`` and ``engine plan`` list them so nobody runs a workflow without seeing them.
An input ``package`` is not on the list: its files are read, its code is never imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.refs import RefKind, reference_fields
from engine.workflow.resolve import ResolvedWorkflow


@dataclass(frozen=True)
class CodeUse:
    where: str  # the key path that names it
    file: Path
    function: str | None

    def render(self) -> str:
        function = f", function {self.function}" if self.function else ""
        return f"{self.where}: {self.file}{function}"


def code_of(resolved: ResolvedWorkflow) -> list[CodeUse]:
    """Every piece of code the workflow runs, in file order."""
    uses: list[CodeUse] = []
    if resolved.input.format == "torch":
        uses.append(CodeUse("input.factory", resolved.input.path, resolved.input.attrs.get("function")))
    for name, data in resolved.datasets.items():
        uses += _code_options(data.cls, data.config, f"data.{name}")
    for index, entry in enumerate(resolved.evaluators.values()):
        uses += _code_options(entry.cls, entry.config, f"evaluate[{index}].config")
    return uses


def _code_options(cls: Any, config: dict[str, Any], where: str) -> list[CodeUse]:
    """The options of a plugin's config that name Python it loads as code."""
    uses = []
    for option, ref in reference_fields(cls.Config).items():
        value = config.get(option)
        if ref.kind != RefKind.FILE:
            continue
        # a path option whose file is Python is loaded as code (spec_from_file_location needs .py)
        if isinstance(value, str) and (ref.code or value.endswith(".py")):
            function = config.get("function")
            uses.append(CodeUse(f"{where}.{option}", Path(value), function if isinstance(function, str) else None))
    return uses
