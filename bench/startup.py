"""How long does a session take to start? The same model plain, offline-serialized and EP-compiled.

    python bench/startup.py [--reps N] [--warm N] [--layers N] [--openvino-env DIR] [--no-openvino]

The model is a BERT encoder from a transformers config with random weights (hidden 384, 12 heads,
``--layers`` layers, all-MiniLM-L6-v2's shape by default), exported to ONNX once. Its variants are
made with Kiln's passes:

- plain: the exported model, opened as a target opens it (graph optimization level all);
- ort_serialize basic: the portable offline-optimized model, opened at level all (the extended and
  layout optimizers still run);
- ort_serialize all: the fully optimized model for this host, opened with optimizations off;
- ort_serialize all, ORT format (model.ort), opened with optimizations off;
- with the OpenVINO EP (onnxruntime-openvino, in its own virtual environment, built with uv unless
  ``--openvino-env`` names one): plain, ort_compile's EPContext model, and OpenVINO's own model
  cache (``cache_dir``, filled by an untimed first opening) for comparison.

Each repetition opens every variant in a fresh process: ``cold`` is the first session creation
there (onnxruntime already imported), ``warm`` the median of ``--warm`` re-creations in the same
process. Variants are interleaved (the order rotates each repetition) so drift hits all alike; the
table gives medians over repetitions and the ratio to the plain model of the same runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: what one measurement runs, in the runtime's own process: argv[1] is a JSON job
_MEASURE = r"""
import json, sys, time
job = json.loads(sys.argv[1])
import onnxruntime as ort

def options():
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, job["level"])
    return so

def open_once():
    started = time.perf_counter_ns()
    ort.InferenceSession(job["model"], options(), providers=job["providers"], provider_options=job["options"])
    return (time.perf_counter_ns() - started) / 1e6

try:
    if job.get("prime"):
        open_once()  # fills a runtime cache (OpenVINO's cache_dir): the timed openings find it
    cold = open_once()
    warm = [open_once() for _ in range(job["warm"])]
    print(json.dumps({"cold_ms": cold, "warm_ms": warm}))
except Exception as error:
    print(json.dumps({"error": f"{type(error).__name__}: {error}"[:300]}))
"""


def export_bert(folder: Path, layers: int) -> Path:
    import warnings

    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=384, num_attention_heads=12, intermediate_size=1536, num_hidden_layers=layers, vocab_size=30522)
    config._attn_implementation = "eager"  # the attention the TorchScript exporter traces
    bert = BertModel(config, add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    model = Encoder().eval()
    warnings.filterwarnings("ignore")  # the exporter's tracing warnings: the export is checked by running it
    ids = torch.ones((1, 16), dtype=torch.int64)
    path = folder / "plain" / "model.onnx"
    path.parent.mkdir(parents=True)
    torch.onnx.export(
        model,
        (ids, torch.ones_like(ids)),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}},
        opset_version=17,
        dynamo=False,
    )
    import onnx

    proto = onnx.load(str(path))
    proto.ir_version = min(proto.ir_version, 8)
    onnx.save(proto, str(path))
    return path


def serialize(plain: Path, folder: Path, level: str, ort_format: bool = False) -> Path:
    from engine.core import ModelArtifact, PassContext
    from passes.compile.ort_serialize import ORT_FILE, OrtSerialize
    from targets.onnxruntime import OnnxRuntimeTarget

    target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="cpu", runtime="onnxruntime"))
    out = folder / f"serialize-{level}"
    (folder / "work").mkdir(parents=True, exist_ok=True)
    ctx = PassContext(step_id="serialize", workdir=folder / "work", output_dir=out, target=target)
    result = OrtSerialize(OrtSerialize.Config(level=level, ort_format=ort_format))(ModelArtifact.from_folder("onnx", plain.parent), ctx)
    return result.model.path / ORT_FILE if ort_format else result.model.model_file


def openvino_env(given: Path | None, cache: Path) -> Path:
    """The Python of an environment with onnxruntime-openvino and Kiln importable: the one named,
    else Kiln's own isolated environment for that requirement (built once, as `engine run` does)."""
    if given is not None:
        return given / "bin" / "python"
    from engine.core.config import EnvironmentSpec
    from engine.execute.environments import ensure

    return Path(ensure(EnvironmentSpec(requirements=["onnxruntime-openvino==1.24.1"]), cache).python)


_COMPILE = r"""
import sys
from pathlib import Path
from engine.core import ModelArtifact, PassContext
from passes.compile.ort_compile import OrtCompile
from targets.onnxruntime import OnnxRuntimeTarget
plain, out = Path(sys.argv[1]), Path(sys.argv[2])
target = OnnxRuntimeTarget(OnnxRuntimeTarget.Config(id="ov", runtime="onnxruntime", providers=["OpenVINOExecutionProvider", "CPUExecutionProvider"], provider_options=[{"device_type": "CPU"}, {}]))
(out.parent / "work-compile").mkdir(exist_ok=True)
ctx = PassContext(step_id="compile", workdir=out.parent / "work-compile", output_dir=out, target=target)
result = OrtCompile(OrtCompile.Config(embed=False))(ModelArtifact.from_folder("onnx", plain.parent), ctx)
print(result.model.model_file)
"""


def measure(python: Path, variant: dict[str, Any], warm: int) -> dict[str, Any]:
    job = {key: variant[key] for key in ("model", "providers", "options", "level")} | {"warm": warm, "prime": variant.get("prime", False)}
    env = {**os.environ, "PYTHONPATH": ""} if python != Path(sys.executable) else dict(os.environ)
    done = subprocess.run([str(python), "-c", _MEASURE, json.dumps(job)], capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": (done.stderr or "no output")[-300:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="repetitions (each opens every variant in a fresh process)")
    parser.add_argument("--warm", type=int, default=5, help="re-creations per process for the warm figure")
    parser.add_argument("--layers", type=int, default=6, help="BERT layers (6: all-MiniLM-L6-v2's depth)")
    parser.add_argument("--openvino-env", type=Path, default=None, help="an existing environment with onnxruntime-openvino")
    parser.add_argument("--no-openvino", action="store_true", help="leave out the OpenVINO EP variants")
    args = parser.parse_args()
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    print("$ python " + " ".join(shlex.quote(str(a)) for a in [shown, *sys.argv[1:]]))

    folder = Path(tempfile.mkdtemp(prefix="kiln-startup-"))
    plain = export_bert(folder, args.layers)
    cpu = {"providers": ["CPUExecutionProvider"], "options": [{}], "python": Path(sys.executable), "runtime": "cpu"}
    variants: list[dict[str, Any]] = [
        {"name": "plain (level all)", "model": str(plain), "level": "ORT_ENABLE_ALL", **cpu},
        {"name": "ort_serialize basic (opened at all)", "model": str(serialize(plain, folder, "basic")), "level": "ORT_ENABLE_ALL", **cpu},
        {"name": "ort_serialize all (opened at disable)", "model": str(serialize(plain, folder, "all")), "level": "ORT_DISABLE_ALL", **cpu},
        {
            "name": "ort_serialize all, ORT format (disable)",
            "model": str(serialize(plain, folder / "ort", "all", ort_format=True)),
            "level": "ORT_DISABLE_ALL",
            **cpu,
        },
    ]
    if not args.no_openvino:
        python = openvino_env(args.openvino_env, Path.home() / ".cache" / "kiln-bench")
        ov = {
            "providers": ["OpenVINOExecutionProvider", "CPUExecutionProvider"],
            "python": python,
            "runtime": "openvino-ep",
            "level": "ORT_ENABLE_ALL",
        }
        env = {**os.environ, "PYTHONPATH": ""}
        compiled = subprocess.run(
            [str(python), "-c", _COMPILE, str(plain), str(folder / "compiled")], capture_output=True, text=True, env=env
        )
        variants.append({"name": "OpenVINO EP plain", "model": str(plain), "options": [{"device_type": "CPU"}, {}], **ov})
        if compiled.returncode == 0:
            variants.append(
                {
                    "name": "OpenVINO EP ort_compile (EPContext)",
                    "model": compiled.stdout.strip().splitlines()[-1],
                    "options": [{"device_type": "CPU"}, {}],
                    **ov,
                }
            )
        else:
            print("ort_compile failed:", compiled.stderr[-500:])
        cache_dir = folder / "ov-cache"
        variants.append(
            {
                "name": "OpenVINO EP cache_dir (primed)",
                "model": str(plain),
                "options": [{"device_type": "CPU", "cache_dir": str(cache_dir)}, {}],
                "prime": True,
                **ov,
            }
        )

    results: dict[str, list[dict[str, Any]]] = {v["name"]: [] for v in variants}
    for rep in range(args.reps):
        order = variants[rep % len(variants) :] + variants[: rep % len(variants)]
        for variant in order:
            results[variant["name"]].append(measure(variant["python"], variant, args.warm))
        print(f"repetition {rep + 1}/{args.reps} done", flush=True)

    baseline: dict[str, tuple[float, float]] = {}
    print(
        f"\nBERT {args.layers} layers, hidden 384 (random weights); {args.reps} repetitions, {args.warm} warm re-creations each; 1 intra-op thread"
    )
    print(f"{'variant':42} {'cold ms':>9} {'warm ms':>9} {'cold x':>7} {'warm x':>7}")
    for variant in variants:
        rows = results[variant["name"]]
        errors = [row["error"] for row in rows if "error" in row]
        if errors:
            print(f"{variant['name']:42} fails: {errors[0]}")
            continue
        cold = statistics.median(row["cold_ms"] for row in rows)
        warm = statistics.median(statistics.median(row["warm_ms"]) for row in rows)
        base = baseline.setdefault(variant["runtime"], (cold, warm))
        print(f"{variant['name']:42} {cold:9.1f} {warm:9.1f} {base[0] / cold:6.2f}x {base[1] / warm:6.2f}x")
    print("(x: the plain model's time on the same runtime over this one's: above 1 starts faster)")


if __name__ == "__main__":
    main()
