"""Kiln's own greedy decode loop over an ONNX Runtime session, for decoders in the ``genai`` format.

The model's inputs and outputs are named in its ``genai_config.json`` (``model.decoder.inputs`` /
``outputs``: ``input_ids``, ``attention_mask``, optional ``position_ids``, per-layer
``past_key_values.%d.key`` / ``present.%d.key`` patterns); the cache's shape comes from
``num_key_value_heads`` and ``head_size``, its element type from the model's past inputs.

Two loops, chosen by the target's ``io_binding`` (false: naive; left out or true: bound):

- **bound**: the key/value cache lives in OrtValues on the session's device, bound through I/O
  binding, and only the last position's logits come back to the host per token (greedy argmax;
  the prefill returns every prompt position's, once).
  With ``search.past_present_share_buffer`` (GroupQueryAttention models from the GenAI model
  builder) the cache is allocated once as ``[1, kv_heads, max_length, head_size]`` and the same
  OrtValue is bound as past input and present output: the attention kernel writes the new
  positions in place, and the attention mask's length (the total sequence so far) tells it how
  much of the buffer is valid, as ONNX Runtime GenAI does. Otherwise (present = concat(past, new),
  a ``torch.onnx`` export) the present outputs are allocated on the device by ONNX Runtime and
  bound as the next step's past, without a copy to the host.
- **naive**: every step feeds numpy arrays and gets numpy arrays back, the whole cache included:
  the baseline the bound loop is compared with.

onnxruntime is imported inside functions, never at module import.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine.core.errors import KilnError
from engine.core.target import Generation, GenerativeSession, TensorSpec
from targets.onnxruntime.decoder_layout import DecoderLayout
from targets.onnxruntime.decoder_loop import SharedLoop

if TYPE_CHECKING:
    import numpy as np


class DecoderSession(GenerativeSession):
    """Greedy generation with Kiln's own loop over an ``onnxruntime.InferenceSession``.

    ``host_bytes`` counts what the last ``generate`` copied from the session's outputs to the host
    (logits and, in the naive loop, the cache), so the two loops can be told apart."""

    def __init__(
        self,
        session: Any,
        inputs: list[TensorSpec],
        outputs: list[TensorSpec],
        details: dict[str, Any],
        layout: DecoderLayout,
        bound: bool,
        device: str = "cpu",
        device_id: int = 0,
        graph: bool = False,
    ) -> None:
        super().__init__(inputs=inputs, outputs=outputs, details=details)
        self._session = session
        self.layout = layout
        self.bound = bound
        self.device, self.device_id = device, device_id
        #: on the CPU the shared-buffer loop binds numpy arrays that onnxruntime reads and writes in
        #: place; False binds OrtValues and reads the logits back as on a device (the device's code
        #: path, run on a CPU by the tests)
        self.host_arrays = device == "cpu"
        #: the shared-buffer loop's decode step runs as a CUDA graph (run option gpu_graph_id 1; the
        #: prefill, whose shapes vary, never is), which needs the static mask (decoder_loop)
        self.graph = graph
        #: the step's mask is one [1, capacity] buffer updated in place; on a CPU settable alone
        self.static_mask = graph
        self.host_bytes = 0
        self.last_cache: dict[str, Any] = {}
        self._loop: SharedLoop | None = None
        self._vocab_size: int | None = None
        self.details["io_binding"] = ("device" if device != "cpu" else "host") if bound else "off"
        self.details["decode_loop"] = "bound" if bound else "naive"
        self.details["kv_cache"] = "shared past/present buffer" if bound and layout.share_buffer else "concat (present fed back as past)"
        if graph:
            self.details["cuda_graph"] = {"decode_step": True, "note": "the decode step replayed as one CUDA graph, on a static mask"}

    def _live(self) -> Any:
        if self._session is None:
            raise KilnError("this onnxruntime session is closed")
        return self._session

    # -- feeds ---------------------------------------------------------------------------------

    def _step_feeds(self, ids: Sequence[int], past_length: int) -> dict[str, np.ndarray]:
        import numpy as np

        feeds = {self.layout.input_ids: np.asarray([list(ids)], dtype=self.layout.ids_dtype)}
        feeds.update(self._span_feeds(past_length, len(ids)))
        return feeds

    def _span_feeds(self, past_length: int, count: int) -> dict[str, np.ndarray]:
        """The attention mask and (if the model has them) positions of ``count`` new tokens
        after ``past_length`` cached ones."""
        import numpy as np

        layout = self.layout
        total = past_length + count
        feeds = {}
        if layout.attention_mask is not None:
            feeds[layout.attention_mask] = np.ones((1, total), dtype=layout.mask_dtype)
        if layout.position_ids is not None:
            feeds[layout.position_ids] = np.arange(past_length, total, dtype=np.int64)[None, :]
        return feeds

    def _empty_cache(self) -> np.ndarray:
        import numpy as np

        # a shared buffer of the window's length for a sliding-window model (its mask says none is valid)
        length = self.layout.capacity(0)
        return np.zeros((1, self.layout.kv_heads, length, self.layout.head_size), dtype=self.layout.cache_dtype)

    def _run(self, feeds: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
        from targets.onnxruntime.session import runtime_errors, runtime_message

        try:
            return list(self._live().run(names, feeds))
        except runtime_errors() as error:
            raise KilnError(f"onnxruntime failed to run the decoder: {type(error).__name__}: {runtime_message(error)}") from error

    # -- the SDK -------------------------------------------------------------------------------

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        import numpy as np

        if not ids:
            raise KilnError("logits of an empty sequence")
        feeds = self._step_feeds(ids, 0)
        for name in self.layout.pasts:
            feeds[name] = self._empty_cache()
        (logits,) = self._run(feeds, [self.layout.logits])
        return np.asarray(logits[0], dtype=np.float32)

    def generate(self, prompt: Sequence[int], max_new_tokens: int) -> Generation:
        if not prompt:
            raise KilnError("generation needs a prompt of at least one token")
        if max_new_tokens < 1:
            raise KilnError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        length = len(prompt) + max_new_tokens
        if length > self.layout.context_length:
            raise KilnError(
                f"a prompt of {len(prompt)} tokens plus {max_new_tokens} new ones is longer than the model's context ({self.layout.context_length})"
            )
        self.host_bytes = 0
        if not self.bound:
            return self._naive(list(prompt), max_new_tokens)
        return self._bound(list(prompt), max_new_tokens, length)

    def _naive(self, prompt: list[int], n: int) -> Generation:
        import numpy as np

        layout = self.layout
        cache = {name: self._empty_cache() for name in layout.pasts}
        names = [layout.logits, *layout.presents]
        tokens: list[int] = []
        times: list[float] = []
        ids, past = prompt, 0
        for _ in range(n):
            start = time.perf_counter()
            feeds = self._step_feeds(ids, past)
            feeds.update(cache)
            logits, *presents = self._run(feeds, names)
            token = int(np.argmax(logits[0, -1]))
            cache = dict(zip(layout.pasts, presents, strict=True))
            times.append(time.perf_counter() - start)
            self.host_bytes += logits.nbytes + sum(array.nbytes for array in presents)
            tokens.append(token)
            past += len(ids)
            ids = [token]
        return Generation(tokens=tokens, prefill_s=times[0], decode_s=times[1:])

    def _bound(self, prompt: list[int], n: int, length: int) -> Generation:
        import numpy as np
        import onnxruntime

        layout = self.layout
        device, device_id = self.device, self.device_id
        if layout.share_buffer:
            return self._bound_shared(prompt, n, length)
        shape = (1, layout.kv_heads, 0, layout.head_size)
        cache = {
            name: onnxruntime.OrtValue.ortvalue_from_shape_and_type(shape, np.dtype(layout.cache_dtype), device, device_id)
            for name in layout.pasts
        }
        tokens: list[int] = []
        times: list[float] = []
        #: the previous step's binding, kept alive while its present outputs are bound as past
        previous: Any = None
        ids, past = prompt, 0
        for _ in range(n):
            start = time.perf_counter()
            binding, _feeds = self._binding(ids, past, cache)  # the feeds alive until the run
            binding.bind_output(layout.logits, device, device_id)
            for name in layout.presents:
                binding.bind_output(name, device, device_id)
            self._run_bound(binding)
            outputs = binding.get_outputs()  # in the order they were bound: logits, then the presents
            host = outputs[0].numpy()  # the only copy to the host: the logits
            token = int(np.argmax(host[0, -1]))
            cache = dict(zip(layout.pasts, outputs[1:], strict=True))
            previous = binding
            times.append(time.perf_counter() - start)
            self.host_bytes += host.nbytes
            tokens.append(token)
            past += len(ids)
            ids = [token]
        del previous
        #: the cache of the last generation, as the loop left it (OrtValues on the session's device)
        self.last_cache = cache
        return Generation(tokens=tokens, prefill_s=times[0], decode_s=times[1:])

    def _shared_loop(self, length: int, vocab: int) -> SharedLoop:
        """The shared-buffer loop's state for generations of up to ``length`` tokens, made once and
        reused by every generation that fits (remade, larger, when one does not)."""
        loop = self._loop
        if loop is not None and loop.length >= length:
            return loop
        self._loop = None  # the old buffers go before the larger ones come
        self._loop = SharedLoop.make(self, length, vocab)
        return self._loop

    def _bound_shared(self, prompt: list[int], n: int, length: int) -> Generation:
        """The loop over one past/present buffer: the prefill binds the prompt's ids and mask to a
        binding whose cache is bound already; each decode step then reuses one binding in which
        only the token (updated in place), the attention mask (one longer each step) and, if the
        model has them, the positions change. Per token that is a handful of calls into
        onnxruntime, not one per cache tensor: on a small model on a CPU the calls, not the
        arithmetic, are what a step costs. On the CPU the logits are written by onnxruntime
        straight into numpy arrays the loop keeps (no copy per step)."""
        import numpy as np

        layout = self.layout
        vocab = self._vocab()
        loop = self._shared_loop(length, vocab)
        times: list[float] = []
        start = time.perf_counter()
        feeds = self._step_feeds(prompt, 0)  # alive until the run: bound on the CPU without a copy
        kept = []  # the prefill's OrtValues, alive until it has run
        for name, array in feeds.items():
            if self.host_arrays:
                loop.prefill.bind_cpu_input(name, array)
            else:
                kept.append(self._device_value(array))
                loop.prefill.bind_ortvalue_input(name, kept[-1])
        logits = loop.prefill_logits(self, len(prompt))
        loop.start(len(prompt))
        self._run_bound(loop.prefill, self._graph_options("-1"))  # never captured: its shapes vary
        # read by name, never by position: get_outputs() lists the outputs in the order they were
        # bound, the presents first (bound once with the buffers), so [0] is present.0.key
        host = logits if isinstance(logits, np.ndarray) else logits.numpy()
        del kept
        tokens = [int(np.argmax(host[0, -1]))]
        times.append(time.perf_counter() - start)
        self.host_bytes += host.shape[1] * vocab * host.itemsize
        ids_dtype = np.dtype(layout.ids_dtype)
        step_options = self._graph_options("1")
        for past in range(len(prompt), len(prompt) + n - 1):
            start = time.perf_counter()
            loop.token.update_inplace(np.asarray([[tokens[-1]]], dtype=ids_dtype))
            if loop.mask is not None:
                loop.advance(past)
            else:
                loop.step_feeds = self._bind_positions(loop.step, past)  # kept alive until the next step binds its own
            self._run_bound(loop.step, step_options)
            last = loop.step_host if loop.step_host is not None else loop.step_logits.numpy()
            tokens.append(int(np.argmax(last[0, -1])))
            times.append(time.perf_counter() - start)
            self.host_bytes += last.nbytes
        self.last_cache = loop.cache
        return Generation(tokens=tokens, prefill_s=times[0], decode_s=times[1:])

    def _vocab(self) -> int:
        """The logits' last dimension: from the model's output shape, else from one prefill."""
        dims = self._spec(self.layout.logits).shape
        if dims and isinstance(dims[-1], int) and dims[-1] > 0:
            return dims[-1]
        if self._vocab_size is None:
            self._vocab_size = int(self.logits([0]).shape[-1])
        return self._vocab_size

    def _device_value(self, array: np.ndarray) -> Any:
        import onnxruntime

        return onnxruntime.OrtValue.ortvalue_from_numpy(array, self.device, self.device_id)

    def _binding(self, ids: Sequence[int], past: int, cache: dict[str, Any]) -> tuple[Any, list[Any]]:
        """A binding with this step's feeds (ids, mask, positions) and the cache as past, and the
        feeds' OrtValues, which the caller keeps alive until the run."""
        binding = self._live().io_binding()
        values = []
        for name, array in self._step_feeds(ids, past).items():
            values.append(self._device_value(array))
            binding.bind_ortvalue_input(name, values[-1])
        for name, value in cache.items():
            binding.bind_ortvalue_input(name, value)
        return binding, values

    def _bind_positions(self, binding: Any, past: int) -> list[Any]:
        """Bind the attention mask (and positions) of a one-token step after ``past`` tokens; the
        OrtValues bound, which the caller keeps alive until the run (on the CPU an OrtValue made
        from a numpy array reads that array's memory, which goes with the Python object)."""
        values = []
        for name, array in self._span_feeds(past, 1).items():
            values.append(self._device_value(array))
            binding.bind_ortvalue_input(name, values[-1])
        return values

    def _graph_options(self, graph_id: str) -> Any:
        """Run options naming the CUDA graph a run is (``-1``: none), when the step runs as one."""
        if not self.graph:
            return None
        import onnxruntime

        options = onnxruntime.RunOptions()
        options.add_run_config_entry("gpu_graph_id", graph_id)
        return options

    def _run_bound(self, binding: Any, options: Any = None) -> None:
        from targets.onnxruntime.session import runtime_errors, runtime_message

        try:
            self._live().run_with_iobinding(binding, options)
        except runtime_errors() as error:
            raise KilnError(
                f"onnxruntime failed to run the decoder with I/O binding: {type(error).__name__}: {runtime_message(error)}"
            ) from error

    def _spec(self, name: str) -> TensorSpec:
        for spec in self.outputs:
            if spec.name == name:
                return spec
        raise KilnError(f"the decoder has no output {name!r}; it has {', '.join(spec.name for spec in self.outputs)}")

    def close(self) -> None:
        self._session = None
        self.last_cache = {}
        self._loop = None
