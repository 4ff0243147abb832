"""Cross-references of a workflow, one small check each: every check returns its problems.

A name used in one place must be declared in another: a step's ``after`` and ``targets``, a
dataset or evaluation an option refers to (found by the option's type, ``engine.core.refs``), a
metric ``select`` ranks by. Steps must also chain: each pass takes what its predecessor makes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine import registry
from engine.core.errors import Problem
from engine.core.refs import RefKind, referenced, references
from engine.workflow.resolve.model import EvaluatorEntry, InputModel, Step
from engine.workflow.resolve.plugins import Where
from engine.workflow.source import WorkflowSource


def _names(known: Sequence[Any]) -> list[str]:
    return [str(name) for name in known]


def dataset_refs(cls: Any, config: dict[str, Any] | None, declared: Sequence[str], source: WorkflowSource, where: Where) -> list[Problem]:
    """Each ``DatasetRef`` option names a dataset under ``data:``."""
    problems = []
    for option, value in referenced(cls.Config, config, RefKind.DATASET).items():
        if value in declared:
            continue
        close = registry.suggest(value, list(declared))
        problems.append(
            source.problem(
                (*where, option),
                f"dataset '{value}' is not declared under data:",
                expected="one of: " + (", ".join(declared) or "(none declared)"),
                given=value,
                hint=f"did you mean '{close}'?" if close else "declare it under data:",
            )
        )
    return problems


def measuring_pass_is_target_dependent(cls: Any, source: WorkflowSource, where: Where) -> list[Problem]:
    """A pass with an ``EvaluationRef`` option measures models on a target, so it depends on one."""
    if RefKind.EVALUATION not in references(cls.Config) or cls.target_dependent:
        return []
    return [
        source.problem(
            (*where, "pass"),
            f"pass '{cls.name}' measures models but is not target-dependent",
            hint="set target_dependent = True on the pass class",
        )
    ]


def evaluation_refs(
    cls: Any, config: dict[str, Any] | None, declared: Sequence[Any], source: WorkflowSource, where: Where
) -> list[Problem]:
    """Each ``EvaluationRef`` option names an evaluation of ``evaluate:``."""
    problems = []
    for option, value in referenced(cls.Config, config, RefKind.EVALUATION).items():
        if value in declared:
            continue
        close = registry.suggest(value, _names(declared))
        problems.append(
            source.problem(
                (*where, "config", option),
                f"evaluation '{value}' is not declared under evaluate:",
                expected="one of: " + (", ".join(_names(declared)) or "(none)"),
                given=value,
                hint=f"did you mean '{close}'?" if close else "declare it under evaluate:",
            )
        )
    return problems


def after_ref(step_id: str | None, after: str, declared: Sequence[Any], source: WorkflowSource, where: Where) -> list[Problem]:
    """A step comes after a declared step."""
    if after in declared:
        return []
    close = registry.suggest(after, [i for i in declared if isinstance(i, str)])
    return [
        source.problem(
            (*where, "after"),
            f"step '{step_id}' comes after '{after}', which is not a step",
            expected="one of: " + ", ".join(_names(declared)),
            given=after,
            hint=f"did you mean '{close}'?" if close else "name an existing step id",
        )
    ]


def target_refs(step_id: str | None, names: Sequence[Any], declared: Sequence[Any], source: WorkflowSource, where: Where) -> list[Problem]:
    """A step restricted to targets names declared ones."""
    problems = []
    for index, target_id in enumerate(names):
        if not isinstance(target_id, str) or not declared or target_id in declared:
            continue
        close = registry.suggest(target_id, [k for k in declared if isinstance(k, str)])
        problems.append(
            source.problem(
                (*where, "targets", index),
                f"step '{step_id}' names target '{target_id}', which is not declared",
                expected="one of: " + ", ".join(_names(declared)),
                given=target_id,
                hint=f"did you mean '{close}'?" if close else "declare it under targets:",
            )
        )
    return problems


def metric_refs(uses: list[tuple[Where, Any]], evaluators: dict[str, EvaluatorEntry], source: WorkflowSource) -> list[Problem]:
    """Each metric ``select`` names is ``<evaluation id>.<metric>`` of an evaluation that measures
    candidates. An evaluator that declares no metric names (custom) names its figures at run time."""
    metrics = [f"{eid}.{metric}" for eid, entry in evaluators.items() if entry.candidates for metric in entry.cls.metrics]
    open_ids = {eid for eid, entry in evaluators.items() if not entry.cls.metrics}
    problems = []
    for where, metric in uses:
        if not isinstance(metric, str) or metric in metrics or metric.partition(".")[0] in open_ids:
            continue
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
    return problems


def repeated_ids(items: Sequence[Any], source: WorkflowSource) -> tuple[set[int], list[Problem]]:
    """The indexes of steps whose id an earlier step has (malformed steps included), and a problem each."""
    seen: set[str] = set()
    repeats: set[int] = set()
    problems = []
    for index, item in enumerate(items):
        step_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(step_id, str):
            continue
        if step_id in seen:
            repeats.add(index)
            problems.append(source.problem(("steps", index, "id"), f"step id '{step_id}' is used twice", hint="give each step its own id"))
        seen.add(step_id)
    return repeats, problems


def find_cycle(parents: dict[str, str]) -> list[str] | None:
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


def cycle(parents: dict[str, str], index_of: dict[str, int], source: WorkflowSource) -> list[Problem]:
    """The ``after`` links form no cycle."""
    found = find_cycle(parents)
    if not found:
        return []
    names = " -> ".join([*found, found[0]])
    first = index_of.get(found[1 % len(found)], 0)
    return [
        source.problem(
            ("steps", first, "after"),
            f"the steps form a cycle: {names}",
            hint="a step may only come after a step that does not (directly or not) come after it",
        )
    ]


def formats_reaching(steps: dict[str, Step], step_id: str, input_model: InputModel) -> set[str]:
    """What may reach ``step_id``: its predecessor's output, and while predecessors are optional,
    what reaches them. A pass that ``keeps`` formats hands on the format that reached it, so the
    walk goes to the chain's start (in a loop: a chain of 20,000 steps is fine)."""
    return _formats_in(steps, input_model)[step_id]


def _formats_in(steps: dict[str, Step], input_model: InputModel) -> dict[str, set[str]]:
    """step id -> the formats that may reach it, for every step (each chain walked once).

    A step whose own input is unknown (it comes after a missing step, or sits on a cycle; both are
    reported elsewhere) is taken to hand on its ``produces``."""
    reaching: dict[str, set[str]] = {}
    for first in steps:
        path: list[str] = []
        step_id: str | None = first
        while step_id is not None and step_id in steps and step_id not in reaching and step_id not in path:
            path.append(step_id)
            step_id = steps[step_id].after
        for current in reversed(path):
            step = steps[current]
            if step.after is None:
                reaching[current] = {input_model.format}
            elif step.after not in steps or step.after not in reaching:  # missing, or a cycle
                reaching[current] = set()
            else:
                before = steps[step.after]
                reaching[current] = _formats_out(before, reaching[step.after])
                if before.optional:
                    reaching[current] |= reaching[step.after]  # skipping it hands this step what came before
    return reaching


def _formats_out(step: Step, formats_in: set[str]) -> set[str]:
    if not formats_in:
        return {step.pass_cls.produces}
    return {step.pass_cls.output_format(fmt) for fmt in formats_in}


def step_format(
    step: Step,
    steps: dict[str, Step],
    input_model: InputModel,
    source: WorkflowSource,
    index: int,
    reaching: dict[str, set[str]] | None = None,
) -> list[Problem]:
    """A pass accepts what its predecessor produces (or, predecessors being optional, may)."""
    produced = (reaching if reaching is not None else _formats_in(steps, input_model))[step.id]
    bad = sorted(fmt for fmt in produced if fmt not in step.pass_cls.accepts)
    if not bad:
        return []
    came_from = "step " + repr(step.after) if step.after else "the input"
    return [
        source.problem(
            ("steps", index, "pass"),
            f"pass '{step.pass_name}' cannot take a {'/'.join(bad)} model (from {came_from})",
            expected="a model in " + ", ".join(step.pass_cls.accepts),
            given=", ".join(bad),
            hint="put a step that converts the model before it",
        )
    ]


def step_targets(step: Step, steps: dict[str, Step], source: WorkflowSource, index: int) -> list[Problem]:
    """A target-restricted step's predecessor runs on those targets too."""
    before = steps.get(step.after) if step.after else None
    if before is None or step.targets is None or before.targets is None:
        return []
    missing = sorted(set(step.targets) - set(before.targets))
    if not missing:
        return []
    return [
        source.problem(
            ("steps", index, "targets"),
            f"step '{step.id}' runs on {', '.join(missing)} but the step it comes after ('{step.after}') does not",
            hint=f"add {', '.join(missing)} to the targets of '{step.after}'",
        )
    ]


def chain(steps: dict[str, Step], input_model: InputModel, index_of: dict[str, int], source: WorkflowSource) -> list[Problem]:
    """Every step's format and targets against its predecessor's."""
    problems = []
    reaching = _formats_in(steps, input_model)
    for step in steps.values():
        problems += step_format(step, steps, input_model, source, index_of[step.id], reaching)
        problems += step_targets(step, steps, source, index_of[step.id])
    return problems


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


def _single(spec: Any) -> bool:
    """Whether a search gives one value only (a list or ``values`` of one, a range whose ends meet)."""
    values = spec if isinstance(spec, list) else spec.get("values") if isinstance(spec, dict) else None
    if isinstance(values, list):
        return len(values) == 1
    return isinstance(spec, dict) and "low" in spec and spec.get("low") == spec.get("high")


def fixed_and_searched(config: Any, search: Any, source: WorkflowSource, where: Where) -> list[Problem]:
    """An option both in ``config`` and searched: the search gives the candidates' values and the
    config value is the one the baselines run, so it must be one the search could give, and the
    search must give more than that one value (else the option is fixed twice, and one is a mistake)."""
    if not isinstance(config, dict) or not isinstance(search, dict):
        return []
    problems = []
    for option, spec in search.items():
        if option not in config:
            continue
        if _single(spec):
            problems.append(
                source.problem(
                    (*where, "search", option),
                    f"option '{option}' is fixed in config at {config[option]!r} and searched over the single value "
                    f"{_show_search(spec)}: an option is either fixed or searched",
                    expected=f"'{option}' in config, or a search over two values or more",
                    given=f"config: {config[option]!r}, search: {_show_search(spec)}",
                    hint=f"remove '{option}' from search (fixed), or from config and search it over the values to try",
                )
            )
        elif not _searchable(config[option], spec):
            problems.append(
                source.problem(
                    (*where, "search", option),
                    f"option '{option}' is fixed in config at {config[option]!r} and searched over {_show_search(spec)}: "
                    "the config value is the one baselines run, and it is not among the searched values",
                    given=repr(config[option]),
                    hint=f"remove '{option}' from config (baselines then use the pass's default), or search a range that holds it",
                )
            )
    return problems


def session_name_free(steps: dict[str, Step], targets: dict[str, Any], source: WorkflowSource) -> list[Problem]:
    """A target's searched settings are named ``session.<option>`` in points and records, so no
    step may be called ``session`` while a target searches its settings."""
    searching = [tid for tid, entry in targets.items() if entry.search]
    if "session" not in steps or not searching:
        return []
    index = list(steps).index("session")
    return [
        source.problem(
            ("steps", index, "id"),
            f"step id 'session' is reserved while a target searches its session settings (target {', '.join(searching)})",
            given="session",
            hint="rename the step",
        )
    ]


def input_tokenizers(datasets: dict[str, Any], input_model: InputModel | None, source: WorkflowSource) -> list[Problem]:
    """A text source with ``tokenizer: input`` reads the tokenizer saved with the workflow's input:
    only a Hugging Face folder has one (and not every folder: a model saved from a bare config has
    no tokenizer files), so on an ONNX or torch input, or such a folder, it would fail at run time."""
    if input_model is None or input_model.attrs.get("tokenizer"):
        return []
    if input_model.format == "hf":
        from engine.core.model_kind import TOKENIZER_VOCABULARY

        folder = Path(input_model.path) if input_model.path is not None else None
        if folder is None or not folder.is_dir() or any((folder / file).is_file() for file in TOKENIZER_VOCABULARY):
            return []
        has_none = f"the Hugging Face folder {folder} has no tokenizer files (none of {', '.join(TOKENIZER_VOCABULARY)})"
    else:
        has_none = f"{'an' if input_model.format == 'onnx' else 'a'} {input_model.format} input has none"
    return [
        source.problem(
            ("data", name, "tokenizer"),
            f"`tokenizer: input` reads the tokenizer of the input model, and {has_none}",
            expected="a folder holding a Hugging Face tokenizer (tokenizer.json, vocab.txt, ...)",
            given="input",
            hint="set `tokenizer:` to the folder of the tokenizer the model was made with (tokenizer.save_pretrained writes one)",
        )
        for name, entry in datasets.items()
        if getattr(entry.typed_config, "tokenizer", None) == "input"
    ]
