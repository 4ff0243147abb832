"""Tiny decoders exported by Kiln's ``genai_build`` pass (ONNX Runtime GenAI's model builder; fp32 and
int4, ~10 s together) for the pass, target and evaluator tests, with PyTorch's greedy continuation
and logits to compare them with. The ``tiny_genai`` fixture (tests/conftest.py) builds them once
per test session."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.core import ModelArtifact, PassContext, PassResult

PROMPT = [5, 17, 33, 80, 12, 7, 41]
NEW_TOKENS = 10


@dataclass(frozen=True)
class TinyGenai:
    hf: Path
    #: the genai_build results (details included), for the pass's own tests
    builds: dict[str, PassResult]
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

    from passes.generate.genai_build import GenaiBuild

    hf = tiny_decoder(root / "hf", "llama", hidden=128)
    source = ModelArtifact.from_folder("hf", hf)

    def export(precision: str) -> PassResult:
        (root / f"work-{precision}").mkdir()
        ctx = PassContext(step_id=f"build-{precision}", workdir=root / f"work-{precision}", output_dir=root / precision)
        config = {"precision": precision, "block_size": 32} if precision == "int4" else {}
        return GenaiBuild(GenaiBuild.Config(**config))(source, ctx)

    with ThreadPoolExecutor(max_workers=2) as pool:  # the builder runs in subprocesses
        futures = {precision: pool.submit(export, precision) for precision in ("fp32", "int4")}
        reference = greedy(hf, PROMPT, NEW_TOKENS)
        with torch.no_grad():
            logits = AutoModelForCausalLM.from_pretrained(hf).eval()(torch.tensor([PROMPT])).logits[0].numpy()
        builds = {precision: future.result() for precision, future in futures.items()}
    unshared = root / "unshared"
    shutil.copytree(root / "fp32", unshared)
    config = json.loads((unshared / "genai_config.json").read_text())
    config["search"]["past_present_share_buffer"] = False
    (unshared / "genai_config.json").write_text(json.dumps(config))
    return TinyGenai(
        hf=hf,
        builds=builds,
        fp32=ModelArtifact.from_folder("genai", root / "fp32"),
        int4=ModelArtifact.from_folder("genai", root / "int4"),
        unshared=ModelArtifact.from_folder("genai", unshared),
        greedy=reference,
        torch_logits=logits,
    )
