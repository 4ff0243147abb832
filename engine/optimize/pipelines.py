"""The workflow `engine optimize` writes: the target for the device and provider, the steps for the
kind of model and the precision, and the measurements that choose (fidelity against the FP32
model on held-out data, latency as a speedup over it; perplexity and tokens per second for
decoders).

The ladders follow the example workflows: on an ONNX Runtime CPU target an encoder gets
attention fusion and dynamic INT8 (per-tensor, per-channel) beside accuracy-driven INT8, which
keeps the MatMuls whose quantization hurts most in float (workflows/bert-cpu.yaml); OpenVINO gets
its IR with NNCF INT8, with and without accuracy control (bert-openvino.json); a CUDA target GPU
fusion, FP16 or static QDQ INT8; TensorRT the unfused export compiled into an EPContext model
(bert-gpu.yaml); a decoder the GenAI model builder's own weight-only quantization beside Kiln's
int4_weights (llm-cpu.yaml). A vision model is exported for its task (pixel_values, batch dynamic)
and on ONNX Runtime's CPU gets static QDQ INT8 calibrated on synthetic images beside dynamic INT8,
as an ONNX model without token inputs does. An encoder-decoder (Whisper, T5, BART) is exported as
an encoder and a decoder with past, and on ONNX Runtime's CPU gets dynamic INT8 of both parts,
measured by its greedy loop (first-step top-1 against FP32, tokens per second)."""

from __future__ import annotations

from typing import Any

from engine.optimize import generative
from engine.optimize.model import ModelFacts
from engine.optimize.parts import CALIBRATION_LINES, LONG_TEXT, PARAGRAPHS, SENTENCES, Choice, Pipeline

__all__ = ["Choice", "Pipeline", "data", "evaluate", "select", "steps", "target", "workflow"]

EXPORT = {"exporter": "torchscript", "attn_implementation": "eager", "opset": 17}  # the export ONNX Runtime fuses


def target(facts: ModelFacts, choice: Choice) -> dict[str, Any]:
    provider, device = choice.provider, choice.device
    if facts.kind == "decoder":
        return {"id": f"genai-{provider}", "runtime": "onnxruntime-genai", "device": provider}
    if provider == "openvino":
        return {"id": f"ov-{device}", "runtime": "openvino", "device": device.upper()}
    targets: dict[str, dict[str, Any]] = {
        "cpu": {"id": "ort-cpu", "runtime": "onnxruntime", "device": "cpu"},
        "cuda": {"id": "ort-cuda", "runtime": "onnxruntime", "device": "cuda"},
        "tensorrt": {
            "id": "ort-trt",
            "runtime": "onnxruntime",
            "device": "cuda",
            "providers": ["TensorrtExecutionProvider", "CUDAExecutionProvider"],
            "tensorrt": {"engine_cache": True, "timing_cache": True},
        },
        "dml": {"id": "ort-dml", "runtime": "onnxruntime", "device": "gpu", "providers": ["DmlExecutionProvider"]},
        "qnn": {"id": "ort-qnn", "runtime": "onnxruntime", "device": "npu", "providers": ["QNNExecutionProvider"]},
    }
    return targets[provider]


def steps(facts: ModelFacts, choice: Choice) -> Pipeline:
    if facts.kind in generative.KINDS:
        return generative.steps(facts, choice)
    pipeline = Pipeline()
    source = None
    if facts.kind == "encoder":
        source = pipeline.add(
            "the FP32 ONNX model (TorchScript exporter, eager attention, dynamic batch and sequence; checked against PyTorch)",
            "export",
            "torch_export",
            None,
            config={**EXPORT, "task": facts.task},
        )
    elif facts.kind == "vision":
        source = pipeline.add(
            f"the FP32 ONNX model for {facts.task} (TorchScript exporter, pixel_values of the image processor's size, dynamic batch; "
            "checked against PyTorch)",
            "export",
            "torch_export",
            None,
            config={**EXPORT, "task": facts.task},
        )
    if choice.provider == "openvino":
        _openvino(pipeline, facts, choice, source)
    elif choice.provider == "tensorrt":
        _tensorrt(pipeline, choice, source)
    elif choice.provider == "qnn":
        _qnn(pipeline, choice, source)
    else:
        _onnxruntime(pipeline, facts, choice, source)
    return pipeline


def _onnxruntime(pipeline: Pipeline, facts: ModelFacts, choice: Choice, source: str | None) -> None:
    """ONNX Runtime on the CPU, CUDA or DirectML: transformer fusion (text models), then the precision."""
    precision, gpu = choice.precision, choice.device == "gpu"
    after = source
    if facts.text:
        after = pipeline.add(
            "attention, LayerNorm and Gelu fused into ONNX Runtime's contrib ops"
            + (" (for the GPU: from the target)" if gpu else "")
            + ("" if precision == "fp32" else "; optional: the unfused model is a candidate too"),
            "fuse",
            "ort_fusion",
            source,
            config={"model_type": "bert"},
            optional=precision != "fp32",
        )
    elif precision == "fp32":
        pipeline.add("the graph cleaned up by onnxslim (constant folding, dead nodes, fusions)", "simplify", "onnx_simplify", source)
    if precision == "int8":
        _ort_int8(pipeline, choice, after, dynamic=facts.text and not gpu)
    elif precision == "fp16":
        why = "FP16 weights and compute" + (
            "" if gpu else " (on ONNX Runtime's CPU provider it gains nothing: measured to show what it costs)"
        )
        pipeline.add(why, "fp16", "fp16", after)
    elif precision == "int4":
        pipeline.add(
            "4-bit block-wise weights (MatMulNBits, round to nearest), activations in float",
            "int4",
            "int4_weights",
            after,
            search={"block_size": [32, 128]},
        )


def _ort_int8(pipeline: Pipeline, choice: Choice, after: str | None, dynamic: bool) -> None:
    """INT8 on ONNX Runtime: for a text model on the CPU, dynamic INT8 beside accuracy-driven INT8 (bert-cpu.yaml);
    otherwise static QDQ calibrated on held-apart data (on a GPU, bert-gpu.yaml's symmetric per-channel QDQ)."""
    gpu = choice.device == "gpu"
    if dynamic:
        pipeline.add(
            "dynamic INT8: activations quantized at run time, weights per tensor or per output channel",
            "int8",
            "ort_quantize",
            after,
            config={"mode": "dynamic"},
            search={"per_channel": [False, True]},
        )
        pipeline.add(
            f"accuracy-driven dynamic INT8: the MatMuls whose quantization hurts most stay in float until the cosine to FP32 "
            f"on the calibration lines is at least {_bar(choice)}",
            "int8_acc",
            "ort_quantize_accuracy",
            after,
            config={
                "mode": "dynamic",
                "per_channel": True,
                "validation": "fidelity_calibration",
                "metric": "cosine_mean",
                "min": _bar(choice),
                "nodes_per_step": 2,
                "max_iterations": 8,
            },
        )
        return
    static: dict[str, Any] = {"mode": "static", "quant_format": "QDQ", "calibration": "calibration"}
    if gpu:
        static.update(activation_type="qint8", symmetric_activation=True, per_channel=True)
    pipeline.add(
        "static INT8 (QDQ), activation ranges calibrated on data the fidelity check never sees",
        "int8",
        "ort_quantize",
        after,
        config=static,
        search={} if gpu else {"per_channel": [False, True]},
    )
    if not gpu:
        pipeline.add("dynamic INT8: activations quantized at run time", "int8_dynamic", "ort_quantize", after, config={"mode": "dynamic"})


def _openvino(pipeline: Pipeline, facts: ModelFacts, choice: Choice, source: str | None) -> None:
    """OpenVINO's own runtime: the model as OpenVINO IR, then NNCF for INT8 / INT4."""
    device, precision = choice.device.upper(), choice.precision
    if precision == "fp16":
        hint = "device" if device == "CPU" else "f16"
        ov = pipeline.add(
            f"OpenVINO IR with FP16 weights, inference precision hint {hint}",
            "ov",
            "openvino_convert",
            source,
            config={"compress_to_fp16": True, "inference_precision_hint": hint},
        )
        return
    ov = pipeline.add(
        "OpenVINO IR, run in FP32 (precision hint f32)", "ov", "openvino_convert", source, config={"inference_precision_hint": "f32"}
    )
    transformer = "transformer" if facts.text else None
    if precision == "int8":
        common = {"calibration": "calibration", "model_type": transformer, "target_device": device}
        pipeline.add(
            "NNCF post-training INT8, calibrated on data the fidelity check never sees (presets searched); optional: "
            "the FP32 IR is a candidate too",
            "nncf_int8",
            "nncf_quantize",
            ov,
            config={k: v for k, v in common.items() if v},
            search={"preset": ["performance", "mixed"]},
            optional=True,
        )
        pipeline.add(
            f"NNCF INT8 with accuracy control: the costliest ops back in float until the cosine to FP32 drops at most {choice.max_drop / 2:g}",
            "nncf_ac",
            "nncf_quantize_accuracy",
            ov,
            config={
                **{k: v for k, v in common.items() if v},
                "preset": "performance",
                "validation": "fidelity_calibration",
                "metric": "cosine_mean",
                "max_drop": round(choice.max_drop / 2, 6),
            },
        )
    elif precision == "int4":
        pipeline.add(
            "NNCF weight-only INT4 (symmetric, group sizes searched), activations in float; optional: the FP32 IR is a candidate too",
            "int4",
            "nncf_compress_weights",
            ov,
            config={"mode": "INT4_SYM", "group_size_fallback": "adjust"},
            search={"group_size": [32, 128]},
            optional=True,
        )


def _tensorrt(pipeline: Pipeline, choice: Choice, source: str | None) -> None:
    """TensorRT fuses the standard-op graph itself: the unfused model, optionally in FP16, compiled ahead of time."""
    after = source
    if choice.precision == "fp16":
        after = pipeline.add("FP16 weights and compute", "fp16", "fp16", source)
    pipeline.add(
        "compiled ahead of time into an EPContext model: sessions start without building TensorRT engines", "compile", "ort_compile", after
    )


def _qnn(pipeline: Pipeline, choice: Choice, source: str | None) -> None:
    """The Hexagon NPU runs quantized (QDQ, uint8) or FP16 models."""
    if choice.precision == "int8":
        pipeline.add(
            "static INT8 (QDQ, uint8 weights and activations), calibrated on data the fidelity check never sees",
            "int8",
            "ort_quantize",
            source,
            config={
                "mode": "static",
                "quant_format": "QDQ",
                "calibration": "calibration",
                "activation_type": "quint8",
                "weight_type": "quint8",
            },
        )
    elif choice.precision == "fp16":
        pipeline.add("FP16 weights and compute", "fp16", "fp16", source)


def _bar(choice: Choice) -> float:
    """The cosine an accuracy-driven pass aims at on the calibration data: half the allowed loss, so held-out data has margin."""
    return round(1 - choice.max_drop / 2, 6)


def data(facts: ModelFacts, pipeline: Pipeline) -> dict[str, dict[str, Any]]:
    """The datasets: text the engine ships (tokenized with the model's tokenizer), else synthetic inputs."""
    if facts.kind in generative.KINDS:
        return generative.data(facts)
    if facts.tokenizer:
        line: dict[str, Any] = {"source": "text_lines", "path": SENTENCES, "tokenizer": facts.tokenizer, "max_length": facts.max_length}
        sets = {
            "calibration": {**line, "split": {"take": "first", "count": CALIBRATION_LINES}},
            "heldout": {**line, "split": {"take": "first", "count": CALIBRATION_LINES, "complement": True}},
            "heldout_long": {**line, "path": PARAGRAPHS, "split": dict(LONG_TEXT)},  # judged on long text too
        }
    else:
        line = {"source": "synthetic", "sequence_length": facts.max_length} if facts.text else {"source": "synthetic"}
        if facts.vocab_size:
            line["int_high"] = facts.vocab_size
        sets = {"calibration": {**line, "samples": 32, "seed": 0}, "heldout": {**line, "samples": 64, "seed": 1}}
    return sets if pipeline.calibrates else {name: value for name, value in sets.items() if name != "calibration"}


def _long_text(facts: ModelFacts) -> bool:
    """Whether the fidelity bar is held on full-length paragraphs too: text the model's tokenizer reads."""
    return facts.kind not in generative.KINDS and bool(facts.tokenizer)


def evaluate(facts: ModelFacts, pipeline: Pipeline) -> list[dict[str, Any]]:
    if facts.kind in generative.KINDS:
        return generative.evaluate(facts)
    shape = {"batch_size": 1, "sequence_length": facts.max_length} if facts.text else {"batch_size": 1}
    if facts.text and facts.vocab_size:  # token ids drawn within the model's vocabulary (a small one is below the default 1000)
        shape["int_high"] = facts.vocab_size
    latency: dict[str, Any] = {**shape, "warmup": 20, "runs": 100, "max_time_s": 30}
    found: list[dict[str, Any]] = [{"id": "fidelity", "evaluator": "fidelity", "config": {"data": "heldout"}}]
    if _long_text(facts):
        found.append({"id": "fidelity_long", "evaluator": "fidelity", "config": {"data": "heldout_long"}})
    if pipeline.uses("fidelity_calibration"):
        found.append({"id": "fidelity_calibration", "evaluator": "fidelity", "config": {"data": "calibration"}, "candidates": False})
    return [*found, {"id": "size", "evaluator": "size"}, {"id": "latency", "evaluator": "latency", "config": latency}]


def select(facts: ModelFacts, choice: Choice) -> dict[str, Any]:
    if facts.kind in generative.KINDS:
        return generative.select(facts, choice)
    bar = round(1 - choice.max_drop, 6)
    constraints = [{"metric": "fidelity.cosine_mean", "min": bar}]
    if _long_text(facts):
        constraints.append({"metric": "fidelity_long.cosine_mean", "min": bar})
    return {"objective": {"metric": "latency.p50_ms", "goal": "min"}, "constraints": constraints}


def workflow(facts: ModelFacts, choice: Choice, name: str) -> tuple[dict[str, Any], Pipeline]:
    """The whole workflow, and its steps with what each is for."""
    pipeline = steps(facts, choice)
    search: dict[str, Any] = {"sampler": "grid"}
    if choice.max_candidates:
        search["max_candidates"] = choice.max_candidates
    body: dict[str, Any] = {
        "version": 1,
        "name": name,
        "input": facts.input,
        **({"data": sets} if (sets := data(facts, pipeline)) else {}),
        "targets": [target(facts, choice)],
        "steps": pipeline.steps,
        "evaluate": evaluate(facts, pipeline),
        "select": select(facts, choice),
        "search": search,
    }
    if choice.output:
        body["output"] = {"dir": choice.output}
    return body, pipeline
