"""The workflow's parts, typed one by one.

``Workflow`` validates the whole file, and one bad key fails it; resolving must still check
everything else, so each part (the input, each step, each evaluation) is validated on its own
with the same schema models, and only the parts that are valid alone (less their bad optional
keys) are resolved further (what is wrong with a part was reported by the whole file's validation). The names a part declares (step
ids, target ids, dataset names, evaluation ids) are taken even from a part that is invalid, so a
reference to it is not reported a second time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from engine.workflow.resolve.plugins import Where
from engine.workflow.schema import EvaluateSpec, InputSpec, StepSpec

M = TypeVar("M", bound=BaseModel)


def typed(model: type[M], value: Any, keep: tuple[str, ...] = ("config",)) -> M | None:
    """``value`` as a ``model``, or None when it is not valid (alone). A mapping whose bad keys
    are optional is taken without them (their defaults instead), so the rest is still checked;
    a bad key in ``keep`` fails the whole part (a plugin's options are not checked as none)."""
    try:
        return model.model_validate(value)
    except ValidationError as error:
        bad = {item["loc"][0] for item in error.errors() if item["loc"]}
        if not isinstance(value, dict) or not bad or bad & set(keep) or len(bad) < len({item["loc"][:1] for item in error.errors()}):
            return None  # not a mapping, or a problem of the whole part
    try:
        return model.model_validate({key: item for key, item in value.items() if key not in bad})
    except ValidationError:
        return None


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class Names(list[Any]):
    """Declared names in file order; membership is a set look-up (workflows have 20,000 steps)."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self._known = {item for item in items if isinstance(item, str)}

    def __contains__(self, item: object) -> bool:
        return isinstance(item, str) and item in self._known


@dataclass
class Parts:
    input: InputSpec | None = None
    data: dict[str, dict[str, Any]] = field(default_factory=dict)  # the options of each dataset (the plugin's)
    targets: list[Any] = field(default_factory=list)  # the options of each target (the plugin's)
    steps: list[tuple[int, StepSpec]] = field(default_factory=list)
    raw_steps: list[Any] = field(default_factory=list)  # a step's search is checked as written
    evaluate: list[tuple[int, EvaluateSpec]] = field(default_factory=list)
    evaluate_count: int = 0  # evaluation entries written (valid or not)
    metrics: list[tuple[Where, Any]] = field(default_factory=list)  # where select names a metric, and the name
    data_names: Names = field(default_factory=lambda: Names([]))
    step_ids: Names = field(default_factory=lambda: Names([]))
    target_ids: Names = field(default_factory=lambda: Names([]))
    evaluation_ids: Names = field(default_factory=lambda: Names([]))


def _select_metrics(select: dict[str, Any]) -> list[tuple[Where, Any]]:
    """Where ``select`` names a metric, and what it names (checked whatever else is wrong there)."""
    uses: list[tuple[Where, Any]] = []
    objective = select.get("objective")
    if isinstance(objective, dict):
        uses.append((("select", "objective", "metric"), objective.get("metric")))
    for index, item in enumerate(objective if isinstance(objective, list) else []):
        if isinstance(item, dict):
            uses.append((("select", "objective", index, "metric"), item.get("metric")))
    for key in ("constraints", "tie_break"):
        for index, item in enumerate(_items(select.get(key))):
            if isinstance(item, dict):
                uses.append((("select", key, index, "metric"), item.get("metric")))
    return uses


def _with_id(item: Any) -> Any:
    """An evaluation without an id is checked as if named after its evaluator (the missing id is
    reported by the whole file's validation)."""
    return {"id": item.get("evaluator"), **item} if isinstance(item, dict) and "id" not in item else item


def parts_of(data: dict[str, Any]) -> Parts:
    steps, evaluate, targets = _items(data.get("steps")), _items(data.get("evaluate")), _items(data.get("targets"))
    datasets = {name: options for name, options in _mapping(data.get("data")).items() if isinstance(options, dict)}
    return Parts(
        input=typed(InputSpec, data.get("input")),
        data=datasets,
        targets=targets,
        steps=[(i, spec) for i, item in enumerate(steps) if (spec := typed(StepSpec, item)) is not None],
        raw_steps=steps,
        evaluate=[(i, entry) for i, item in enumerate(evaluate) if (entry := typed(EvaluateSpec, _with_id(item))) is not None],
        evaluate_count=sum(isinstance(item, dict) for item in evaluate),
        metrics=_select_metrics(_mapping(data.get("select"))),
        data_names=Names(list(_mapping(data.get("data")))),
        step_ids=Names([item.get("id") for item in steps if isinstance(item, dict)]),
        target_ids=Names([item.get("id") for item in targets if isinstance(item, dict)]),
        evaluation_ids=Names([item.get("id", item.get("evaluator")) for item in evaluate if isinstance(item, dict)]),
    )
