"""The search space of one target: which path (branch) through the steps, whether each
optional step runs, and the value of each searched option — conditional options included.

A point is a flat dict: ``branch`` (an index into the target's paths, present when there is more
than one), ``<step>`` ("apply" | "skip") for optional steps, ``<step>.<option>`` for options,
and ``session.<option>`` for the target's searched session settings (``session.intra_op_threads``,
``session.cuda.enable_cuda_graph``): a candidate is a model and the settings it runs with.
The same names are used in records, reports and the samplers' storage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import ValidationError

from engine.core.search import Categorical, FloatRange, IntRange, SearchDim, flatten, grid_size, iter_grid_points, ordered_dims
from engine.workflow.resolve import ResolvedWorkflow, Step
from engine.workflow.resolve.sizes import chains_for, space_size

Point = dict[str, Any]
APPLY, SKIP = "apply", "skip"
#: the prefix of a point's session settings (a step may not be named so while a target searches)
SESSION = "session"


def _primitive(values: tuple[Any, ...]) -> bool:
    return all(v is None or isinstance(v, bool | int | float | str) for v in values)


def resolved_config(cls: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The config a job runs with as its pass types it: every default applied (those that depend
    on another option's value too) and every value in its option's type. A job's key names this,
    so the same config gives the same key whether it was written under ``config:``, reached
    through ``search:`` or left to the pass's defaults. A config the pass refuses (a sampled
    point outside what validation could check) is kept as given: its job fails with the pass's
    own message."""
    try:
        return dict(cls.Config(**config).to_json())
    except ValidationError:
        return config


class TargetSpace:
    def __init__(self, resolved: ResolvedWorkflow, target: str) -> None:
        self.resolved = resolved
        self.target = target
        self.chains = chains_for(resolved.steps, target)
        entry = resolved.targets[target]
        #: the target's searched session settings, by dotted option name
        self.settings_dims: dict[str, SearchDim] = dict(entry.search)
        self._own = flatten(entry.instance.config.model_dump(mode="json"))

    # -- what a point means ---------------------------------------------------------------------
    def chain(self, point: Point) -> list[Step]:
        return self.chains[int(point.get("branch", 0))] if self.chains else []

    @staticmethod
    def step_params(step: Step, point: Point) -> dict[str, Any] | None:
        """The searched options of ``step`` at ``point``; None when the point skips the step."""
        if step.optional and point.get(step.id) == SKIP:
            return None
        prefix = f"{step.id}."
        return {name[len(prefix) :]: value for name, value in point.items() if name.startswith(prefix)}

    @staticmethod
    def settings(point: Point) -> dict[str, Any]:
        """A point's session settings by dotted option name (``cuda.enable_cuda_graph``)."""
        prefix = f"{SESSION}."
        return {name[len(prefix) :]: value for name, value in point.items() if name.startswith(prefix)}

    def searched(self, point: Point) -> list[tuple[str, SearchDim]]:
        """Every searched option a point may carry, by its name in the point: the options of the
        steps on its path (``<step>.<option>``) and the session settings (``session.<option>``)."""
        found = [(f"{step.id}.{name}", dim) for step in self.chain(point) for name, dim in step.search.items()]
        return found + [(f"{SESSION}.{name}", dim) for name, dim in self.settings_dims.items()]

    def settings_grid(self) -> list[Point]:
        """Every combination of the searched settings, as point entries (``session.<option>``)."""
        return list(self.settings_points())

    def settings_points(self) -> Iterator[Point]:
        """``settings_grid``, one at a time."""
        if not self.settings_dims:
            yield {}
            return
        for p in iter_grid_points(self.settings_dims, self._own):
            yield {f"{SESSION}.{k}": v for k, v in p.items()}

    def default_settings(self) -> Point:
        """The settings as the target writes them (the searched ones that are active)."""
        point: Point = {}
        for name in ordered_dims(self.settings_dims):
            if self.settings_dims[name].active({**self._own, **self.settings(point)}):
                point[f"{SESSION}.{name}"] = self._own.get(name)
        return point

    # -- enumerating ----------------------------------------------------------------------------
    def grid(self) -> list[Point]:
        """Every point, as a list (``points`` draws them one at a time, for a space of any size)."""
        return list(self.points())

    def points(self) -> Iterator[Point]:
        """Every point, in a stable order: path by path, then steps' options in file order, then
        the session settings. Lazy: a space of 10^12 points yields its first ones at once."""
        for model in self._model_points():
            for settings in self.settings_points():
                yield {**model, **settings}

    def _model_points(self) -> Iterator[Point]:
        for index, chain in enumerate(self.chains):
            head: Point = {"branch": index} if len(self.chains) > 1 else {}
            yield from _product(head, [self._step_variants(step) for step in chain])

    @staticmethod
    def _step_variants(step: Step) -> Callable[[], Iterator[Point]]:
        def variants() -> Iterator[Point]:
            for p in iter_grid_points(step.search, step.config):
                options = {f"{step.id}.{k}": v for k, v in p.items()}
                yield {step.id: APPLY, **options} if step.optional else options
            if step.optional:
                yield {step.id: SKIP}

        return variants

    def settings_size(self) -> int:
        """How many points ``settings_points`` yields, counted by arithmetic."""
        return grid_size(self.settings_dims, self._own) if self.settings_dims else 1

    def size(self) -> int | None:
        """How many distinct points the space has, counted by arithmetic (nothing is listed);
        None when a float range makes it continuous."""
        if any(isinstance(d.distribution, FloatRange) for d in self.settings_dims.values()):
            return None
        for chain in self.chains:
            for step in chain:
                if any(isinstance(d.distribution, FloatRange) for d in step.search.values()):
                    return None
        return self.grid_size()

    def grid_size(self) -> int:
        """How many points ``points`` yields (a float range counts its grid points)."""
        return space_size(self.chains, self.settings_dims, self._own)

    def defaults(self) -> list[Point]:
        """Per path, every step applied with its options at their configured (library) defaults."""
        points = []
        for index, chain in enumerate(self.chains):
            point: Point = {"branch": index} if len(self.chains) > 1 else {}
            for step in chain:
                if step.optional:
                    point[step.id] = APPLY
                for name in ordered_dims(step.search):
                    if step.search[name].active({**step.config, **self.step_params(step, point)}):
                        point[f"{step.id}.{name}"] = step.config.get(name)
            points.append({**point, **self.default_settings()})
        return points

    # -- sampling (optuna, define-by-run) -------------------------------------------------------
    def suggest(self, trial: Any) -> Point:
        """Ask an optuna trial for a point; only options on the chosen path that are active get
        suggested, so the sampler sees the conditional structure."""
        point: Point = {}
        if len(self.chains) > 1:
            point["branch"] = trial.suggest_categorical("branch", list(range(len(self.chains))))
        for step in self.chain(point):
            if step.optional:
                point[step.id] = trial.suggest_categorical(step.id, [APPLY, SKIP])
                if point[step.id] == SKIP:
                    continue
            for name in ordered_dims(step.search):
                dim = step.search[name]
                if dim.active({**step.config, **self.step_params(step, point)}):
                    point[f"{step.id}.{name}"] = _suggest(trial, f"{step.id}.{name}", dim)
        for name in ordered_dims(self.settings_dims):
            dim = self.settings_dims[name]
            if dim.active({**self._own, **self.settings(point)}):
                point[f"{SESSION}.{name}"] = _suggest(trial, f"{SESSION}.{name}", dim)
        return point

    def holds(self, point: Point) -> bool:
        """Whether ``point`` (a baseline's, say) stands for a model the space gives too: each
        searched value among its dimension's, a value left to the pass's default (None) read as
        the default the pass resolves it to (the same job either way)."""
        for step in self.chain(point):
            params = self.step_params(step, point)
            if params is None:
                continue
            resolved: dict[str, Any] | None = None
            for name, dim in step.search.items():
                value = params.get(name)
                if name not in params or dim.distribution.contains(value):
                    continue
                if resolved is None:
                    resolved = resolved_config(step.pass_cls, {**step.config, **params})
                if value is not None or not dim.distribution.contains(resolved.get(name)):
                    return False
        return all(
            dim.distribution.contains(point[key]) for key, dim in self.searched(point) if key.startswith(f"{SESSION}.") and key in point
        )

    def distributions(self, point: Point) -> dict[str, Any] | None:
        """Optuna distributions of a point's parameters (to tell optuna about a point it did not
        ask for, such as a baseline); None when a value lies outside its distribution."""
        import optuna

        out: dict[str, Any] = {}
        if "branch" in point:
            out["branch"] = optuna.distributions.CategoricalDistribution(list(range(len(self.chains))))
        for step in self.chain(point):
            if step.optional:
                out[step.id] = optuna.distributions.CategoricalDistribution([APPLY, SKIP])
        for key, dim in self.searched(point):
            if key not in point:
                continue
            if not dim.distribution.contains(point[key]):
                return None
            out[key] = _optuna_distribution(dim)
        return out

    def to_optuna(self, point: Point) -> dict[str, Any]:
        """A point's values as optuna stores them (non-primitive choices by index)."""
        params = dict(point)
        for key, dim in self.searched(point):
            if key in params and isinstance(dim.distribution, Categorical) and not _primitive(dim.distribution.choices):
                params[key] = dim.distribution.choices.index(params[key])
        return params


def _product(head: Point, parts: list[Callable[[], Iterator[Point]]]) -> Iterator[Point]:
    """``itertools.product`` of the parts' points, merged into ``head``, without listing any part
    (each part is drawn afresh for every combination of the parts before it). An odometer, not
    recursion: a chain of 20,000 steps is 20,000 parts."""
    if not parts:
        yield dict(head)
        return
    iters = [parts[0]()]
    chosen: list[Point] = []
    while iters:
        part = next(iters[-1], None)
        if part is None:
            iters.pop()
            if chosen:
                chosen.pop()
            continue
        if len(chosen) == len(iters):
            chosen[-1] = part
        else:
            chosen.append(part)
        if len(chosen) == len(parts):
            point = dict(head)
            for piece in chosen:
                point.update(piece)
            yield point
        else:
            iters.append(parts[len(iters)]())


def _optuna_distribution(dim: SearchDim) -> Any:
    import optuna

    dist = dim.distribution
    if isinstance(dist, Categorical):
        choices = list(dist.choices) if _primitive(dist.choices) else list(range(len(dist.choices)))
        return optuna.distributions.CategoricalDistribution(choices)
    if isinstance(dist, IntRange):
        return optuna.distributions.IntDistribution(dist.low, dist.high, log=dist.log, step=1 if dist.log else dist.step)
    assert isinstance(dist, FloatRange)
    return optuna.distributions.FloatDistribution(dist.low, dist.high, log=dist.log)


def _suggest(trial: Any, name: str, dim: SearchDim) -> Any:
    dist = dim.distribution
    if isinstance(dist, Categorical):
        if _primitive(dist.choices):
            return trial.suggest_categorical(name, list(dist.choices))
        # optuna stores only primitive choices: suggest the index, return the value
        return dist.choices[trial.suggest_categorical(name, list(range(len(dist.choices))))]
    if isinstance(dist, IntRange):
        return trial.suggest_int(name, dist.low, dist.high, step=1 if dist.log else dist.step, log=dist.log)
    assert isinstance(dist, FloatRange)
    value = trial.suggest_float(name, dist.low, dist.high, log=dist.log)
    return value if math.isfinite(value) else dist.low
