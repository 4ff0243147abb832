"""bench/architectures.py's setup: Optimum's environment, the host's description and the tiny models.

Optimum's environment is built as bench/_vs_olive_setup.py builds Olive's: a plain virtual
environment, pip with ``-c constraints.txt`` (torch stays the CPU wheel), and a ``.pth`` file putting
Kiln's own site-packages after the environment's, so torch, onnx and onnxruntime are the very
libraries Kiln runs with. optimum-onnx 0.1.0 needs transformers < 4.58 (Kiln's environment holds
transformers 5): that one lives in the environment. Built once per requirements hash and reused.

The models are random-weight transformers models (2 layers, hidden 128 where the family has one),
saved with ``save_pretrained`` and no tokenizer files. They are built with the test builders
(tests/decoders.py, tests/vision_models.py, tests/seq2seq_models.py) where their sizes fit, sizes
passed through; the builders live in tests/, which is put on ``sys.path`` here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _tool_venv import ensure_venv

ROOT = Path(__file__).resolve().parents[1]
OPTIMUM_REQUIREMENTS = ("optimum-onnx==0.1.0", "transformers<4.58")
HIDDEN = 128
#: the image side of the vision models (their image processor's and ViT's config size)
SIDE = 64


@dataclass(frozen=True)
class Architecture:
    """One row of the bench: a family, the task both tools are told, and how to build it."""

    name: str
    task: str
    build: Callable[[Path], Path]


def ensure_optimum_venv(venv: Path | None, log: Any = print) -> Path:
    """The Python of Optimum's environment (bench/_tool_venv.py), built first unless its marker names this requirements hash."""
    return ensure_venv("optimum", OPTIMUM_REQUIREMENTS, venv, log)


def package_version(python: Path | str, package: str) -> str:
    """``package``'s version as ``python`` imports it (``?`` where it does not)."""
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


def cpu() -> dict[str, Any]:
    """The host's CPU model, core count and the flags that decide INT8 speed."""
    import os

    model, flags = "unknown", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    named = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8") if f in flags]
    return {"model": model, "cores": os.cpu_count(), "flags": named, "avx512_vnni": "avx512_vnni" in flags}


def _tests_on_path() -> None:
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.append(tests)  # last: tests/engine/ must not shadow the engine package


def _text_encoder(family: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        import torch
        import transformers

        cls = {"bert": "BertConfig", "distilbert": "DistilBertConfig", "roberta": "RobertaConfig"}[family]
        sizes: dict[str, Any] = (
            {"dim": HIDDEN, "n_layers": 2, "n_heads": 4, "hidden_dim": 2 * HIDDEN}
            if family == "distilbert"
            else {"hidden_size": HIDDEN, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 2 * HIDDEN}
        )
        config = getattr(transformers, cls)(vocab_size=1000, max_position_embeddings=256, num_labels=2, **sizes)
        torch.manual_seed(0)
        transformers.AutoModelForSequenceClassification.from_config(config).eval().save_pretrained(folder)
        return folder

    return build


def _vision(family: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        _tests_on_path()
        import torch
        from vision_models import FAMILIES, config, processor_config

        extras: dict[str, dict[str, Any]] = {
            "vit": {"hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_attention_heads": 4, "image_size": SIDE},
            "resnet": {"embedding_size": 32, "hidden_sizes": [64, HIDDEN]},
            "convnext": {"hidden_sizes": [64, HIDDEN]},
        }
        extra = extras[family]
        import transformers

        torch.manual_seed(0)
        getattr(transformers, FAMILIES[family][1])(config(family, **extra)).eval().save_pretrained(folder)
        (folder / "preprocessor_config.json").write_text(json.dumps(processor_config(SIDE), indent=2))
        return folder

    return build


def _seq2seq(family: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        _tests_on_path()
        from seq2seq_models import tiny_seq2seq

        return tiny_seq2seq(folder, family)  # the tests' sizes: d_model 64, 2 + 2 layers

    return build


def _decoder(family: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        _tests_on_path()
        import contextlib
        import io

        import torch
        import transformers

        with contextlib.redirect_stdout(io.StringIO()):  # tests/decoders.py imports `this`, which prints
            from decoders import BARE, config

        if family == "gemma2":  # tests/decoders.py's bare Gemma 2 settings, at this bench's width
            cls, extra = BARE[family]
            made = getattr(transformers, cls)(
                vocab_size=320, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=0, tie_word_embeddings=False, **extra,
            )  # fmt: skip
        else:
            made = config(family, 320, hidden=HIDDEN)
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(made).eval().save_pretrained(folder)  # no tokenizer files
        return folder

    return build


ARCHITECTURES: dict[str, Architecture] = {
    **{f: Architecture(f, "text-classification", _text_encoder(f)) for f in ("bert", "distilbert", "roberta")},
    **{f: Architecture(f, "image-classification", _vision(f)) for f in ("vit", "resnet", "convnext")},
    "whisper": Architecture("whisper", "automatic-speech-recognition", _seq2seq("whisper")),
    "t5": Architecture("t5", "text2text-generation", _seq2seq("t5")),
    **{f: Architecture(f, "text-generation", _decoder(f)) for f in ("llama", "phi3", "qwen2", "gemma2")},
}
