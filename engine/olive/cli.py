"""`engine import-olive` and `engine run OLIVE.json`: read an Olive config, translate it, show it."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from engine.core.errors import InputError, Problem
from engine.olive.importer import Translation, is_olive_config, translate
from engine.olive.metrics import shape_problems

NOT_OLIVE = "an Olive RunConfig: `input_model` with an Olive model type (HfModel, PyTorchModel, ONNXModel, OpenVINOModel) and `passes`"


def read_config(path: Path) -> Any:
    """The parsed file, read as a workflow file is (size, nesting, aliases, NaN, duplicate keys
    guarded); unreadable or malformed input is a located InputError."""
    from engine.workflow import read_workflow

    return read_workflow(path).data


def olive_file(path: Path) -> bool:
    """Whether ``path`` is recognisably an Olive config (a Kiln workflow, or anything unreadable, is not)."""
    try:
        if path.suffix.lower() not in (".json", ".yaml", ".yml") or not path.is_file():
            return False
        return is_olive_config(read_config(path))
    except (InputError, OSError):  # a name too long, a FIFO, no permission: not an Olive config either
        return False


def olive_hint(path: Path) -> str:
    """For `engine validate`: a line saying that a file Kiln refused is an Olive config, and what to run."""
    return (
        f"\n{path} is an Olive config: `engine import-olive {path}` translates it, `engine run {path}` runs it" if olive_file(path) else ""
    )


def load_translation(path: Path, dest_dir: Path) -> Translation:
    data = read_config(path)
    if not is_olive_config(data):
        given = "a Kiln workflow" if isinstance(data, dict) and ("steps" in data or "version" in data) else type(data).__name__
        if isinstance(data, dict) and given == "dict":
            given = f"keys {', '.join(sorted(map(str, data))[:8]) or '(none)'}"
        raise InputError(
            [
                Problem(
                    "",
                    "not an Olive config",
                    expected=NOT_OLIVE,
                    given=given,
                    hint="give the JSON or YAML file you run with `olive run --config`",
                    file=str(path),
                )
            ]
        )
    wrong = shape_problems(data)
    if wrong:
        raise InputError(
            [
                Problem(
                    where,
                    "has the wrong type for an Olive config",
                    expected=expected,
                    given=given,
                    hint="fix it as Olive's schema says",
                    file=str(path),
                )
                for where, expected, given in wrong
            ]
        )
    translation = translate(data, path, dest_dir)
    translation.problems = validation_problems(translation, path, dest_dir)
    return translation


#: the keys of a problem that only says a Hub model or dataset is not in this machine's cache
CACHE_KEYS = ("input.model", "input.revision")


def awaits_cache(problem: Problem) -> bool:
    """Whether a validation problem says only that a Hub model or dataset is not in the local cache
    (fetched on a connected machine, it goes away), not that the workflow is wrong."""
    if problem.message.startswith("unknown key"):
        return False
    if problem.where in CACHE_KEYS:
        return True
    parts = problem.where.split(".")
    return len(parts) >= 2 and parts[0] == "data" and "not in the Hugging Face datasets cache" in problem.message


def validation_problems(translation: Translation, source: Path, dest_dir: Path) -> list[Problem]:
    """The translated workflow run through Kiln's validator as it will be written (into ``dest_dir``, where
    its relative paths hold): every problem it has. One written where it cannot be checked is told in a note."""
    from engine.workflow import load_workflow

    text = to_yaml(translation, source)
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=".kiln-import-", suffix=".yaml", dir=dest_dir)
    except OSError as error:
        translation.notes.append(f"the workflow was not validated: {dest_dir} cannot be written ({error.strerror or error})")
        return []
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        load_workflow(Path(name))
    except InputError as error:
        return [_relocated(problem, dest_dir) for problem in error.problems]
    finally:
        Path(name).unlink(missing_ok=True)
    return []


def _relocated(problem: Problem, dest_dir: Path) -> Problem:
    """A problem of the scratch copy, named by the folder the workflow goes to (the copy is gone)."""
    if problem.file and Path(problem.file).name.startswith(".kiln-import-"):
        return dataclasses.replace(problem, file=str(dest_dir / "<imported workflow>"))
    return problem


def to_yaml(translation: Translation, source: Path) -> str:
    header = f"# Translated from the Olive config {source.name} by `engine import-olive`.\n"
    if translation.unmapped:
        header += "# Not carried over:\n" + "".join(f"#   {where}: {why}\n" for where, why in translation.unmapped)
    if translation.notes:  # how the carried keys were carried (a pass folded into another, a stand-in): said in the file too
        header += "# Notes:\n" + "".join(f"#   {' '.join(note.split())}\n" for note in translation.notes)
    body = yaml.safe_dump(translation.workflow, sort_keys=False, default_flow_style=None, width=120, allow_unicode=True)
    return header + str(body)


def print_translation(translation: Translation, text: str | None = None) -> None:
    from rich.table import Table

    from engine.report.report import console

    if text is not None:
        console.print(text, markup=False, highlight=False)
    if translation.unmapped:
        table = Table(title="Olive keys not carried over")
        table.add_column("key")
        table.add_column("why")
        for where, why in translation.unmapped:
            table.add_row(where, why)
        console.print(table)
    else:
        console.print("every Olive key was carried over")
    for note in translation.notes:
        console.print(f"note: {note}", markup=False, highlight=False)


def import_command(config: Path, output: Path | None) -> int:
    """`engine import-olive CONFIG [-o workflow.yaml]`: write (or print) the workflow, then what was not carried over."""
    dest = output.parent if output else Path.cwd()
    translation = load_translation(config, dest)
    text = to_yaml(translation, config)
    if output:
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text, encoding="utf-8")
        except OSError as error:
            raise InputError(
                [Problem("-o", f"cannot be written: {error.strerror or error}", given=str(output), hint="choose another -o")]
            ) from error
        print(f"wrote {output} (from {config})")
        print_translation(translation)
        _told(output, translation)
    else:
        print_translation(translation, text)
    return 0


def run_path(config: Path) -> Path:
    """For `engine run OLIVE.json`: the translation shown and written beside the Olive file; its path."""
    target = config.with_name(f"{config.stem}.from-olive.yaml")
    translation = load_translation(config, target.parent)
    text = to_yaml(translation, config)
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as error:
        raise InputError(
            [Problem("", f"the translated workflow cannot be written: {error}", given=str(target), file=str(config))]
        ) from error
    print_translation(translation, text)
    print(f"running {target} (translated from {config})")
    return target


def _told(path: Path, translation: Translation) -> None:
    """What Kiln's validator said of the written workflow; what still needs a hand (a Hub model or dataset
    to fetch, say) is told, not fatal."""
    if not translation.problems:
        print(f"{path}: valid")
        return
    fetch = [p for p in translation.problems if awaits_cache(p)]
    if len(fetch) == len(translation.problems):
        print(f"{path}: valid once these are in the Hugging Face cache:\n{InputError(fetch)}")
    else:
        print(f"{path} does not validate yet (fix it by hand):\n{InputError(translation.problems)}")
