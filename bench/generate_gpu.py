"""Decode throughput and time to first token of a Llama-geometry decoder with random weights: Kiln's
bound decode loop vs a naive loop (the whole cache through the host every token) vs ONNX Runtime
GenAI's generator, at FP16 and INT4 on a GPU (FP32 and INT4 on a CPU), measured interleaved.

    python bench/generate_gpu.py --device cuda                 # the GPU table: a 0.54 B model
    python bench/generate_gpu.py --device cpu --size tiny      # a smoke run on a CPU

What it does:

1. writes a random-weight Llama (``--size 0.5b``: hidden 1024, intermediate 5632, 24 layers, 16
   heads, 4 key/value heads, vocabulary 32000: 0.54 B parameters; ``tiny``: hidden 128, 2
   layers) as a Hugging Face folder without tokenizer files (nothing is downloaded);
2. builds it with Kiln's ``genai_build`` pass for the device's execution provider (``cuda``: fp16,
   the GPU reference, and int4; ``cpu``: fp32 and int4);
3. opens each model three ways: the ``onnxruntime`` target with I/O binding (the cache stays on
   the device), the same with ``io_binding: false`` (naive) and the ``onnxruntime-genai`` target
   (on a GPU it needs onnxruntime-genai-cuda; where the installed package cannot open the device,
   the generator is left out and the script says why);
4. generates ``--new-tokens`` greedy tokens from ``--prompts`` random prompts of
   ``--prompt-tokens`` tokens, the variants in a shuffled order per prompt, for ``--rounds``
   rounds (``bench/generate.py``'s ``measure``), and prints per variant the median time to first
   token and decode rate, and the paired ratios with their 95% bootstrap intervals (goals on a
   GPU: Kiln's loop >= 1.5x the naive loop, >= 1.0x GenAI's generator).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import generate as cpu_bench  # noqa: E402 - bench/generate.py: measure, ratio

SIZES = {
    "0.5b": {"hidden_size": 1024, "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 4},
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2},
}
VOCAB = 32000


def random_llama(folder: Path, size: str) -> int:
    """A random-weight Llama of ``size`` saved into ``folder``; its parameter count."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, **SIZES[size]
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def build(hf: Path, precision: str, provider: str, out: Path) -> Any:
    from engine.core import ModelArtifact, PassContext
    from passes.generate.genai_build import GenaiBuild

    config = {"precision": precision, "execution_provider": provider, **({"block_size": 32} if precision == "int4" else {})}
    work = out / f"work-{precision}"
    work.mkdir(parents=True)
    ctx = PassContext(step_id=f"build-{precision}", workdir=work, output_dir=out / precision)
    return GenaiBuild(GenaiBuild.Config(**config))(ModelArtifact.from_folder("hf", hf), ctx).model


def sessions(model: Any, device: str) -> dict[str, Any]:
    from engine.core.errors import KilnError
    from targets.genai import GenaiConfig, GenaiTarget
    from targets.onnxruntime.target import OnnxRuntimeConfig, OnnxRuntimeTarget

    def ort(io_binding: bool) -> Any:
        return OnnxRuntimeTarget(OnnxRuntimeConfig(id="ort", runtime="onnxruntime", device=device, io_binding=io_binding)).open_session(
            model
        )

    opened = {"bound": ort(True), "naive": ort(False)}
    try:
        opened["genai"] = GenaiTarget(GenaiConfig(id="genai", runtime="onnxruntime-genai", device=device)).open_session(model)
    except KilnError as error:
        print(f"GenAI's generator left out on {device}: {error}")
    return opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", choices=tuple(SIZES), default="0.5b")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    precisions = ("fp16", "int4") if args.device == "cuda" else ("fp32", "int4")
    rng = random.Random(0)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)]

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        parameters = random_llama(root / "hf", args.size)
        models = {p: build(root / "hf", p, args.device, root) for p in precisions}
        opened = {f"{p}/{loop}": s for p, m in models.items() for loop, s in sessions(m, args.device).items()}
        loops = sorted({name.split("/")[1] for name in opened}, key=("bound", "naive", "genai").index)
        cpu_bench.LOOPS = tuple(loops)  # the continuations checked equal across the loops measured
        rates = cpu_bench.measure(opened, prompts, args.new_tokens, args.rounds)

    per_round = len(prompts)
    print(
        f"random Llama {args.size} ({parameters / 1e9:.2f} B parameters) on {args.device}, {len(prompts)} prompts of "
        f"{args.prompt_tokens} tokens x {args.rounds} rounds, {args.new_tokens} new tokens"
    )
    print(f"{'variant':<12} {'first token ms':>15} {'decode tok/s':>13}")
    for name, r in rates.items():
        first_ms = statistics.median(args.prompt_tokens / rate * 1e3 for rate in r["prefill"])
        print(f"{name:<12} {first_ms:>15.2f} {statistics.median(r['decode']):>13.1f}")
    print("paired ratios (median, 95% interval):")
    for precision in precisions:
        bound = rates[f"{precision}/bound"]
        for other in loops[1:]:
            theirs = rates[f"{precision}/{other}"]
            print(
                f"  {args.device} · Kiln loop vs {other} · {precision} · decode {cpu_bench.ratio(bound['decode'], theirs['decode'], per_round)}"
            )
            print(
                f"  {args.device} · Kiln loop vs {other} · {precision} · first token "
                f"{cpu_bench.ratio(bound['prefill'], theirs['prefill'], per_round)} (rate: higher is faster)"
            )


if __name__ == "__main__":
    main()
