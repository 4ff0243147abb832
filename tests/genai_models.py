"""Tiny decoders exported by ONNX Runtime GenAI's model builder (fp32 and int4, ~10 s together) for
the generation tests, with PyTorch's greedy continuation and logits to compare them with. The
``tiny_genai`` fixture (tests/targets/conftest.py) builds them once per test session."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.core.artifact import ModelArtifact

PROMPT = [5, 17, 33, 80, 12, 7, 41]
NEW_TOKENS = 10
BUILDER = [sys.executable, "-m", "onnxruntime_genai.models.builder"]


@dataclass(frozen=True)
class TinyGenai:
    hf: Path
    fp32: ModelArtifact
    int4: ModelArtifact
    #: fp32 with ``search.past_present_share_buffer: false`` (present = concat(past, new))
    unshared: ModelArtifact
    #: PyTorch's greedy continuation of PROMPT and its logits over PROMPT
    greedy: list[int]
    torch_logits: np.ndarray


def build(root: Path) -> TinyGenai:
    import torch
    from decoders import greedy, tiny_decoder
    from transformers import AutoModelForCausalLM

    hf = tiny_decoder(root / "hf", "llama")
    builds = {
        precision: subprocess.Popen(
            [*BUILDER, "-i", str(hf), "-o", str(root / precision), "-p", precision, "-e", "cpu", "-c", str(root / f"cache-{precision}")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for precision in ("fp32", "int4")
    }
    reference = greedy(hf, PROMPT, NEW_TOKENS)
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(hf).eval()(torch.tensor([PROMPT])).logits[0].numpy()
    for precision, build in builds.items():
        _, err = build.communicate()
        assert build.returncode == 0, f"the GenAI builder failed on {precision}: {err.decode()[-2000:]}"
    unshared = root / "unshared"
    shutil.copytree(root / "fp32", unshared)
    config = json.loads((unshared / "genai_config.json").read_text())
    config["search"]["past_present_share_buffer"] = False
    (unshared / "genai_config.json").write_text(json.dumps(config))
    return TinyGenai(
        hf=hf,
        fp32=ModelArtifact.from_folder("genai", root / "fp32"),
        int4=ModelArtifact.from_folder("genai", root / "int4"),
        unshared=ModelArtifact.from_folder("genai", unshared),
        greedy=reference,
        torch_logits=logits,
    )
