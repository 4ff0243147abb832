"""The steps: each pass found, its config typed (the input's task filled in where the pass has an
``InputTask`` option), its references and search checked, and the steps chained."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from engine.core.errors import Problem
from engine.core.refs import RefKind, references
from engine.workflow.resolve import checks
from engine.workflow.resolve.model import InputModel, Step
from engine.workflow.resolve.parts import Parts
from engine.workflow.resolve.plugins import Where, config_model, lookup, validate_config
from engine.workflow.resolve.search import resolve_search
from engine.workflow.schema import StepSpec
from engine.workflow.source import WorkflowSource


def fill_from_workflow(cls: Any, values: dict[str, Any], task: str | None, inferred: bool = False) -> dict[str, str]:
    """Fill the pass's ``InputTask`` options the step leaves out with the input's task (which
    then enters the step's key, as any option does); what was filled, and from where. A task
    ``inferred`` from the input's config.json fills only an option that accepts it: a pass that
    knows fewer tasks keeps its default, as it did before the task was inferred."""
    filled = {}
    for option in references(cls.Config).get(RefKind.TASK, ()):
        if task and option not in values:
            if inferred and task not in _choices(cls.Config, option):
                continue
            values[option] = task
            filled[option] = "config.json architectures" if inferred else "input.task"
    return filled


def _choices(config: Any, option: str) -> tuple[Any, ...]:
    """The values a ``Literal`` option accepts (empty for any other type)."""
    annotation = config.model_fields[option].annotation
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def _step(
    index: int, spec: StepSpec, parts: Parts, task: tuple[str | None, bool], source: WorkflowSource, problems: list[Problem]
) -> Step | None:
    """One step with its pass, typed config and search, or None (and the problems)."""
    where: Where = ("steps", index)
    cls = lookup("passes", spec.pass_, source, (*where, "pass"), problems)
    if cls is None:
        return None
    owner = f"pass '{cls.name}'"
    values = dict(spec.config)
    filled = fill_from_workflow(cls, values, *task)
    typed = validate_config(config_model(cls), values, source, (*where, "config"), owner, problems)
    config = typed.to_json() if typed is not None else None
    problems.extend(checks.dataset_refs(cls, config, parts.data_names, source, (*where, "config")))
    problems.extend(checks.measuring_pass_is_target_dependent(cls, source, where))
    problems.extend(checks.evaluation_refs(cls, config, parts.evaluation_ids, source, where))
    raw = parts.raw_steps[index]
    search = resolve_search(cls, config, raw.get("search"), source, where, owner, problems)
    if config is None:
        return None  # an invalid fixed value is reported already
    problems.extend(checks.fixed_and_searched(raw.get("config"), raw.get("search"), source, where))
    return Step(
        id=spec.id,
        pass_name=cls.name,
        pass_cls=cls,
        config=config,
        search=search,
        after=spec.after,
        targets=spec.targets,
        optional=spec.optional,
        timeout_s=spec.timeout_s,
        environment=spec.environment if spec.environment is not None else cls.environment,
        filled=filled,
        typed_config=typed,
    )


def _links(index: int, spec: StepSpec, parts: Parts, source: WorkflowSource) -> list[Problem]:
    """The step's ``after`` and ``targets`` name declared steps and targets."""
    where: Where = ("steps", index)
    found = checks.after_ref(spec.id, spec.after, parts.step_ids, source, where) if spec.after is not None else []
    return found + checks.target_refs(spec.id, spec.targets or [], parts.target_ids, source, where)


def resolve_steps(parts: Parts, input_model: InputModel | None, source: WorkflowSource, problems: list[Problem]) -> dict[str, Step]:
    task = parts.input.task if parts.input is not None else None
    inferred = task is None and input_model is not None and input_model.inferred_task is not None
    if inferred:
        assert input_model is not None
        task = input_model.attrs.get("task")
    steps: dict[str, Step] = {}
    parents: dict[str, str] = {}  # step id -> the step it comes after
    repeats, found = checks.repeated_ids(parts.raw_steps, source)
    problems.extend(found)
    for index, spec in parts.steps:
        if index in repeats:
            continue
        problems.extend(_links(index, spec, parts, source))
        if spec.after is not None and spec.after in parts.step_ids:
            parents[spec.id] = spec.after
        step = _step(index, spec, parts, (task, inferred), source, problems)
        if step is not None:
            steps[step.id] = step
    index_of = {item["id"]: i for i, item in enumerate(parts.raw_steps) if isinstance(item, dict) and isinstance(item.get("id"), str)}
    cycle = checks.cycle(parents, index_of, source)
    problems.extend(cycle)
    if not cycle and input_model is not None:
        problems.extend(checks.chain(steps, input_model, index_of, source))
    return steps
