"""The pieces every workflow `engine optimize` writes is made of: the user's choice (device,
provider, precision, the quality bar), the steps with what each is for, and the data Kiln ships."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SENTENCES, PROMPTS, HELDOUT = (str(HERE / name) for name in ("sentences.txt", "prompts.txt", "heldout.txt"))
CALIBRATION_LINES = 32  # the first 32 lines calibrate; the other 160 are held out for fidelity
#: full-length English paragraphs (the Python Language Reference's prose, as workflows/data/english/train.txt);
#: text encoders are also judged on paragraphs 129-192, as the example workflows select on them: a bar held on
#: short lines can fail on long text (dynamic INT8 per-channel on MiniLM: 0.9912 on the lines, 0.9899 on these)
PARAGRAPHS = str(HERE / "paragraphs.txt")
LONG_TEXT = {"take": "range", "start": 128, "count": 64}


@dataclass(frozen=True)
class Choice:
    device: str  # cpu, gpu, npu
    provider: str  # cpu, cuda, tensorrt, dml, qnn, openvino
    precision: str  # fp32, fp16, int8, int4
    max_drop: float
    max_candidates: int | None = None
    output: str | None = None


@dataclass
class Pipeline:
    """The steps of a workflow with what each is for (the generated file's header says it)."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    why: list[tuple[str, str]] = field(default_factory=list)

    def add(self, why: str, id: str, pass_: str, after: str | None, **extra: Any) -> str:
        step: dict[str, Any] = {"id": id, "pass": pass_}
        if after:
            step["after"] = after
        step.update({key: value for key, value in extra.items() if value not in (None, False, {})})
        self.steps.append(step)
        self.why.append((id, why))
        return id

    def uses(self, name: str) -> bool:
        """Whether a step's config names ``name`` (a dataset or an evaluation)."""
        return any(name in step.get("config", {}).values() for step in self.steps)

    @property
    def calibrates(self) -> bool:
        return self.uses("calibration") or self.uses("fidelity_calibration")
