"""The state Kiln's shared-buffer decode loop (``targets.onnxruntime.decoder``) keeps between
generations: the past/present buffers, the prefill's and the decode step's bindings, the step's
token, mask and logits. With a static mask (``DecoderSession.graph``) the step's attention mask is
one ``[1, capacity]`` buffer, ones for the tokens so far and zeros after, updated in place: every
input and output of the step then keeps its shape and address from token to token, which is what a
CUDA graph of the step needs (GroupQueryAttention reads the valid length from the mask's sum)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from targets.onnxruntime.decoder import DecoderSession


@dataclass
class SharedLoop:
    """What the shared-buffer loop keeps between generations: the past/present buffers
    (``[1, kv_heads, length, head_size]`` each; the attention mask, not the buffer, says how much
    is valid), the prefill's and the decode step's bindings with those buffers bound, the step's
    token and logits. Made fresh per generation, the buffers' first touch (page faults on newly
    mapped memory) and the binding calls landed inside the timed prefill. On the CPU the logits
    are bound to numpy arrays kept here (``*_host``), which onnxruntime writes in place."""

    length: int
    cache: dict[str, Any]
    prefill: Any
    step: Any
    token: Any
    step_logits: Any
    step_host: np.ndarray | None
    prefill_host: np.ndarray | None
    #: the decode step's mask / positions OrtValues, alive while they are bound
    step_feeds: list[Any] = field(default_factory=list)
    #: static mask: the step's ``[1, capacity]`` mask (host copy and bound value) and its
    #: ``[1, 1]`` positions, bound once and updated in place; None otherwise
    mask_host: np.ndarray | None = None
    mask: Any = None
    positions: Any = None

    def start(self, prompt_length: int) -> None:
        """A static mask reset for a generation whose prompt holds ``prompt_length`` tokens."""
        if self.mask_host is not None:
            self.mask_host[:] = 0
            self.mask_host[0, :prompt_length] = 1

    def advance(self, past: int) -> None:
        """A static mask (and positions) for the step that writes position ``past``."""
        import numpy as np

        assert self.mask_host is not None
        self.mask_host[0, past] = 1
        self.mask.update_inplace(self.mask_host)
        if self.positions is not None:
            self.positions.update_inplace(np.asarray([[past]], dtype=np.int64))

    @classmethod
    def make(cls, session: DecoderSession, length: int, vocab: int) -> SharedLoop:
        import numpy as np
        import onnxruntime

        layout, device, device_id = session.layout, session.device, session.device_id
        shape = (1, layout.kv_heads, layout.capacity(length), layout.head_size)
        on_host = session.host_arrays
        cache = {
            name: onnxruntime.OrtValue.ortvalue_from_shape_and_type(shape, np.dtype(layout.cache_dtype), device, device_id)
            for name in layout.pasts
        }
        live = session._live()
        prefill, step = live.io_binding(), live.io_binding()
        for binding in (prefill, step):
            for past_name, present_name in zip(layout.pasts, layout.presents, strict=True):
                binding.bind_ortvalue_input(past_name, cache[past_name])
                binding.bind_ortvalue_output(present_name, cache[past_name])
        token = session._device_value(np.zeros((1, 1), dtype=layout.ids_dtype))
        step.bind_ortvalue_input(layout.input_ids, token)
        logits_dtype = np.dtype(session._spec(layout.logits).dtype)
        step_host = np.zeros((1, 1, vocab), dtype=logits_dtype) if on_host else None
        if step_host is not None:
            step_logits = session._device_value(step_host)
        else:
            step_logits = onnxruntime.OrtValue.ortvalue_from_shape_and_type((1, 1, vocab), logits_dtype, device, device_id)
        step.bind_ortvalue_output(layout.logits, step_logits)
        prefill_host = np.zeros((1, length, vocab), dtype=logits_dtype) if on_host else None
        loop = cls(length, cache, prefill, step, token, step_logits, step_host, prefill_host)
        if session.static_mask and layout.attention_mask is not None:
            loop.mask_host = np.zeros((1, shape[2]), dtype=layout.mask_dtype)
            loop.mask = onnxruntime.OrtValue.ortvalue_from_shape_and_type(loop.mask_host.shape, loop.mask_host.dtype, device, device_id)
            step.bind_ortvalue_input(layout.attention_mask, loop.mask)
            if layout.position_ids is not None:
                loop.positions = onnxruntime.OrtValue.ortvalue_from_shape_and_type((1, 1), np.dtype(np.int64), device, device_id)
                step.bind_ortvalue_input(layout.position_ids, loop.positions)
        return loop

    def prefill_logits(self, session: DecoderSession, count: int) -> Any:
        """Bind the prefill's logits output for a prompt of ``count`` tokens and return what it is
        written to: on the CPU a view of the kept array (onnxruntime writes it), elsewhere an
        OrtValue on the device (read after the run)."""
        if self.prefill_host is None:
            import numpy as np
            import onnxruntime

            dtype = np.dtype(session._spec(session.layout.logits).dtype)
            value = onnxruntime.OrtValue.ortvalue_from_shape_and_type(
                (1, count, self.step_logits.shape()[-1]), dtype, session.device, session.device_id
            )
            self.prefill.bind_ortvalue_output(session.layout.logits, value)
            return value
        view = self.prefill_host[:, :count, :]  # C-contiguous: batch 1, leading positions
        self.prefill.bind_ortvalue_output(session.layout.logits, session._device_value(view))
        return view


def graph_problem(layout: Any, static: bool) -> str | None:
    """Why the decode step of a decoder with ``layout`` cannot run as a CUDA graph, or None: only
    the shared past/present buffer (GroupQueryAttention) keeps every shape of the step from token
    to token; a present that grows (concat) or a sliding window's ring does not."""
    if static:
        return "a static_llm folder runs its own fixed-shape loop"
    if not layout.share_buffer:
        return "its present key/values grow by one position every token (no shared past/present buffer)"
    if layout.window and layout.window < layout.context_length:
        return f"its sliding window ({layout.window}) wraps the shared buffer"
    return None
