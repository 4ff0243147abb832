"""The code a workflow runs: every Python file it names whose code Kiln executes.

A workflow file is as powerful as code: a torch ``factory``, a custom evaluator's ``file``, an
accuracy ``postprocess`` or a custom data source's ``file`` runs with the user's rights (in a
worker process, not in the engine).
``engine validate`` and ``engine plan`` list them so nobody runs a workflow without seeing them.
An input ``package`` is not on the list: its files are read, its code is never imported. An
input with ``trust_remote_code: true`` is: transformers runs the Python files of its folder (a
Hub model's, listed from the cache, or from the Hub's listing when `engine run` has yet to
download them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.refs import RefKind, reference_fields
from engine.workflow.resolve import InputModel, ResolvedWorkflow


@dataclass(frozen=True)
class CodeUse:
    where: str  # the key path that names it
    file: Path
    function: str | None
    note: str | None = None  # what the file is, where its path alone does not say

    def render(self) -> str:
        function = f", function {self.function}" if self.function else ""
        note = f" ({self.note})" if self.note else ""
        return f"{self.where}: {self.file}{function}{note}"


def code_of(resolved: ResolvedWorkflow) -> list[CodeUse]:
    """Every piece of code the workflow runs, in file order."""
    uses: list[CodeUse] = []
    if resolved.input.format == "torch":
        uses.append(CodeUse("input.factory", resolved.input.path, resolved.input.attrs.get("function")))
    if resolved.input.attrs.get("trust_remote_code"):
        uses += _remote_code(resolved.input)
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


def _remote_code(model: InputModel) -> list[CodeUse]:
    """The Python files transformers may run for an input with trust_remote_code: those at the
    top of its folder (a Hub model's, downloaded by `engine run` when the cache lacks them)."""
    where = "input.trust_remote_code"
    hub = model.hub
    if hub is not None:
        note = (
            "remote code of the Hub model"
            if hub.present
            else f"remote code of the Hub model, downloaded by `engine run` from {hub.repo_id}"
        )
        uses = [CodeUse(where, hub.folder / name, None, note) for name in hub.code]
        return uses or [CodeUse(where, Path(hub.repo_id), None, f"remote code: {hub.repo_id} at {hub.revision} lists no .py file")]
    try:
        files = sorted(p for p in model.path.iterdir() if p.suffix == ".py" and p.is_file())
    except OSError:
        files = []
    return [CodeUse(where, file, None, "remote code of the model folder") for file in files] or [
        CodeUse(where, model.path, None, "remote code: the folder holds no .py file")
    ]
