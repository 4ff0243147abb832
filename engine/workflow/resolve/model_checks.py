"""The input model's kind against what the workflow asks of it, read from its config.json (no torch
import): a pass that takes only some kinds of model (``Pass.model_kinds``: decoder_export and
genai_build take causal LMs, seq2seq_export encoder-decoders) given another, and an
encoder-decoder given ``task: feature-extraction`` (an encoder's task: the model needs decoder
inputs to run at all). Each is refused here, with the pass or the task that fits, rather than
failing its candidates at run time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.core.errors import Problem
from engine.core.model_kind import (
    ENCODER_DECODER,
    TOKENIZER_VOCABULARY,
    TOKENIZER_WHY,
    describe,
    generation_task,
    kind_of,
    kind_refusal,
    orphan_tokenizer_settings,
    read_config,
    tokenizer_fix,
)
from engine.workflow.resolve.model import InputModel, Step
from engine.workflow.source import WorkflowSource

#: tasks of an encoder alone: an encoder-decoder exported for one of them misses its decoder
ENCODER_TASKS = frozenset({"feature-extraction"})


def input_config(input_model: InputModel | None) -> tuple[dict[str, Any] | None, Path | None]:
    """The input's parsed config.json and its path (a Hugging Face folder, or a Hub model the cache
    holds), or (None, None)."""
    if input_model is None or input_model.format != "hf" or input_model.path is None:
        return None, None
    path = Path(input_model.path) / "config.json"
    return read_config(input_model.path), path


def model_kind_problems(
    raw_steps: list[Any], steps: dict[str, Step], input_model: InputModel | None, source: WorkflowSource
) -> list[Problem]:
    """Every step that takes the input model and cannot take its kind, and every task an
    encoder-decoder cannot be exported for."""
    config, path = input_config(input_model)
    if config is None or path is None or kind_of(config) is None:
        return []
    problems = _task_problem(config, path, input_model, source)
    tokenizer_told = False  # once, however many steps take the input
    for index, raw in enumerate(raw_steps):
        step = steps.get(raw.get("id")) if isinstance(raw, dict) else None
        if step is None or step.after is not None:  # a later step takes a step's output, not the input
            continue
        refusal = kind_refusal(step.pass_name, tuple(getattr(step.pass_cls, "model_kinds", ())), config, str(path))
        if refusal is not None:
            why, fix = refusal
            problems.append(
                source.problem(
                    ("steps", index, "pass"),
                    why,
                    expected=f"a pass that takes {describe(config)}",
                    given=step.pass_name,
                    hint=fix,
                )
            )
        problems.extend(_step_task_problem(index, raw, step, config, path, source))
        problems.extend(_config_problem(index, step, config, path, source))
        if not tokenizer_told:
            told = _tokenizer_problem(step, path, source)
            problems.extend(told)
            tokenizer_told = bool(told)
    return problems


def _config_problem(index: int, step: Step, config: dict[str, Any], path: Path, source: WorkflowSource) -> list[Problem]:
    """What a pass says it cannot build from this config.json (``Pass.config_refusal``:
    (key path in config.json, why, expected, fix), or None)."""
    refuse = getattr(step.pass_cls, "config_refusal", None)
    refusal = refuse(config) if callable(refuse) else None
    if refusal is None:
        return []
    key, why, expected, fix = refusal
    return [
        source.problem(
            ("steps", index, "pass"), f"{path}: {key}: {why}", expected=expected, given=f"{step.pass_name} on this config", hint=fix
        )
    ]


def _tokenizer_problem(step: Step, path: Path, source: WorkflowSource) -> list[Problem]:
    """A decoder pass given a folder with tokenizer settings but no vocabulary (a made-up tokenizer)."""
    settings = orphan_tokenizer_settings(path.parent) if "decoder" in getattr(step.pass_cls, "model_kinds", ()) else None
    if settings is None:
        return []
    return [
        source.problem(
            ("input", "path"),
            f"{path.parent / settings}: {TOKENIZER_WHY}",
            expected=f"a tokenizer vocabulary beside {settings} ({', '.join(TOKENIZER_VOCABULARY)}), or no tokenizer files",
            given=settings,
            hint=tokenizer_fix(settings),
        )
    ]


def _task_problem(config: dict[str, Any], path: Path, input_model: InputModel | None, source: WorkflowSource) -> list[Problem]:
    task = input_model.attrs.get("task") if input_model is not None else None
    if kind_of(config) != ENCODER_DECODER or task not in ENCODER_TASKS or input_model is None or input_model.inferred_task:
        return []  # a task inferred from a bare backbone's class is checked where a step uses it
    return [_encoder_task(("input", "task"), task, config, path, source)]


def _step_task_problem(
    index: int, raw: dict[str, Any], step: Step, config: dict[str, Any], path: Path, source: WorkflowSource
) -> list[Problem]:
    """A step exporting an encoder-decoder for an encoder's task, set in the step or filled from input.task."""
    task = step.config.get("task")
    if kind_of(config) != ENCODER_DECODER or task not in ENCODER_TASKS:
        return []
    if isinstance(raw.get("config"), dict) and "task" in raw["config"]:
        return [_encoder_task(("steps", index, "config", "task"), task, config, path, source, step.pass_name)]
    if step.filled.get("task") == "config.json architectures":
        return [_encoder_task(("steps", index, "pass"), task, config, path, source, step.pass_name)]
    return []  # filled from input.task: reported there


def _encoder_task(
    where: tuple[Any, ...], task: str, config: dict[str, Any], path: Path, source: WorkflowSource, pass_name: str | None = None
) -> Problem:
    right = generation_task(config)
    by = f" for pass {pass_name}" if pass_name else ""
    return source.problem(
        where,
        f"{path} describes {describe(config)}: task {task}{by} exports an encoder alone, and this model does not run without "
        "its decoder's inputs",
        expected=f"a task of an encoder-decoder: {right}",
        given=task,
        hint=f"set input.task: {right} and export with pass seq2seq_export (the encoder and the decoder with cross-attention and cache)",
    )


def check_fetched_input(resolved: Any) -> None:
    """The same checks on a Hub input just downloaded (validate saw no config.json in the cache):
    raises InputError before any pass runs on it."""
    from engine.core.errors import InputError
    from engine.workflow.source import read_workflow

    source = read_workflow(Path(resolved.file))
    raw = source.data.get("steps") if isinstance(source.data, dict) else None
    problems = model_kind_problems(raw if isinstance(raw, list) else [], resolved.steps, resolved.input, source)
    if problems:
        raise InputError(problems)
