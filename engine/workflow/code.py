"""The code a workflow runs: every Python file it names whose code Kiln executes.

A workflow file is as powerful as code: a torch ``factory``, a custom evaluator's ``file`` or an
accuracy ``postprocess`` runs with the user's rights (in a worker process, not in the engine).
``engine validate`` and ``engine plan`` list them so nobody runs a workflow without seeing them.
An input ``package`` is not on the list: its files are read, its code is never imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    for index, entry in enumerate(resolved.evaluators.values()):
        fields = reference_fields(entry.cls.Config)
        for option, ref in fields.items():
            value = entry.config.get(option)
            if ref.kind != RefKind.FILE:
                continue
            # a path option whose file is Python is loaded as code (spec_from_file_location needs .py)
            if isinstance(value, str) and (ref.code or value.endswith(".py")):
                function = entry.config.get("function") if isinstance(entry.config.get("function"), str) else None
                uses.append(CodeUse(f"evaluate[{index}].config.{option}", Path(value), function))
    return uses
