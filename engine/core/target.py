"""Targets: a device plus the runtime that runs models on it.

A target opens inference sessions; evaluators measure through them, and target-dependent passes
read their fingerprint. A target that cannot run here says why instead of failing later.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from engine.core.config import ID_MAX_LENGTH, ID_PATTERN, EnvironmentSpec, PlacementSpec, StrictConfig, library_versions

if TYPE_CHECKING:
    import numpy as np

    from engine.core.artifact import ModelArtifact


class TargetConfig(StrictConfig):
    """Fields every target has; a runtime's config adds its own options."""

    id: str = Field(
        pattern=ID_PATTERN,
        max_length=ID_MAX_LENGTH,
        description="Name chosen by the user; used in steps' `targets:` and names the target's output folder (a letter, then letters, digits, _ or -).",
    )
    runtime: str = Field(description="Which runtime family runs models on this target.")
    device: str = Field(default="cpu", description="The device the runtime runs on.")
    resources: dict[str, float] | None = Field(
        default=None,
        description="Resources a cluster executor requests for this target's jobs, e.g. {GPU: 1} or a custom {intel_cpu: 1}. Not part of the fingerprint.",
    )
    placement: PlacementSpec | None = Field(
        default=None,
        description="Run this target's jobs only on a node with these resources, e.g. {resources: {gpu_h100: 1}}; unavailable where no node has them. Not part of the fingerprint.",
    )
    environment: EnvironmentSpec | None = Field(
        default=None,
        description="Run this target's sessions and target-dependent passes in a virtual environment with these requirements (built once by `engine run`, e.g. {requirements: [onnxruntime-openvino==1.24.1]}).",
    )

    def to_json(self) -> dict[str, Any]:
        """As StrictConfig's; ``environment`` and ``placement`` appear only when set, so targets without them keep their keys."""
        data = super().to_json()
        for optional in ("environment", "placement"):
            if data.get(optional) is None:
                data.pop(optional, None)
        return data


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # a numpy dtype name: float32, int64, ...
    shape: tuple[int | str | None, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass
class Session(ABC):
    """A loaded model ready to run. ``details`` records the settings actually in force."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    details: dict[str, Any] = field(default_factory=dict)

    @abstractmethod
    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run once; outputs in the order of ``outputs``."""

    def prepare(self, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
        """One run of ``feeds`` made ready to repeat under a clock: what a deployed service does
        per request, without the setup it pays once. The default calls ``run`` (host arrays in,
        host arrays out). A session that binds inputs and outputs on its device (ONNX Runtime
        I/O binding, an OpenVINO request with its tensors set) copies ``feeds`` there once and
        returns a call that only runs; its results then stay on the device, so timing code calls
        ``synchronize`` around it. ``details["io_binding"]`` says which of the two it does."""

        def run() -> None:
            self.run(feeds)

        return run

    def concurrent(self) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
        """A run function for one more thread serving requests at the same time as others
        (throughput). The default is ``run``, for runtimes whose session is safe to call from
        several threads at once (ONNX Runtime); a runtime that needs a request object per
        caller (OpenVINO) returns a function bound to a new one."""
        return self.run

    def synchronize(self) -> None:  # noqa: B027 - optional hook
        """Wait until work the session queued on its device has finished. Timing code calls it
        before starting and before stopping the clock. A session whose ``run`` returns host
        arrays is already synchronous (the copy to the host waits for the device); one that
        leaves results on a device must override this."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the runtime's resources."""


@dataclass(frozen=True)
class Generation:
    """One greedy generation from a prompt: the new tokens (the prompt excluded) and when each came.

    ``prefill_s`` is the time to first token: from handing over the prompt to having the first new
    token (the prompt's forward pass plus choosing the token). ``decode_s[i]`` is the time of the
    (i+2)-th new token: one forward pass of a single token over the cache, plus choosing it. So
    ``len(decode_s) == len(tokens) - 1`` and the decode rate is ``len(decode_s) / sum(decode_s)``."""

    tokens: list[int]
    prefill_s: float
    decode_s: list[float]

    @property
    def total_s(self) -> float:
        """End to end: prompt in, last token out."""
        return self.prefill_s + sum(self.decode_s)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second after the first (0.0 when only one token was generated)."""
        spent = sum(self.decode_s)
        return len(self.decode_s) / spent if spent > 0 else 0.0


#: the inputs of a decoder a caller feeds (``GenerativeSession.token_inputs``)
TOKEN_INPUTS = ("input_ids", "attention_mask")


class GenerativeSession(Session):
    """A decoder with a key/value cache, opened for generation (the ``genai`` format).

    Token ids in, token ids out: prompts come already tokenized (a dataset tokenizes them with the
    model's tokenizer), so a session needs no tokenizer. Sampling is greedy, so a generation
    repeats exactly for the same model and prompt; the figures evaluators report (time to first
    token, decode tokens per second, perplexity, next-token fidelity) are built on these two calls.
    """

    @abstractmethod
    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Generation:
        """Greedy generation of exactly ``max_new_tokens`` tokens after ``prompt`` (an end-of-
        sequence token does not stop it: timings compare like with like), timed per token."""

    @abstractmethod
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """The next-token logits after each prefix of ``ids``: float32 ``[len(ids), vocab]``,
        from one forward pass over the sequence (an empty cache)."""

    @property
    def token_inputs(self) -> list[TensorSpec]:
        """What a caller feeds (``run``, a dataset made from the model's signature): ``input_ids`` and
        ``attention_mask``, never the cache inputs (the session's own; their head and past axes are
        not the sequence's), also where the session lists no inputs (onnxruntime-genai)."""
        named = [spec for spec in self.inputs if spec.name in TOKEN_INPUTS]
        return named or [TensorSpec(name, "int64", ("batch_size", "sequence_length")) for name in TOKEN_INPUTS]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """``feeds["input_ids"]`` ``[batch, length]`` (with ``attention_mask``: 1 marks the tokens
        of a row, which come first) -> the logits ``[batch, length, vocab]``, zero past each row's
        tokens. What a plain ``Session`` caller (the size or memory evaluator) may run."""
        import numpy as np

        ids = np.asarray(feeds["input_ids"])
        mask = np.asarray(feeds.get("attention_mask", np.ones_like(ids)))
        rows = [self.logits([int(t) for t in row[: int(m.sum())]]) for row, m in zip(ids, mask, strict=True)]
        vocab = rows[0].shape[-1] if rows else 0
        out = np.zeros((ids.shape[0], ids.shape[1], vocab), dtype=np.float32)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
        return [out]


class Seq2SeqSession(Session):
    """An encoder-decoder model opened for generation (the ``seq2seq`` format): the encoder runs
    once on a source (token ids and mask, or audio features), the decoder token by token over its
    key/value cache. ``inputs`` are the encoder's; ``run`` runs the encoder (what a plain
    ``Session`` caller, the size or memory evaluator, may run). Greedy, so a generation repeats
    exactly for the same model and source."""

    @abstractmethod
    def start_tokens(self) -> list[int]:
        """The decoder's default prompt: its start token (``decoder_start_token_id``)."""

    @abstractmethod
    def first_logits(self, source: dict[str, np.ndarray], prompt: Sequence[int] | None = None) -> np.ndarray:
        """The decoder's logits after each token of ``prompt`` (default ``start_tokens()``) for
        this source, from an empty cache: float32 ``[len(prompt), vocab]``."""

    @abstractmethod
    def generate_from(
        self, source: dict[str, np.ndarray], max_new_tokens: int, prompt: Sequence[int] | None = None, stop_at_eos: bool = False
    ) -> Generation:
        """Greedy tokens after ``prompt`` for this source (batch 1), timed: ``prefill_s`` is the
        encoder plus the first decoder step (time to first token). Exactly ``max_new_tokens``
        unless ``stop_at_eos`` and an end-of-sequence token comes first (it is kept)."""


class Target(ABC):
    runtime: ClassVar[str]
    summary: ClassVar[str]
    version: ClassVar[str] = "1"
    Config: ClassVar[type[TargetConfig]] = TargetConfig
    #: model formats this target's sessions open
    accepts: ClassVar[tuple[str, ...]]
    libraries: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def warm_modules(cls, input_format: str) -> tuple[str, ...]:
        """What a warm worker imports ahead of this target's jobs (see ``Pass.warm_modules``)."""
        return cls.libraries

    def __init__(self, config: TargetConfig, cache_dir: Path | None = None) -> None:
        self.config = config
        #: a folder in the store where the target may keep what it compiles (engines, caches),
        #: set by the worker; None means no cache
        self.cache_dir = cache_dir

    @property
    def id(self) -> str:
        return self.config.id

    def untimed(self) -> Target:
        """This target as a job that is not timed opens it (an accuracy or fidelity evaluation, a
        pass measuring its own models): the same outputs, without a runtime's habits that pay off
        only on a machine to itself, since such a job shares the cores with other jobs. The default
        is the target itself; ONNX Runtime's lets idle intra-op threads sleep instead of spin."""
        return self

    @classmethod
    def host_report(cls) -> list[tuple[str, bool, str]]:
        """What this runtime family could run on here, one row per backend (e.g. execution
        provider): (name, usable here, why not or what provides it). Empty when there is no such
        list; ``engine targets`` prints it."""
        return []

    @abstractmethod
    def availability(self) -> Availability:
        """Whether this target can run here, and if not, why (in words a user can act on)."""

    @abstractmethod
    def open_session(self, model: ModelArtifact) -> Session:
        """Load ``model`` for inference with this target's settings."""

    def inference_settings(self, session_details: dict[str, Any]) -> dict[str, Any]:
        """What an application needs to run a model exactly as it was measured here, as a JSON
        document (written beside each chosen model as ``inference_settings.json``), built from a
        measured session's ``details`` (the settings in force, not the ones asked for). The
        default names the runtime and this target's config."""
        return {"runtime": self.runtime, "device": self.config.device, "target_config": self.config.to_json()}

    def snippet(self, settings: dict[str, Any], model_path: str) -> str:
        """A short Python program that opens ``model_path`` with ``settings`` (from
        ``inference_settings``) the way it was measured; empty when the runtime has none."""
        return ""

    def fingerprint(self) -> dict[str, Any]:
        """What makes results on this target differ from another's: runtime, device, options,
        library versions. The user's ``id`` is left out, so renaming a target reuses the cache."""
        options = self.config.to_json()
        options.pop("id", None)
        options.pop("resources", None)  # where a job runs, not what it computes
        options.pop("placement", None)
        return {"runtime": self.runtime, "version": self.version, "options": options, "libraries": library_versions(self.libraries)}
