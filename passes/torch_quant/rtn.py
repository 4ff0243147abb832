"""``rtn``: round-to-nearest weight quantization of a decoder in PyTorch, group by group, before
the ONNX build: every ``nn.Linear`` of the decoder layers (``lm_head`` when asked) gets per-group
scales (and zero points) from its own min/max, at 4 or 8 bits, with per-module overrides for
mixed precision. No data. Olive's ``rtn`` pass, with its option names.

The output is a Hugging Face folder in ONNX Runtime GenAI's ``olive`` checkpoint format
(``passes.torch_quant._checkpoint``); build it with ``genai_build`` (``precision: int4``), which
keeps these weights as MatMulNBits.
"""

from __future__ import annotations

from engine.core import Categorical
from passes.torch_quant._pass import TorchQuantConfig, TorchQuantPass


class Rtn(TorchQuantPass):
    name = "rtn"
    summary = (
        "Round-to-nearest weight quantization of a Hugging Face decoder in PyTorch (4 or 8 bits per group, per-module overrides), "
        "written as an olive-format checkpoint that genai_build turns into MatMulNBits."
    )
    version = "2"  # 2: a tied head is untied before it is quantized (the embedding stays float)
    method = "rtn"
    search_space = {"bits": Categorical((4, 8)), "group_size": Categorical((32, 64, 128))}

    class Config(TorchQuantConfig):
        pass

    config: Config
