"""Kiln's greedy decode loop for a static ``genai`` decoder (the ``static_llm`` pass's folder):
fixed batch, a prefill model (``model.onnx``, ``context_length`` tokens per run) and, when there is
one, a token-generation model (``decode.onnx``, one token per run), both with a fixed KV cache of
``cache_length`` positions.

The lengths are read from the models' fixed input shapes (``input_ids``, ``attention_mask``). The
cache is one ``[1, kv_heads, cache_length, head_size]`` OrtValue per layer's key and value, bound
as past input and present output of both models (GroupQueryAttention writes the new positions in
place). A prompt is right-padded to ``context_length`` and run with a mask of ``context_length``
ones: the padding comes after the prompt, so causal attention keeps it out of the prompt's logits,
and the next token's step overwrites the cache from the prompt's end on (its mask: the tokens so
far plus the step's). Without ``decode.onnx`` every step runs the prefill model with the token
padded, which needs room for ``context_length`` positions after the last token.

A prompt longer than ``context_length``, or a generation that does not fit the cache, is refused.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine.core.errors import KilnError
from engine.core.target import Generation, GenerativeSession, TensorSpec
from targets.onnxruntime.decoder_layout import DecoderLayout

if TYPE_CHECKING:
    import numpy as np

DECODE_FILE = "decode.onnx"


def is_static(inputs: list[TensorSpec], layout: DecoderLayout) -> bool:
    """Whether the decoder's input_ids have a fixed shape (a static_llm model)."""
    for spec in inputs:
        if spec.name == layout.input_ids:
            return bool(spec.shape) and all(isinstance(dim, int) and dim > 0 for dim in spec.shape)
    return False


def _fixed(inputs: list[TensorSpec], name: str | None, axis: int) -> int:
    for spec in inputs:
        if spec.name == name and spec.shape and isinstance(spec.shape[axis], int):
            return int(spec.shape[axis])
    raise KilnError(f"the static decoder's input {name!r} has no fixed dim {axis}")


class StaticDecoderSession(GenerativeSession):
    """Greedy generation over a static decoder's prefill (and token-generation) sessions."""

    def __init__(
        self,
        prefill: Any,
        decode: Any | None,
        inputs: list[TensorSpec],
        outputs: list[TensorSpec],
        details: dict[str, Any],
        layout: DecoderLayout,
        device: str = "cpu",
        device_id: int = 0,
    ) -> None:
        super().__init__(inputs=inputs, outputs=outputs, details=details)
        if layout.attention_mask is None:
            raise KilnError("a static decoder needs an attention_mask input (it says how much of the fixed cache is valid)")
        self.layout = layout
        self.device, self.device_id = device, device_id
        self.batch = _fixed(inputs, layout.input_ids, 0)
        self.context_length = _fixed(inputs, layout.input_ids, 1)
        self.cache_length = _fixed(inputs, layout.attention_mask, 1)
        self._sessions: dict[str, Any] | None = {"prefill": prefill, "decode": decode if decode is not None else prefill}
        self.step_length = 1 if decode is not None else self.context_length
        self._cache: dict[str, Any] = {}
        self.details["decode_loop"] = "static"
        self.details["kv_cache"] = "static shared past/present buffer"
        self.details["static"] = {
            "batch_size": self.batch,
            "context_length": self.context_length,
            "cache_length": self.cache_length,
            "models": ["model.onnx", DECODE_FILE] if decode is not None else ["model.onnx"],
        }

    def _session(self, which: str) -> Any:
        if self._sessions is None:
            raise KilnError("this onnxruntime session is closed")
        return self._sessions[which]

    def _buffers(self) -> dict[str, Any]:
        """The fixed cache, made once: one buffer per layer's key and value."""
        import numpy as np
        import onnxruntime

        if not self._cache:
            layout = self.layout
            shape = (self.batch, layout.kv_heads, self.cache_length, layout.head_size)
            self._cache = {
                name: onnxruntime.OrtValue.ortvalue_from_shape_and_type(shape, np.dtype(layout.cache_dtype), self.device, self.device_id)
                for name in layout.pasts
            }
        return self._cache

    def _step(self, which: str, ids: Sequence[int], past: int) -> np.ndarray:
        """Run ``ids`` (padded to the model's length) after ``past`` cached tokens; every
        position's logits of the padded run come back."""
        import numpy as np
        import onnxruntime

        layout = self.layout
        length = self.context_length if which == "prefill" else self.step_length
        padded = np.zeros((self.batch, length), dtype=layout.ids_dtype)
        padded[:, : len(ids)] = ids
        mask = np.zeros((self.batch, self.cache_length), dtype=layout.mask_dtype)
        mask[:, : past + length] = 1
        feeds = {layout.input_ids: padded, layout.attention_mask: mask}
        if layout.position_ids is not None:
            feeds[layout.position_ids] = np.tile(np.arange(past, past + length, dtype=np.int64), (self.batch, 1))
        session = self._session(which)
        binding = session.io_binding()
        for name, array in feeds.items():
            binding.bind_ortvalue_input(name, onnxruntime.OrtValue.ortvalue_from_numpy(array, self.device, self.device_id))
        cache = self._buffers()
        for past_name, present_name in zip(layout.pasts, layout.presents, strict=True):
            binding.bind_ortvalue_input(past_name, cache[past_name])
            binding.bind_ortvalue_output(present_name, cache[past_name])
        binding.bind_output(layout.logits, self.device, self.device_id)
        from targets.onnxruntime.session import runtime_errors, runtime_message

        try:
            session.run_with_iobinding(binding)
        except runtime_errors() as error:
            raise KilnError(f"onnxruntime failed to run the static decoder: {type(error).__name__}: {runtime_message(error)}") from error
        return np.asarray(binding.get_outputs()[-1].numpy()[0], dtype=np.float32)  # bound last

    def _check_prompt(self, ids: Sequence[int]) -> None:
        if not ids:
            raise KilnError("generation needs a prompt of at least one token")
        if len(ids) > self.context_length:
            raise KilnError(
                f"a prompt of {len(ids)} tokens is longer than the static decoder's fixed prompt length (context_length "
                f"{self.context_length}); make it with a larger context_length or shorten the prompt"
            )

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        self._check_prompt(ids)
        return self._step("prefill", list(ids), 0)[: len(ids)]

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Generation:
        import numpy as np

        self._check_prompt(prompt)
        if max_new_tokens < 1:
            raise KilnError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if self.batch != 1:
            raise KilnError(f"Kiln's static decode loop runs batch 1; this decoder's batch is fixed at {self.batch}")
        # the last step runs after len(prompt) + max_new_tokens - 2 tokens and writes step_length positions
        needed = len(prompt) + max_new_tokens - 2 + self.step_length
        if max_new_tokens > 1 and needed > self.cache_length:
            raise KilnError(
                f"a prompt of {len(prompt)} tokens plus {max_new_tokens} new ones is longer than the static decoder's cache "
                f"({self.cache_length} positions, {self.step_length} written per token)"
            )
        start = time.perf_counter()
        tokens = [int(np.argmax(self._step("prefill", list(prompt), 0)[len(prompt) - 1]))]
        times = [time.perf_counter() - start]
        for past in range(len(prompt), len(prompt) + max_new_tokens - 1):
            start = time.perf_counter()
            tokens.append(int(np.argmax(self._step("decode", [tokens[-1]], past)[0])))
            times.append(time.perf_counter() - start)
        return Generation(tokens=tokens, prefill_s=times[0], decode_s=times[1:])

    def close(self) -> None:
        self._sessions = None
        self._cache = {}
