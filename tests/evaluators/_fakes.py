"""Fake runtimes for the evaluator tests: a session whose prepared run counts itself (and can
fail), a target that opens real ONNX Runtime CPU sessions while counting them, and a bigram
decoder in numpy for the generation evaluators."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from engine.core.artifact import ModelArtifact
from engine.core.errors import KilnError
from engine.core.target import Availability, Generation, GenerativeSession, Session, Target, TargetConfig, TensorSpec


class FakeSession(Session):
    """Doubles ``x``; a prepared run counts itself and says it is bound on the device."""

    def __init__(self, fail: bool) -> None:
        super().__init__(inputs=[TensorSpec("x", "float32", ("batch", 4))], outputs=[TensorSpec("y", "float32", ("batch", 4))])
        self.details = {"io_binding": "bound"}
        self.fail = fail
        self.prepared_runs = self.plain_runs = self.syncs = 0
        self.lock = threading.Lock()

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.fail:
            raise KilnError("boom")
        with self.lock:
            self.plain_runs += 1
        return [feeds["x"] * 2]

    def prepare(self, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
        def call() -> None:
            if self.fail:
                raise KilnError("boom")
            with self.lock:
                self.prepared_runs += 1

        return call

    def synchronize(self) -> None:
        with self.lock:
            self.syncs += 1


class FakeTarget(Target):
    runtime = "fake"
    summary = "test runtime"
    accepts = ("onnx",)

    def __init__(self, config: TargetConfig, fail: bool = False) -> None:
        super().__init__(config)
        self.fail = fail
        self.sessions: list[FakeSession] = []

    def availability(self) -> Availability:
        return Availability(True)

    def open_session(self, model: ModelArtifact) -> Session:
        session = FakeSession(self.fail)
        self.sessions.append(session)
        return session


class RecordingTarget(Target):
    """ONNX Runtime on the CPU, counting the sessions it opens."""

    runtime = "recording"
    summary = "test runtime"
    accepts = ("onnx",)
    opened = 0

    def availability(self) -> Availability:
        return Availability(True)

    def open_session(self, model: ModelArtifact) -> Session:
        from targets.onnxruntime import OnnxRuntimeTarget

        self.opened += 1
        inner = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id=self.id, runtime="onnxruntime", intra_op_threads=1))
        return inner.open_session(model)


class BigramSession(GenerativeSession):
    """A real, if tiny, decoder in numpy: the next-token logits after a token are a row of a
    ``[vocab, vocab]`` table (a bigram model), so every logit, NLL and KL is known exactly. The
    generation loop has no cache (each step reads the last token) and is timed with the clock, as
    a runtime's loop is; ``decode_sleep_s`` slows each decoded token, ``prefill_sleep_s`` the prompt."""

    def __init__(self, table: np.ndarray, decode_sleep_s: float = 0.0, prefill_sleep_s: float = 0.0) -> None:
        super().__init__(
            inputs=[TensorSpec("input_ids", "int64", ("batch", "sequence")), TensorSpec("attention_mask", "int64", ("batch", "sequence"))],
            outputs=[TensorSpec("logits", "float32", ("batch", "sequence", table.shape[1]))],
        )
        self.table = table.astype(np.float32)
        self.decode_sleep_s, self.prefill_sleep_s = decode_sleep_s, prefill_sleep_s
        self.details = {"runtime": "bigram"}
        self.generations = 0
        self.closed = False

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        index = np.asarray(ids, dtype=np.int64)
        if index.size and (index.max() >= len(self.table) or index.min() < 0):
            raise KilnError(f"token id {int(index.max())} is outside the vocabulary of {len(self.table)}")
        return self.table[index]

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Generation:
        self.generations += 1
        start = time.perf_counter()
        if self.prefill_sleep_s:
            time.sleep(self.prefill_sleep_s)
        tokens = [int(np.argmax(self.logits(prompt)[-1]))]
        prefill = time.perf_counter() - start
        decode = []
        for _ in range(max_new_tokens - 1):
            start = time.perf_counter()
            if self.decode_sleep_s:
                time.sleep(self.decode_sleep_s)
            tokens.append(int(np.argmax(self.table[tokens[-1]])))
            decode.append(time.perf_counter() - start)
        return Generation(tokens, prefill, decode)

    def close(self) -> None:
        self.closed = True


def bigram_model(folder: Path, table: np.ndarray, decode_sleep_s: float = 0.0, prefill_sleep_s: float = 0.0) -> ModelArtifact:
    """A ``genai`` model folder holding a bigram table (and how slow the fake runtime makes it)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "table.npy", np.asarray(table, dtype=np.float32))
    (folder / "timing.json").write_text(json.dumps({"decode_sleep_s": decode_sleep_s, "prefill_sleep_s": prefill_sleep_s}))
    (folder / "genai_config.json").write_text("{}")
    return ModelArtifact.from_folder("genai", folder)


class BigramTarget(Target):
    """Opens the bigram models of ``bigram_model`` (``plain``: as a session that cannot generate)."""

    runtime = "bigram"
    summary = "test runtime"
    accepts = ("genai", "onnx")

    def __init__(self, config: TargetConfig, plain: bool = False) -> None:
        super().__init__(config)
        self.plain = plain
        self.sessions: list[Session] = []

    def availability(self) -> Availability:
        return Availability(True)

    def open_session(self, model: ModelArtifact) -> Session:
        if self.plain:
            session: Session = FakeSession(False)
        else:
            timing = json.loads((model.path / "timing.json").read_text())
            session = BigramSession(np.load(model.path / "table.npy"), **timing)
        self.sessions.append(session)
        return session
