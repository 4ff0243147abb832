"""What Kiln's decode loop needs to know of a decoder in the ``genai`` format, read from its
``genai_config.json`` (``model.decoder.inputs`` / ``outputs`` name the inputs and outputs, the
per-layer ``past_key_values.%d.key`` / ``present.%d.key`` patterns among them) and from the
model's inputs (the cache's element type)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.core.errors import KilnError
from engine.core.target import TensorSpec

CONFIG_FILE = "genai_config.json"


@dataclass(frozen=True)
class DecoderLayout:
    """What the loop needs from genai_config.json and the model's inputs."""

    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    logits: str
    past_keys: list[str]
    past_values: list[str]
    present_keys: list[str]
    present_values: list[str]
    kv_heads: int
    head_size: int
    context_length: int
    share_buffer: bool
    #: numpy dtype of the cache (float16 for fp16 models), of input_ids, of attention_mask
    cache_dtype: str
    ids_dtype: str
    mask_dtype: str
    #: the sliding window of local-attention layers (``model.decoder.sliding_window.window_size``;
    #: 0: none). GroupQueryAttention refuses a shared past buffer shorter than it.
    window: int = 0

    def capacity(self, length: int) -> int:
        """The length of a shared past/present buffer for ``length`` tokens: at least the window."""
        return max(length, min(self.window, self.context_length)) if self.share_buffer else length

    @classmethod
    def read(cls, folder: Path, inputs: list[TensorSpec]) -> DecoderLayout:
        path = Path(folder) / CONFIG_FILE
        try:
            config = json.loads(path.read_text())
            model = config["model"]
            decoder = model["decoder"]
            names_in, names_out = decoder.get("inputs", {}), decoder.get("outputs", {})
            layers = int(decoder["num_hidden_layers"])
            kv_heads = int(decoder.get("num_key_value_heads", decoder.get("num_attention_heads")))
            head_size = int(decoder["head_size"])
            context_length = int(model.get("context_length") or config.get("search", {}).get("max_length"))
            window = int((decoder.get("sliding_window") or {}).get("window_size") or 0)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise KilnError(f"cannot read the decoder's layout from {path}: {type(error).__name__}: {error}") from error
        share = bool(config.get("search", {}).get("past_present_share_buffer", False))
        given = {spec.name: spec for spec in inputs}

        def optional(key: str, default: str) -> str | None:
            name = names_in.get(key, default)
            return name if name in given else None

        def per_layer(pattern: str) -> list[str]:
            return [pattern % i for i in range(layers)]

        past_keys = per_layer(names_in.get("past_key_names", "past_key_values.%d.key"))
        input_ids = names_in.get("input_ids", "input_ids")
        missing = [name for name in (input_ids, *past_keys) if name not in given]
        if missing:
            raise KilnError(f"the model in {folder} has no input {', '.join(missing)} named in {CONFIG_FILE}")
        mask = optional("attention_mask", "attention_mask")
        return cls(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=optional("position_ids", "position_ids"),
            logits=names_out.get("logits", "logits"),
            past_keys=past_keys,
            past_values=per_layer(names_in.get("past_value_names", "past_key_values.%d.value")),
            present_keys=per_layer(names_out.get("present_key_names", "present.%d.key")),
            present_values=per_layer(names_out.get("present_value_names", "present.%d.value")),
            kv_heads=kv_heads,
            head_size=head_size,
            context_length=context_length,
            share_buffer=share,
            cache_dtype=given[past_keys[0]].dtype,
            ids_dtype=given[input_ids].dtype,
            mask_dtype=given[mask].dtype if mask else "int64",
            window=window,
        )

    @property
    def pasts(self) -> list[str]:
        return [*self.past_keys, *self.past_values]

    @property
    def presents(self) -> list[str]:
        return [*self.present_keys, *self.present_values]
