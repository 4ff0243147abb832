"""Do the session settings Kiln chooses beat the defaults? Per target available on this host.

    python bench/runtime.py [--store DIR] [--out DIR] [--rounds N] [--gpu]

CPU part (always): runs ``workflows/minilm-runtime-cpu.yaml`` — all-MiniLM-L6-v2 as exported, with
each target's session settings searched (ONNX Runtime: intra-op threads, spinning, I/O binding;
OpenVINO: performance hint, threads) — then measures the chosen settings against the target's
defaults again, in a fresh interleaved comparison that took no part in choosing them (so the
figure is not the winner of a search, which would flatter it): the latency evaluator with the
exported model on the target with the chosen settings, and the same model on the target as
written as its reference. The goal on CPUs: the tuned settings are at least as fast as the
defaults, i.e. the upper end of the speedup's interval is at least 1.

GPU part (``--gpu``, where onnxruntime offers CUDAExecutionProvider and torch sees a GPU):
PyTorch eager FP32 and ONNX Runtime CUDA FP32 as exported (p50 of 200 runs, batch 1, sequence
128, inputs on the device), then ``workflows/bert-gpu.yaml``; the chosen candidate of ``ort-cuda``
must be at least 5x faster than the export and 10x faster than PyTorch eager, with fidelity >= 0.99.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._engine import engine_run  # noqa: E402

WORKFLOW = ROOT / "workflows" / "minilm-runtime-cpu.yaml"
GPU_WORKFLOW = ROOT / "workflows" / "bert-gpu.yaml"


def _records(out: Path) -> dict[str, Any]:
    """The run's candidates.json: ``candidates`` and the ``notes`` (pruned settings among them)."""
    return dict(json.loads((out / "candidates.json").read_text()))


def confirm(store: Path, target_id: str, settings: dict[str, Any], digest: str, rounds: int) -> dict[str, Any]:
    """A fresh interleaved comparison of the model on the target with ``settings`` against the
    same model on the target as written: the speedup with its interval."""
    from engine.core.artifact import ModelArtifact
    from engine.core.evaluator import EvalContext
    from engine.store.store import Store
    from engine.workflow import load_workflow
    from evaluators.latency import Latency

    resolved = load_workflow(WORKFLOW)
    entry = resolved.targets[target_id]
    model = ModelArtifact(format="onnx", path=Store(store).object_path(digest), digest=digest)
    config = Latency.Config(
        batch_size=1,
        sequence_length=128,
        warmup=10,
        runs=rounds * 10,
        sessions=4,
        min_rounds=rounds,
        max_rounds=rounds * 4,
        precision=0.02,
        max_time_s=120,
    )
    with tempfile.TemporaryDirectory() as work:
        ctx = EvalContext(target=entry.variant(settings), reference_target=entry.instance, workdir=Path(work), reference=model)
        result = Latency(config).evaluate(model, ctx)
    values = result.values
    return {
        "speedup": values["speedup"],
        "low": values["speedup_low"],
        "high": values["speedup_high"],
        "default_p50_ms": values["reference_p50_ms"],
        "tuned_p50_ms": values["p50_ms"],
        "rounds": int(values["rounds"]),
        "loaded": result.details["noise"]["loaded"],
    }


def cpu_part(store: Path, out: Path, rounds: int) -> bool:
    wall, _ = engine_run(WORKFLOW, store, out)
    print(f"engine run {WORKFLOW.relative_to(ROOT)}: {wall:.0f} s wall")
    records = _records(out)
    candidates, notes = records["candidates"], records["notes"]
    ok = True
    rows = []
    for target in dict.fromkeys(c["target"] for c in candidates):
        mine = [c for c in candidates if c["target"] == target]
        chosen = next((c for c in mine if c["chosen"]), None)
        if chosen is None:
            print(f"{target}: nothing chosen ({[c['reason'] for c in mine if c['reason']]})")
            ok = False
            continue
        pruned = sum(1 for note in notes if note.startswith(f"{target}: settings"))
        measured = sum(1 for c in mine if c["state"] == "complete")
        settings = chosen.get("settings") or {}
        if not settings:
            rows.append((target, "defaults kept", measured, pruned, None))
            continue
        check = confirm(store, target, settings, chosen["model_digest"], rounds)
        rows.append((target, ", ".join(f"{k}={v}" for k, v in settings.items()), measured, pruned, check))
        ok &= check["high"] >= 1.0
    print()
    print(f"{'target':<14} {'chosen settings':<52} {'measured':>8} {'pruned':>6}  default p50  tuned p50  speedup [interval]")
    for target, shown, measured, pruned, check in rows:
        if check is None:
            print(f"{target:<14} {shown:<52} {measured:>8} {pruned:>6}  (the defaults won: ratio 1 by definition)")
            continue
        flag = " (measured under load)" if check["loaded"] else ""
        print(
            f"{target:<14} {shown:<52} {measured:>8} {pruned:>6}  {check['default_p50_ms']:>8.2f} ms {check['tuned_p50_ms']:>7.2f} ms"
            f"  {check['speedup']:.3f} [{check['low']:.3f}, {check['high']:.3f}] over {check['rounds']} rounds{flag}"
        )
    print()
    print("every setting measured, on the exported model (speedup over the target's own settings, 95% interval):")
    for target in dict.fromkeys(c["target"] for c in candidates):
        for c in sorted((c for c in candidates if c["target"] == target), key=lambda c: -c["metrics"].get("latency.speedup", 0)):
            interval = c["intervals"].get("latency.speedup")
            shown = f"[{interval['low']:.3f}, {interval['high']:.3f}]" if interval else ""
            settings = ", ".join(f"{k}={v}" for k, v in (c.get("settings") or {}).items()) or "the target as written"
            pruned = " (pruned)" if any(note.startswith(f"{target}: settings") and f"({c['id']})" in note for note in notes) else ""
            mark = " <- chosen" if c["chosen"] else ""
            print(
                f"  {target:<14} {settings:<58} p50 {c['metrics'].get('latency.p50_ms', float('nan')):6.2f} ms  "
                f"{c['metrics'].get('latency.speedup', float('nan')):.3f} {shown}{pruned}{mark}"
            )
    print()
    print("goal (CPU): tuned settings at least as fast as the defaults (interval's upper end >= 1):", "met" if ok else "NOT met")
    return ok


def _p50_ms(run: Any, sync: Any, runs: int = 200, warmup: int = 20) -> float:
    for _ in range(warmup):
        run()
    sync()
    times = []
    for _ in range(runs):
        sync()
        started = time.perf_counter_ns()
        run()
        sync()
        times.append((time.perf_counter_ns() - started) / 1e6)
    return statistics.median(times)


def gpu_part(store: Path, out: Path) -> bool:
    import onnxruntime as ort
    import torch

    if "CUDAExecutionProvider" not in ort.get_available_providers() or not torch.cuda.is_available():
        print("GPU part skipped: no CUDAExecutionProvider or no CUDA device here")
        return True
    wall, _ = engine_run(GPU_WORKFLOW, store, out)
    print(f"engine run {GPU_WORKFLOW.relative_to(ROOT)}: {wall:.0f} s wall")
    candidates = [c for c in _records(out)["candidates"] if c["target"] == "ort-cuda"]
    chosen = next(c for c in candidates if c["chosen"])
    reference = next(c for c in candidates if c["reference"])
    from engine.store.store import Store
    from engine.workflow import load_workflow

    folder = load_workflow(GPU_WORKFLOW).input.path
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval().cuda()
    ids = torch.randint(0, 1000, (1, 128), device="cuda")
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        eager = _p50_ms(lambda: model(input_ids=ids, attention_mask=mask), torch.cuda.synchronize)
    export = Store(store).object_path(reference["model_digest"]) / "model.onnx"
    session = ort.InferenceSession(str(export), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    binding = session.io_binding()
    for name, array in (("input_ids", ids), ("attention_mask", mask)):
        if name in {i.name for i in session.get_inputs()}:
            value = ort.OrtValue.ortvalue_from_numpy(array.cpu().numpy(), "cuda", 0)
            binding.bind_ortvalue_input(name, value)
    for output in session.get_outputs():
        binding.bind_output(output.name, "cuda")
    exported = _p50_ms(lambda: session.run_with_iobinding(binding), binding.synchronize_outputs)
    tuned = chosen["metrics"]["latency.p50_ms"]
    fidelity = chosen["metrics"].get("fidelity.cosine_mean", float("nan"))
    print(f"PyTorch eager FP32            {eager:7.3f} ms")
    print(f"ORT CUDA FP32, as exported    {exported:7.3f} ms")
    print(f"Kiln's choice ({chosen['path']}): {tuned:7.3f} ms, fidelity {fidelity:.4f}")
    print(f"  {exported / tuned:.1f}x the export (goal >= 5), {eager / tuned:.1f}x PyTorch eager (goal >= 10)")
    return exported / tuned >= 5 and eager / tuned >= 10 and fidelity >= 0.99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, default=None, help="artifact store (default: a fresh temporary one)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary one)")
    parser.add_argument("--rounds", type=int, default=12, help="least rounds of the confirming comparison")
    parser.add_argument("--gpu", action="store_true", help="also run the GPU part (needs onnxruntime-gpu and a CUDA device)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        store = args.store or Path(scratch) / "store"
        out = args.out or Path(scratch) / "out"
        ok = cpu_part(store, out, args.rounds)
        if args.gpu:
            ok &= gpu_part(store, out.with_name(out.name + "-gpu"))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
