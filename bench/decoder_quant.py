"""Weight quantization of the example decoder in PyTorch before the ONNX build: RTN vs GPTQ (and
QuaRot + RTN where the rotation exists, and RTN with lm_head at 8 bits), at 4 bits, one group size.

    python bench/decoder_quant.py [--group-size N] [--samples N] [--rounds N] [--steps N] [--threads N]

What it does:

1. trains the example model of ``workflows/llm-cpu.yaml`` with its factory
   (``workflows/models/tiny_llm.py``);
2. quantizes a copy per variant with ``passes.torch_quant._quantize.quantize_linear_layers``
   (GPTQ calibrated on ``--samples`` windows of 128 tokens of the training text,
   ``workflows/data/english/train.txt``) and writes its olive checkpoint;
3. held-out NLL: every token of the 45 held-out paragraphs (``heldout.txt``, up to 128 tokens
   each) scored by the fake-quantized PyTorch model (the int4 model's numbers at accuracy level
   1); the increase over FP32 is the paired mean over tokens with a 95% bootstrap interval
   clustered by paragraph (``engine.core.stats.bootstrap``);
4. builds FP32 and every checkpoint with ``genai_build`` (int4 from the checkpoint, the builder's
   CPU defaults otherwise, accuracy level 4) and measures decode tokens/s with ONNX Runtime
   GenAI's generator on 8 prompts x ``--rounds`` rounds, variants shuffled per prompt; the
   ratio to FP32 is the median of paired ratios with its clustered bootstrap interval;
5. prints the model's weight MB (model.onnx and its data), and each variant's mean KL divergence
   from the FP32 model's next-token distribution on the same tokens (what quantization changed,
   whichever way it moved the NLL);
6. spread: GPTQ calibrated on other disjoint sets of ``--samples`` windows, and QuaRot + RTN with
   other seeds, to show how far the NLL increase moves when only chance changes.

The goals: GPTQ's NLL increase at most half of RTN's; QuaRot + RTN below RTN; the mixed model
between all-4-bit and all-8-bit.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "workflows" / "models"))

DATA = ROOT / "workflows" / "data" / "english"


def token_scores(model: Any, rows: list[list[int]], reference: list[Any] | None = None) -> tuple[list[float], list[float], list[Any]]:
    """Per token (rows joined), the NLL of tokens 1..n-1 of each row under ``model`` (float64
    log-softmax) and, given the FP32 model's log-probabilities ``reference``, KL(FP32 || model);
    and the log-probabilities, by row."""
    import torch

    nll, kl, logps = [], [], []
    with torch.no_grad():
        for index, row in enumerate(rows):
            logp = torch.log_softmax(model(torch.tensor([row])).logits[0, :-1].double(), dim=-1)
            nll += (-logp[torch.arange(len(row) - 1), torch.tensor(row[1:])]).tolist()
            if reference is not None:
                kl += (reference[index].exp() * (reference[index] - logp)).sum(-1).tolist()
            logps.append(logp)
    return nll, kl, logps


def variants(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """RTN and GPTQ at 4 bits (the head float, Olive's default), GPTQ with act order, QuaRot
    before each; and, for mixed precision, every Linear and the head at 4 bits, at 8 bits, and
    at 4 bits but the head and each layer's down_proj at 8 (between the two, at a size between)."""
    common = {"bits": 4, "group_size": args.group_size, "sym": False}
    return {
        "rtn": {**common, "method": "rtn"},
        "gptq": {**common, "method": "gptq"},
        "gptq+act": {**common, "method": "gptq", "desc_act": True},
        "quarot+rtn": {**common, "method": "rtn", "rotate": True},
        "quarot+gptq": {**common, "method": "gptq", "rotate": True},
        "all4": {**common, "method": "rtn", "lm_head": True},
        "mixed": {**common, "method": "rtn", "lm_head": True, "overrides": {"lm_head": {"bits": 8}, "re:.*down_proj": {"bits": 8}}},
        "all8": {**common, "bits": 8, "method": "rtn", "lm_head": True},
    }


def quantize(model: Any, tok: Any, name: str, options: dict[str, Any], batches: Any, out: Path) -> Any:
    from passes.torch_quant._quantize import quantize_linear_layers, write_checkpoint

    copy_ = copy.deepcopy(model)
    options = dict(options)
    seed = options.pop("seed", 0)
    if options.pop("rotate", False):
        from passes.torch_quant._rotate import rotate_model

        rotate_model(copy_, seed=seed)
    method = options.pop("method")
    quantized = quantize_linear_layers(copy_, method, **options, calibration_batches=batches if method == "gptq" else None)
    write_checkpoint(
        copy_,
        tok,
        out / name,
        quantized,
        bits=options["bits"],
        group_size=options["group_size"],
        sym=False,
        lm_head=options.get("lm_head", False),
    )
    return copy_


def build(folder: Path, precision: str, out: Path) -> Any:
    from engine.core import ModelArtifact, PassContext
    from passes.generate.genai_build import GenaiBuild

    work = out / f"work-{out.name}"
    work.mkdir(parents=True)
    ctx = PassContext(step_id="build", workdir=work, output_dir=out / "onnx")
    return GenaiBuild(GenaiBuild.Config(precision=precision))(ModelArtifact.from_folder("hf", folder), ctx).model


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
    return rates


def spread(
    model: Any, tok: Any, heldout: list[list[int]], fp32: tuple[list[float], list[Any]], windows: list[Any], args: Any, out: Path
) -> None:
    """How much the held-out NLL increase moves when nothing but chance changes: GPTQ calibrated on
    each disjoint set of ``--samples`` windows of the training text (up to 4; the first is the
    table's) and QuaRot + RTN with seeds 0-3 (0 is the table's), each with its KL to FP32."""
    options = variants(args)
    runs = [
        (f"gptq, windows {k * args.samples}-{(k + 1) * args.samples - 1}", "gptq", 0, k)
        for k in range(min(4, len(windows) // args.samples))
    ]
    runs += [(f"quarot+rtn, seed {seed}", "quarot+rtn", seed, 0) for seed in range(4)]
    print("spread (nothing but the calibration windows or the rotation's seed changed): NLL increase, KL to FP32")
    for label, name, seed, k in runs:
        quantized = quantize(
            model, tok, f"{name}-{seed}-{k}", {**options[name], "seed": seed}, windows[k * args.samples : (k + 1) * args.samples], out
        )
        nll, kl, _ = token_scores(quantized, heldout, fp32[1])
        increase = statistics.fmean(nll) - statistics.fmean(fp32[0])
        print(f"  {label:<26} {increase:+.4f}  {statistics.fmean(kl):.4f}")


def main() -> None:  # long: a bench script reads best top to bottom
    import torch

    from engine.core.stats import bootstrap

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=64, help="GPTQ calibration windows of 128 tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=250, help="training steps of the example model (the workflow's default)")
    args = parser.parse_args()

    import tiny_llm

    torch.manual_seed(0)
    model, tok = tiny_llm.build(steps=args.steps)
    model = model.float().eval()
    heldout = [tok(line)["input_ids"][:128] for line in (DATA / "heldout.txt").read_text().splitlines() if line.strip()]
    heldout = [row for row in heldout if len(row) >= 2]
    stream = [t for line in (DATA / "train.txt").read_text().splitlines() if line.strip() for t in tok(line)["input_ids"]]
    windows = [torch.tensor([stream[i * 128 : (i + 1) * 128]]) for i in range(len(stream) // 128)]
    batches = windows[: args.samples]
    prompts = [tok(line)["input_ids"][:24] for line in (DATA / "prompts.txt").read_text().splitlines() if line.strip()][:8]
    flat_reference, _, reference = token_scores(model, heldout)
    groups = [i for i, row in enumerate(heldout) for _ in row[1:]]
    print(
        f"example model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters; held-out: {len(heldout)} paragraphs, "
        f"{len(flat_reference)} scored tokens; FP32 NLL {statistics.fmean(flat_reference):.4f}; GPTQ calibration: {len(batches)} x 128 tokens"
    )
    print(f"4 bits, group size {args.group_size}, asymmetric; NLL from the fake-quantized PyTorch model")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model.save_pretrained(root / "fp32-hf")
        tok.save_pretrained(root / "fp32-hf")
        increases, nlls, kls, built = {}, {}, {}, {"fp32": build(root / "fp32-hf", "fp32", root / "fp32")}
        for name, options in variants(args).items():
            quantized = quantize(model, tok, name, options, batches, root / "checkpoints")
            nll, kl, _ = token_scores(quantized, heldout, reference)
            nlls[name], kls[name] = nll, statistics.fmean(kl)
            increases[name] = bootstrap([a - b for a, b in zip(nll, flat_reference, strict=True)], groups=groups)
            built[name] = build(root / "checkpoints" / name, "int4", root / name)
        rates = decode_rates(built, prompts, args.rounds, args.threads, args.new_tokens)
        per_round = len(prompts)
        print(f"{'variant':<12} {'NLL increase [95% CI]':<30} {'KL':>7} {'decode tok/s':>12} {'vs FP32 [95% CI]':<24} {'MB':>6}")
        for name, model_ in built.items():
            mb = sum(f.stat().st_size for f in Path(model_.path).iterdir() if f.name.startswith("model.onnx")) / 1e6
            rate = statistics.median(rates[name])
            if name == "fp32":
                print(f"{name:<12} {'0 (reference)':<30} {0:>7.4f} {rate:>12.0f} {'1.00x':<24} {mb:>6.2f}")
                continue
            ratio = bootstrap(
                [a / b for a, b in zip(rates[name], rates["fp32"], strict=True)],
                "median",
                groups=[i // per_round for i in range(len(rates[name]))],
            )
            inc = increases[name]
            print(
                f"{name:<12} {f'{inc.estimate:+.4f} [{inc.low:+.4f}, {inc.high:+.4f}]':<30} {kls[name]:>7.4f} {rate:>12.0f} "
                f"{f'{ratio.estimate:.2f}x [{ratio.low:.2f}, {ratio.high:.2f}]':<24} {mb:>6.2f}"
            )
        print("paired against RTN (NLL per token, variant minus RTN, 95% CI clustered by paragraph):")
        for name in ("gptq", "gptq+act", "quarot+rtn", "quarot+gptq"):
            diff = bootstrap([a - b for a, b in zip(nlls[name], nlls["rtn"], strict=True)], groups=groups)
            share = increases[name].estimate / increases["rtn"].estimate if increases["rtn"].estimate > 0 else float("nan")
            kl_share = kls[name] / kls["rtn"]
            print(
                f"  {name:<12} {diff.estimate:+.4f} [{diff.low:+.4f}, {diff.high:+.4f}]   NLL increase / RTN's: {share:.2f}"
                f"   KL / RTN's: {kl_share:.2f}"
            )
        print("  goals: GPTQ's NLL increase at most half of RTN's; QuaRot + RTN below RTN")
        low, mid, high = (increases[n].estimate for n in ("all8", "mixed", "all4"))
        between = "between" if low <= mid <= high else "NOT between"
        print(f"mixed precision: all-8-bit {low:+.4f} <= mixed {mid:+.4f} <= all-4-bit {high:+.4f}: {between}")
        spread(model, tok, heldout, (flat_reference, reference), windows, args, root / "spread")


if __name__ == "__main__":
    main()
