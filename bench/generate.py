"""Generation throughput of the example decoder: FP32 vs INT4, Kiln's I/O-bound decode loop vs a
naive loop, and ONNX Runtime GenAI's generator — all measured interleaved in one process.

    python bench/generate.py [--rounds N] [--prompts N] [--new-tokens N] [--threads N] [--steps N]

What it does:

1. trains the example model of ``workflows/llm-cpu.yaml`` with its factory
   (``workflows/models/tiny_llm.py``, ``--steps`` training steps) and exports it with Kiln's
   ``genai_build`` pass at FP32 and INT4 (RTN, block 32);
2. opens each model three ways on the CPU: the ``onnxruntime`` target with I/O binding (the key/value
   cache stays in bound OrtValues, past and present share one buffer), the same target with
   ``io_binding: false`` (the naive loop: the whole cache goes through numpy every token) and the
   ``onnxruntime-genai`` target;
3. generates ``--new-tokens`` tokens greedily from each of ``--prompts`` prompts of
   ``workflows/data/english/prompts.txt``, every variant once per prompt in a shuffled order
   (seeded), for ``--rounds`` rounds, so drift and neighbours hit every variant alike (a rotation
   would not: it keeps each variant's predecessor, and the one after GenAI's generator starts
   with colder caches — that alone made the bound loop's prefill read 0.80x the naive one's);
4. prints, per variant, the median prefill rate (prompt tokens per second of the first token's
   time) and decode rate (tokens per second after the first), and the paired ratios with their
   95% bootstrap intervals (clustered by round); and the weights' bytes of INT4 against FP32
   (goal: at most 1/3.5).

The variants' continuations are checked equal where they must be (the three loops of one model).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "workflows" / "models"))

PROMPTS = ROOT / "workflows" / "data" / "english" / "prompts.txt"
LOOPS = ("bound", "naive", "genai")


def export(hf: Path, precision: str, out: Path) -> Any:
    """The example model exported by Kiln's genai_build pass."""
    from engine.core import ModelArtifact, PassContext
    from passes.generate.genai_build import GenaiBuild

    step = GenaiBuild(GenaiBuild.Config(precision=precision))
    work = out / f"work-{precision}"
    ctx = PassContext(step_id=f"build-{precision}", workdir=work, output_dir=out / precision)
    work.mkdir(parents=True)
    (out / precision).mkdir()
    return step(ModelArtifact.from_folder("hf", hf), ctx).model


def weights_bytes(model: Any) -> int:
    """Bytes of the model file and its external data (tokenizer and config files excluded)."""
    return sum(f.stat().st_size for f in Path(model.path).iterdir() if f.name.startswith("model.onnx"))


def sessions(model: Any, threads: int) -> dict[str, Any]:
    from targets.genai import GenaiConfig, GenaiTarget
    from targets.onnxruntime.target import OnnxRuntimeConfig, OnnxRuntimeTarget

    def ort(io_binding: bool) -> Any:
        config = OnnxRuntimeConfig(id="cpu", runtime="onnxruntime", intra_op_threads=threads, io_binding=io_binding)
        return OnnxRuntimeTarget(config).open_session(model)

    genai = GenaiTarget(GenaiConfig(id="genai", runtime="onnxruntime-genai", intra_op_threads=threads))
    return {"bound": ort(True), "naive": ort(False), "genai": genai.open_session(model)}


def measure(opened: dict[str, Any], prompts: list[list[int]], new_tokens: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per variant: prefill and decode rates, one value per (round, prompt), in the same order."""
    names = list(opened)
    rates: dict[str, dict[str, list[float]]] = {name: {"prefill": [], "decode": []} for name in names}
    tokens: dict[str, list[list[int]]] = {name: [] for name in names}
    for name in names:  # warm-up: one generation each
        opened[name].generate(prompts[0], new_tokens)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        for prompt in prompts:
            order = list(names)
            shuffle(order)
            for name in order:
                generation = opened[name].generate(prompt, new_tokens)
                rates[name]["prefill"].append(len(prompt) / generation.prefill_s)
                rates[name]["decode"].append(generation.decode_tokens_per_s)
                tokens[name].append(generation.tokens)
    for precision in {name.split("/")[0] for name in names}:
        same = {str(tokens[f"{precision}/{loop}"]) for loop in LOOPS}
        if len(same) != 1:
            raise SystemExit(f"{precision}: the three loops continued the prompts differently")
    return rates


def ratio(numerator: list[float], denominator: list[float], per_round: int) -> str:
    from engine.core.stats import bootstrap

    values = [a / b for a, b in zip(numerator, denominator, strict=True)]
    groups = [i // per_round for i in range(len(values))]
    interval = bootstrap(values, "median", groups=groups)
    return f"{interval.estimate:.2f}x [{interval.low:.2f}, {interval.high:.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of every session")
    parser.add_argument("--steps", type=int, default=250, help="training steps of the example model (the workflow's default)")
    args = parser.parse_args()

    import tiny_llm

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, tokenizer = tiny_llm.build(steps=args.steps)
        model.save_pretrained(root / "hf")
        tokenizer.save_pretrained(root / "hf")
        models = {precision: export(root / "hf", precision, root) for precision in ("fp32", "int4")}
        prompts = [tokenizer(line)["input_ids"] for line in PROMPTS.read_text().splitlines()[: args.prompts]]
        opened = {f"{p}/{loop}": s for p, m in models.items() for loop, s in sessions(m, args.threads).items()}
        rates = measure(opened, prompts, args.new_tokens, args.rounds)
        fp32, int4 = (weights_bytes(models[p]) for p in ("fp32", "int4"))

    per_round = len(prompts)
    print(
        f"example decoder ({args.steps} training steps), {len(prompts)} prompts x {args.rounds} rounds, {args.new_tokens} new tokens, {args.threads} thread(s)"
    )
    print(f"{'variant':<12} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for name, r in rates.items():
        print(f"{name:<12} {statistics.median(r['prefill']):>14.0f} {statistics.median(r['decode']):>13.0f}")
    print("paired ratios (median, 95% interval):")
    for precision in ("fp32", "int4"):
        bound, naive, genai = (rates[f"{precision}/{loop}"] for loop in LOOPS)
        print(f"  {precision} prefill, bound loop / naive loop: {ratio(bound['prefill'], naive['prefill'], per_round)}")
        print(f"  {precision} decode, bound loop / naive loop: {ratio(bound['decode'], naive['decode'], per_round)}")
        print(f"  {precision} decode, bound loop / GenAI generator: {ratio(bound['decode'], genai['decode'], per_round)}")
    for kind in ("prefill", "decode"):
        print(f"  INT4 / FP32 {kind} (bound loop): {ratio(rates['int4/bound'][kind], rates['fp32/bound'][kind], per_round)}")
    print(f"weights: FP32 {fp32 / 1e6:.2f} MB, INT4 {int4 / 1e6:.2f} MB: 1/{fp32 / int4:.2f} (goal: at most 1/3.5)")


if __name__ == "__main__":
    main()
