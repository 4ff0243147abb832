"""Helpers for the decoder pass tests: run a pass on an artifact, and generate greedily with
ONNX Runtime GenAI from a ``genai`` folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.core import ModelArtifact, PassContext, PassResult

PROMPT = [5, 17, 42, 7, 99, 3]
NEW_TOKENS = 8


def run_pass(pass_cls: Any, model: ModelArtifact, root: Path, **config: Any) -> PassResult:
    """Run ``pass_cls`` with ``config`` on ``model``, in ``root``/work -> ``root``/out."""
    (root / "work").mkdir(parents=True, exist_ok=True)
    ctx = PassContext(step_id=pass_cls.name, workdir=root / "work", output_dir=root / "out")
    return pass_cls(pass_cls.Config(**config))(model, ctx)


def og_greedy(folder: Path, prompt: list[int], new_tokens: int, ignore_eos: bool = False) -> list[int]:
    """ONNX Runtime GenAI's greedy continuation of ``prompt``: ``new_tokens`` tokens, or fewer when
    it ends at EOS (compare with ``until_eos(greedy(...))``). ``ignore_eos``: always
    ``new_tokens`` (min_length: EOS is never chosen, so it is not PyTorch's greedy choice then)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    total = len(prompt) + new_tokens
    if ignore_eos:
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
    else:
        params.set_search_options(max_length=total, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    out: list[int] = []
    while not generator.is_done() and len(out) < new_tokens:
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def until_eos(tokens: list[int], eos: int = 0) -> list[int]:
    """``tokens`` up to and including the first EOS (tests/decoders.py's tokenizer: token 0)."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
