"""The errors every part of Kiln raises.

Only these are caught around user work: anything else is an engine bug and must surface.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class KilnError(Exception):
    """Base of every error Kiln raises on purpose."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a user's input, told the same way everywhere.

    ``where`` is a key path such as ``steps[1].config.per_channel``; ``line`` is 1-based when known.
    """

    where: str
    message: str
    expected: str | None = None
    given: str | None = None
    hint: str | None = None
    file: str | None = None
    line: int | None = None

    def render(self) -> str:
        place = self.file or "<workflow>"
        if self.line is not None:
            place = f"{place}:{self.line}"
        text = f"{place}: {self.where or '<root>'}: {self.message}"
        if self.expected is not None:
            text += f"\n    expected: {self.expected}"
        if self.given is not None:
            text += f"\n    given:    {self.given}"
        if self.hint:
            text += f"\n    fix:      {self.hint}"
        return text


@dataclass
class InputError(KilnError):
    """Bad input from the user: a workflow, a path, a dataset. The CLI exits 2 on it."""

    problems: list[Problem] = field(default_factory=list)

    def __str__(self) -> str:
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} found"
        return head + ":\n" + "\n".join(p.render() for p in self.problems)


class MissingDependency(KilnError):
    """An optional library a feature needs is not installed."""

    def __init__(self, package: str, feature: str, install: str | None = None) -> None:
        self.package = package
        self.feature = feature
        self.install = install or f"pip install {package}"
        super().__init__(f"{feature} needs the package '{package}', which is not installed. Fix: {self.install}")


class PassError(KilnError):
    """A pass failed on its input. Names the pass, the step and the input digest."""

    def __init__(self, pass_name: str, step: str | None, input_digest: str | None, reason: str) -> None:
        self.pass_name = pass_name
        self.step = step
        self.input_digest = input_digest
        self.reason = reason
        where = f"step '{step}' (pass {pass_name})" if step else f"pass {pass_name}"
        digest = f" on input {input_digest[:12]}" if input_digest else ""
        super().__init__(f"{where} failed{digest}: {reason}")


class EvaluationError(KilnError):
    """An evaluator could not measure a candidate."""


class TargetUnavailable(KilnError):
    """A target's runtime or device is not usable on this machine."""


#: how a ``SettingInapplicable`` message starts: the engine finds it in an evaluation's error text,
#: which is all that crosses a worker's boundary
INAPPLICABLE = "inapplicable setting: "


class SettingInapplicable(KilnError):
    """A searched session setting cannot apply to this model on this target (a CUDA graph for a
    model with nodes off the GPU): the candidate is inapplicable, not failed, and is not measured."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{INAPPLICABLE}{reason}")


def inapplicable_reason(error: str | None) -> str | None:
    """The reason of a ``SettingInapplicable`` found in ``error`` (a job's error text), or None."""
    index = (error or "").find(INAPPLICABLE)
    return None if error is None or index < 0 else error[index + len(INAPPLICABLE) :].strip()
