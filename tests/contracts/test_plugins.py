"""Every registered plugin (passes, evaluators, targets, data sources) against the plugin
contract, with the same checks a third-party plugin runs (see docs/plugins.md)."""

from __future__ import annotations

from engine.conformance import conformance_tests

#: example configs for plugins whose required options the schema alone cannot fill
EXAMPLES = {
    "passes:ort_quantize": {"mode": "static", "calibration": "calib"},
    "passes:ort_quantize_accuracy": {"calibration": "calib", "validation": "fidelity", "metric": "cosine_mean", "min": 0.99},
    "passes:inc_quantize": {"mode": "static", "calibration": "calib"},
    "passes:inc_quantize_accuracy": {"calibration": "calib", "validation": "fidelity", "metric": "cosine_mean"},
    "passes:gptq": {"calibration": "calib"},
    "passes:graph_surgery": {"surgeries": [{"surgeon": "GemmToMatMulAdd"}]},
    "datasources:csv": {"source": "csv", "path": "data.csv", "text_column": "text"},
    "datasources:jsonl": {"source": "jsonl", "path": "data.jsonl", "text_column": "text"},
}

#: passes run twice on a tiny ONNX model, with their config there (None: the example's). Not here: torch_export and openvino_convert (they need
#: torch / OpenVINO and a model of their own formats; their tests run them), ort_fusion (reads the
#: workflow's input model for the model type), the nncf_* passes (OpenVINO, seconds each) and
#: ort_quantize_accuracy (needs a dataset and an evaluation), the inc_* passes (they run in their own
#: environment; tests/passes/test_inc_quantize.py runs them there).
DETERMINISTIC = {"fp16": None, "int4_weights": None, "onnx_simplify": None, "ort_graph_optimize": None, "ort_quantize": {}}

globals().update(conformance_tests(examples=EXAMPLES, deterministic=DETERMINISTIC))
