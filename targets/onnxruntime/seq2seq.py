"""Kiln's greedy loop over an encoder-decoder model in the ``seq2seq`` format, on ONNX Runtime.

The folder's ``seq2seq.json`` names the two models and their inputs and outputs (written by
``seq2seq_export``): the encoder runs once per source and returns the encoder states and, per
decoder layer, the cross-attention keys and values; the decoder runs one step at a time with the
self-attention cache (empty on the first step: ``[batch, heads, 0, head_size]``) and the
cross-attention cache, and returns the logits and the self-attention cache with the step's tokens
appended, which is fed back as the next step's past.

The loop feeds numpy arrays and gets numpy arrays back (the cache included), as ``decoder``'s naive
loop does: batch 1 on the CPU. It does not bind the cache on a device yet.

onnxruntime is imported inside functions, never at module import.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.errors import KilnError
from engine.core.target import Generation, Seq2SeqSession, TensorSpec

if TYPE_CHECKING:
    import numpy as np

MANIFEST = "seq2seq.json"


@dataclass(frozen=True)
class Seq2SeqLayout:
    """What the loop needs from seq2seq.json."""

    encoder_file: str
    decoder_file: str
    encoder_inputs: list[str]
    encoder_outputs: list[str]
    decoder_inputs: list[str]
    decoder_outputs: list[str]
    layers: int
    start_token: int
    eos_tokens: tuple[int, ...]

    @classmethod
    def read(cls, folder: Path) -> Seq2SeqLayout:
        path = Path(folder) / MANIFEST
        try:
            manifest = json.loads(path.read_text())
            encoder, decoder = manifest["encoder"], manifest["decoder"]
            eos = manifest.get("eos_token_id")
            eos_tokens = tuple(int(t) for t in (eos if isinstance(eos, list) else [] if eos is None else [eos]))
            return cls(
                encoder_file=str(encoder["filename"]),
                decoder_file=str(decoder["filename"]),
                encoder_inputs=[str(n) for n in encoder["inputs"]],
                encoder_outputs=[str(n) for n in encoder["outputs"]],
                decoder_inputs=[str(n) for n in decoder["inputs"]],
                decoder_outputs=[str(n) for n in decoder["outputs"]],
                layers=int(manifest["layers"]),
                start_token=int(manifest["decoder_start_token_id"]),
                eos_tokens=eos_tokens,
            )
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise KilnError(f"cannot read the encoder-decoder layout from {path}: {type(error).__name__}: {error}") from error

    def files(self) -> list[str]:
        return [self.encoder_file, self.decoder_file]


class OrtSeq2SeqSession(Seq2SeqSession):
    """Greedy generation with an encoder and a decoder-with-past ``InferenceSession``."""

    def __init__(
        self,
        encoder: Any,
        decoder: Any,
        layout: Seq2SeqLayout,
        inputs: list[TensorSpec],
        outputs: list[TensorSpec],
        details: dict[str, Any],
    ) -> None:
        super().__init__(inputs=inputs, outputs=outputs, details=details)
        self._encoder, self._decoder, self.layout = encoder, decoder, layout
        self._wanted = {arg.name for arg in decoder.get_inputs()}
        self.details["decode_loop"] = "seq2seq"
        self.details["kv_cache"] = "self-attention past fed back as host arrays, cross-attention keys / values from the encoder"
        self.details["io_binding"] = "off"

    def _live(self) -> tuple[Any, Any]:
        if self._encoder is None or self._decoder is None:
            raise KilnError("this onnxruntime session is closed")
        return self._encoder, self._decoder

    def _run(self, session: Any, names: list[str], feeds: dict[str, np.ndarray], part: str) -> list[np.ndarray]:
        from targets.onnxruntime.session import runtime_errors, runtime_message

        try:
            return list(session.run(names, feeds))
        except runtime_errors() as error:
            raise KilnError(f"onnxruntime failed to run the {part}: {type(error).__name__}: {runtime_message(error)}") from error

    def start_tokens(self) -> list[int]:
        return [self.layout.start_token]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        encoder, _ = self._live()
        missing = [name for name in self.layout.encoder_inputs if name not in feeds]
        if missing:
            raise KilnError(f"the encoder needs {', '.join(missing)} (given: {', '.join(sorted(feeds)) or 'nothing'})")
        return self._run(encoder, self.layout.encoder_outputs, {n: feeds[n] for n in self.layout.encoder_inputs}, "encoder")

    def _decoder_state(self, source: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The decoder's feeds that stay for a whole generation, and the empty self-attention past."""
        import numpy as np

        hidden, *cross = self.run(source)
        state = {"encoder_hidden_states": hidden}
        if "encoder_attention_mask" in self._wanted:
            mask = source.get("attention_mask")
            state["encoder_attention_mask"] = np.asarray(mask) if mask is not None else np.ones(hidden.shape[:2], dtype=np.int64)
        for i in range(self.layout.layers):
            key, value = cross[2 * i], cross[2 * i + 1]
            state[f"past_key_values.{i}.encoder.key"] = key
            state[f"past_key_values.{i}.encoder.value"] = value
            empty = np.zeros((key.shape[0], key.shape[1], 0, key.shape[3]), dtype=key.dtype)
            state[f"past_key_values.{i}.decoder.key"] = empty
            state[f"past_key_values.{i}.decoder.value"] = empty
        return {name: array for name, array in state.items() if name in self._wanted}

    def _step(self, state: dict[str, np.ndarray], ids: Sequence[int]) -> np.ndarray:
        """One decoder run over ``ids``; updates the self-attention past in ``state``; the logits."""
        import numpy as np

        _, decoder = self._live()
        feeds = {**state, "decoder_input_ids": np.asarray([list(ids)], dtype=np.int64)}
        logits, *present = self._run(decoder, self.layout.decoder_outputs, feeds, "decoder")
        for i in range(self.layout.layers):
            state[f"past_key_values.{i}.decoder.key"] = present[2 * i]
            state[f"past_key_values.{i}.decoder.value"] = present[2 * i + 1]
        return logits

    def first_logits(self, source: dict[str, np.ndarray], prompt: Sequence[int] | None = None) -> np.ndarray:
        import numpy as np

        ids = list(prompt) if prompt else self.start_tokens()
        logits = self._step(self._decoder_state(source), ids)
        return np.asarray(logits[0], dtype=np.float32)

    def generate_from(
        self, source: dict[str, np.ndarray], max_new_tokens: int, prompt: Sequence[int] | None = None, stop_at_eos: bool = False
    ) -> Generation:
        import numpy as np

        if max_new_tokens < 1:
            raise KilnError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        ids = list(prompt) if prompt else self.start_tokens()
        tokens: list[int] = []
        times: list[float] = []
        start = time.perf_counter()
        state = self._decoder_state(source)
        for _ in range(max_new_tokens):
            logits = self._step(state, ids)
            token = int(np.argmax(logits[0, -1]))
            tokens.append(token)
            times.append(time.perf_counter() - start)
            start = time.perf_counter()
            if stop_at_eos and token in self.layout.eos_tokens:
                break
            ids = [token]
        return Generation(tokens=tokens, prefill_s=times[0], decode_s=times[1:])

    def close(self) -> None:
        self._encoder = self._decoder = None


def open_seq2seq(create: Any, folder: Path, details: dict[str, Any]) -> OrtSeq2SeqSession:
    """The session over ``folder``: ``create(path)`` makes each part's ``InferenceSession``."""
    from targets.onnxruntime.session import numpy_dtype_name, tensor_shape

    layout = Seq2SeqLayout.read(folder)
    missing = [name for name in layout.files() if not (Path(folder) / name).is_file()]
    if missing:
        raise KilnError(f"{Path(folder) / MANIFEST} names {', '.join(missing)}, which the folder does not hold")
    encoder = create(Path(folder) / layout.encoder_file)
    decoder = create(Path(folder) / layout.decoder_file)
    inputs = [TensorSpec(arg.name, numpy_dtype_name(arg.type), tensor_shape(arg.shape)) for arg in encoder.get_inputs()]
    outputs = [TensorSpec(arg.name, numpy_dtype_name(arg.type), tensor_shape(arg.shape)) for arg in decoder.get_outputs()[:1]]
    return OrtSeq2SeqSession(encoder, decoder, layout, inputs, outputs, details)
