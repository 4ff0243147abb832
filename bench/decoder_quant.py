"""Decoder weight quantization on the reference decoder, each method as the ONNX model Kiln ships.

    python bench/decoder_quant.py [--model reference|tiny] [--json FILE] [--seeds N] [--samples N]
                                  [--windows N] [--group-size N] [--mixed-ratio R] [--rounds N] [--threads N]

What it does:

1. builds (or finds in its cache) the reference decoder (``workflows/models/reference_decoder.py``;
   ``--model tiny`` is the tests' tiny recipe, for a smoke run) and builds its FP32 ONNX model
   with ``genai_build``;
2. quantizes it with each method at 4 bits, ``--group-size`` (default 128), asymmetric
   (``bench/_decoder_quant_methods.py``): RTN, GPTQ with and without act order, QuaRot + RTN,
   QuaRot + GPTQ, selective mixed precision (kld_gradient, the most sensitive units at 8 bits)
   + RTN, and RTN at a quarter of the group size (the uniform 4-bit model about as large as
   the mixed one) in
   PyTorch, built to MatMulNBits by ``genai_build``; k-quant and HQQ by ``int4_weights`` on the
   FP32 ONNX model. GPTQ calibrates on ``--samples`` windows of the train split; the methods that
   depend on chance (calibration windows, rotation) are built once per seed ``0..--seeds-1``;
3. held-out NLL: ``--windows`` windows of the held-out documents (never trained on), scored by
   ONNX Runtime GenAI (the built model with its key/value cache, the perplexity evaluator's
   ``token_nll``); a method's NLL increase is the paired mean over tokens against FP32 with a 95%
   bootstrap interval clustered by document (``engine.core.stats.bootstrap``), for seed 0; the
   chance spread is the range of the increase over the seeds;
4. decode tokens/s with ONNX Runtime GenAI's generator (8 prompts from held-out documents x
   ``--rounds``, variants shuffled per prompt) and the weight MB of model.onnx + its data.

Not measured, and why: 3 bits (``passes.torch_quant`` and ``int4_weights`` take 4 or 8 bits, and
ONNX Runtime's MatMulNBits CPU kernel runs 4 and 8); per-channel (one group per row: MatMulNBits
takes block sizes 16-256, these rows hold 512 and 1408 weights; the build refuses it).

Goals: GPTQ's NLL increase at most 0.5 of RTN's; QuaRot + RTN below RTN; selective mixed
precision below uniform 4 bits at the same size. ``--json FILE`` writes each method's figures
under the keys of ``_decoder_quant_methods.KEYS`` (``{"nll_increase", "interval", ...}``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "workflows" / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _decoder_quant_methods import KEYS, SEEDED, build_method, calibration_windows, genai_build, methods, weight_mb  # noqa: E402


def heldout_nll(artifact: Any, windows: list[list[int]], threads: int) -> list[float]:
    """Per token, the NLL of tokens 1..n-1 of each window under the built model (float64)."""
    from evaluators.perplexity import token_nll
    from targets.genai import GenaiConfig, GenaiTarget

    session = GenaiTarget(GenaiConfig(id="genai", runtime="onnxruntime-genai", intra_op_threads=threads)).open_session(artifact)
    try:
        return [float(x) for window in windows for x in token_nll(session.logits(window), window)]
    finally:
        session.close()


def decode_rates(models: dict[str, Any], prompts: list[list[int]], rounds: int, threads: int, new_tokens: int) -> dict[str, list[float]]:
    from targets.genai import GenaiConfig, GenaiTarget

    target = GenaiTarget(GenaiConfig(id="genai", runtime="onnxruntime-genai", intra_op_threads=threads))
    opened = {name: target.open_session(model) for name, model in models.items()}
    for session in opened.values():
        session.generate(prompts[0], new_tokens)
    rates: dict[str, list[float]] = {name: [] for name in opened}
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        for prompt in prompts:
            order = list(opened)
            shuffle(order)
            for name in order:
                rates[name].append(opened[name].generate(prompt, new_tokens).decode_tokens_per_s)
    for session in opened.values():
        session.close()
    return rates


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", choices=("reference", "tiny"), default="reference")
    parser.add_argument("--json", type=Path, help="write each method's figures here")
    parser.add_argument("--seeds", type=int, default=3, help="calibration / rotation seeds of the methods that depend on chance")
    parser.add_argument("--samples", type=int, default=128, help="GPTQ / kld_gradient calibration windows of the train split")
    parser.add_argument("--windows", type=int, default=160, help="held-out windows scored (at most)")
    parser.add_argument("--group-size", type=int, help="default: 128 (32 for --model tiny, whose rows are shorter)")
    parser.add_argument("--mixed-ratio", type=float, default=0.8, help="selective mixed precision: share of the weights kept at 4 bits")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args()


def main() -> None:  # long: a bench script reads best top to bottom
    import reference_decoder as rd
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from engine.core.stats import bootstrap

    args = parse()
    recipe = "full" if args.model == "reference" else "tiny"
    started = time.monotonic()
    folder = rd.build(recipe)
    spec = rd.RECIPES[recipe]
    model = LlamaForCausalLM.from_pretrained(folder).float().eval()
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    report = json.loads((folder / "report.json").read_text())
    heldout_docs, _ = rd.heldout_tokens(folder, recipe)
    windows, groups = rd.heldout_windows(heldout_docs, spec.sequence, args.windows)
    corpus = rd.build_corpus(spec.corpus)
    stream = torch.tensor([t for doc in rd.encode(tok, corpus.train) for t in doc], dtype=torch.int32)
    prompts = [doc[:24] for doc in heldout_docs if len(doc) >= 24][:8]
    token_groups = [g for window, g in zip(windows, groups, strict=True) for _ in window[1:]]
    if args.group_size is None:
        args.group_size = 128 if recipe == "full" else 32
    table = methods(args.group_size, args.mixed_ratio)
    torch.set_num_threads(args.threads)
    print(
        f"reference decoder ({recipe}): {report['parameters'] / 1e6:.2f} M parameters, {folder.name}; held-out {len(windows)} windows of "
        f"<= {spec.sequence} tokens from {len(set(groups))} documents, {len(token_groups)} scored tokens; "
        f"PyTorch held-out perplexity {report['perplexity']} vs unigram {report['unigram_perplexity']}"
    )
    print(
        f"4 bits, group {args.group_size}, asymmetric (the head too); {args.seeds} seed(s); GPTQ calibration {args.samples} x {spec.sequence} tokens"
    )

    with tempfile.TemporaryDirectory(prefix="decoder-quant-") as tmp:
        root = Path(tmp)
        fp32 = genai_build(folder, "fp32", root / "fp32")
        reference = heldout_nll(fp32, windows, args.threads)
        print(f"FP32 ONNX held-out NLL {statistics.fmean(reference):.4f} (perplexity {2.718281828 ** statistics.fmean(reference):.2f})")
        results: dict[str, dict[str, Any]] = {}
        built: dict[str, Any] = {"fp32": fp32}
        for name, method in table.items():
            seeds = range(args.seeds) if name in SEEDED else range(1)
            increases = []
            for seed in seeds:
                calibration = calibration_windows(stream, args.samples, spec.sequence, seed)
                artifact = build_method(model, tok, method, fp32, calibration, seed, root / f"{name}-{seed}")
                nll = heldout_nll(artifact, windows, args.threads)
                diff = [a - b for a, b in zip(nll, reference, strict=True)]
                increases.append(statistics.fmean(diff))
                if seed == 0:
                    interval = bootstrap(diff, groups=token_groups)
                    built[name] = artifact
                    results[name] = {
                        "label": method.label,
                        "nll_increase": round(interval.estimate, 5),
                        "interval": [round(interval.low, 5), round(interval.high, 5)],
                        "size_mb": round(weight_mb(artifact), 3),
                    }
                print(f"  {name:<26} seed {seed}: NLL increase {increases[-1]:+.4f}  ({time.monotonic() - started:.0f} s)", flush=True)
            results[name]["seed_increases"] = [round(x, 5) for x in increases]
            results[name]["chance_spread"] = [round(min(increases), 5), round(max(increases), 5)]
        rates = decode_rates(built, prompts, args.rounds, args.threads, args.new_tokens)
        fp32_mb = weight_mb(fp32)

    fp32_rate = statistics.median(rates["fp32"])
    print(f"{'method':<26} {'NLL increase [95% CI]':<30} {'seeds (min..max)':<20} {'MB':>7} {'decode tok/s':>12}")
    print(f"{'fp32':<26} {'0 (reference)':<30} {'':<20} {fp32_mb:>7.2f} {fp32_rate:>12.0f}")
    for name, entry in results.items():
        entry["decode_tokens_per_s"] = round(statistics.median(rates[name]), 1)
        entry["decode_vs_fp32"] = round(entry["decode_tokens_per_s"] / fp32_rate, 3)
        low, high = entry["interval"]
        spread = entry["chance_spread"]
        increase = entry["nll_increase"]
        print(
            f"{name:<26} {f'{increase:+.4f} [{low:+.4f}, {high:+.4f}]':<30} {f'{spread[0]:+.4f}..{spread[1]:+.4f}':<20} "
            f"{entry['size_mb']:>7.2f} {entry['decode_tokens_per_s']:>12.0f}"
        )
    rtn = results["rtn"]["nll_increase"]
    goals = {
        "gptq_over_rtn": round(results["gptq"]["nll_increase"] / rtn, 3) if rtn > 0 else None,
        "gptq_act_order_over_rtn": round(results["gptq_act_order"]["nll_increase"] / rtn, 3) if rtn > 0 else None,
        "quarot_rtn_below_rtn": results["quarot_rtn"]["nll_increase"] < rtn,
        "mixed_below_uniform_same_size": results["selective_mixed_precision"]["nll_increase"]
        < results["uniform4_small_groups"]["nll_increase"],
        "mixed_mb": results["selective_mixed_precision"]["size_mb"],
        "uniform4_small_groups_mb": results["uniform4_small_groups"]["size_mb"],
    }
    print("goals:", json.dumps(goals))
    print(markdown(results, fp32_mb, fp32_rate, args.seeds))
    if args.json:
        payload = {
            "model": {"recipe": recipe, "folder": folder.name, **{k: v for k, v in report.items() if k != "activations"}},
            "fp32": {
                "nll": round(statistics.fmean(reference), 5),
                "size_mb": round(fp32_mb, 3),
                "decode_tokens_per_s": round(fp32_rate, 1),
            },
            "setup": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "host": {"cpu_flags": _cpu_flags(), "threads": args.threads},
            "goals": goals,
            **{key: results[key] for key in KEYS},
            "uniform4_small_groups": results["uniform4_small_groups"],
        }
        tmp_json = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp_json.write_text(json.dumps(payload, indent=1) + "\n")
        os.replace(tmp_json, args.json)
        print(f"wrote {args.json}")


def markdown(results: dict[str, dict[str, Any]], fp32_mb: float, fp32_rate: float, seeds: int) -> str:
    """The docs' table (docs/benchmarks.md): one row per method."""
    lines = [
        f"| method | NLL increase over FP32 [95% CI] | chance spread ({seeds} seeds) | MB | decode tok/s |",
        "|---|---|---|---|---|",
        f"| FP32 | 0 (reference) | | {fp32_mb:.2f} | {fp32_rate:.0f} |",
    ]
    for name, entry in results.items():
        low, high = entry["interval"]
        spread = entry["chance_spread"]
        chance = f"{spread[0]:+.4f} .. {spread[1]:+.4f}" if name in SEEDED else "(no seed)"
        lines.append(
            f"| {entry['label']} | {entry['nll_increase']:+.4f} [{low:+.4f}, {high:+.4f}] | {chance} | {entry['size_mb']:.2f} "
            f"| {entry['decode_tokens_per_s']:.0f} |"
        )
    return "\n".join(lines)


def _cpu_flags() -> list[str]:
    """The ISA flags that decide the kernels (AVX2, AVX-512, VNNI, BF16, AMX), from /proc/cpuinfo."""
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return []
    return [flag for flag in wanted if flag in flags]


if __name__ == "__main__":
    main()
