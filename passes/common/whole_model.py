"""An export must give the whole model its task needs, never a part of it: every input the task's
model takes and every output it returns, and none of the inputs that only a part of a bigger model
takes (a decoder's ``encoder_hidden_states``: the decoder of an encoder-decoder exported alone;
``decoder_input_ids``: an encoder-decoder traced as if it were an encoder). Checked where an
exporter returns (torch_export, decoder_export), on the graph it wrote."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from engine.core.model_kind import ENCODER_DECODER, describe, generation_task, kind_of, read_config

#: inputs that only part of a larger model takes
PART_INPUTS = ("encoder_hidden_states", "encoder_attention_mask", "encoder_outputs", "decoder_input_ids", "decoder_attention_mask")
#: tasks of an encoder alone
ENCODER_TASKS = ("feature-extraction",)


def check_whole(what: str, inputs: Iterable[str], outputs: Iterable[str], need_inputs: Iterable[str], need_outputs: Iterable[str]) -> None:
    """Raise ValueError naming what the exported graph lacks of ``what`` (e.g. "a causal LM with its
    cache"), or the inputs that show it is a part of a larger model."""
    inputs, outputs = list(inputs), list(outputs)
    lacking = [f"input {n}" for n in need_inputs if n not in inputs] + [f"output {n}" for n in need_outputs if n not in outputs]
    parts = [n for n in inputs if n in PART_INPUTS]
    if lacking or parts:
        found = f"lacks {', '.join(lacking)}" if lacking else f"takes {', '.join(parts)}, an input of part of a larger model"
        raise ValueError(
            f"the export is not {what}: its graph {found} (inputs {inputs}, outputs {outputs}); "
            "it would be shipped as the whole model, so the pass fails instead"
        )


def refuse_encoder_decoder_task(folder: Path, task: str, pass_name: str) -> None:
    """An encoder-decoder folder asked for an encoder's task: the pass would export the encoder (or
    fail tracing the model without its decoder inputs). Raise with the task and pass that fit."""
    config = read_config(folder)
    if config is None or kind_of(config) != ENCODER_DECODER or task not in ENCODER_TASKS:
        return
    right = generation_task(config)
    raise ValueError(
        f"{folder / 'config.json'} describes {describe(config)}, and task {task} exports an encoder alone; "
        f"set input.task: {right} and use pass seq2seq_export (encoder and decoder with cross-attention and cache), not {pass_name}"
    )
