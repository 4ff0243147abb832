"""Every registered plugin (passes, evaluators, targets, data sources) against the plugin
contract, with the same checks a third-party plugin runs (see docs/plugins.md)."""

from __future__ import annotations

from engine.conformance import conformance_tests

#: example configs for plugins whose required options the schema alone cannot fill
EXAMPLES = {
    "passes:ort_quantize": {"mode": "static", "calibration": "calib"},
    "passes:qnn_quantize": {"calibration": "calib"},
    "passes:ort_quantize_accuracy": {"calibration": "calib", "validation": "fidelity", "metric": "cosine_mean", "min": 0.99},
    "passes:inc_quantize": {"mode": "static", "calibration": "calib"},
    "passes:inc_quantize_accuracy": {"calibration": "calib", "validation": "fidelity", "metric": "cosine_mean"},
    "passes:quark_quantize": {"calibration": "calib"},
    "passes:gptq": {"calibration": "calib"},
    "passes:graph_surgery": {"surgeries": [{"surgeon": "GemmToMatMulAdd"}]},
    "passes:split_model": {"num_splits": 2},
    "passes:fixed_shape": {"dim_param": ["batch"], "dim_value": [1]},
    "datasources:csv": {"source": "csv", "path": "data.csv", "text_column": "text"},
    "datasources:jsonl": {"source": "jsonl", "path": "data.jsonl", "text_column": "text"},
    "datasources:hf_dataset": {"source": "hf_dataset", "name": "nyu-mll/glue", "config": "sst2", "text_column": "sentence"},
}

#: passes run twice on a tiny ONNX model, with their config there (None: the example's). The other
#: built-in passes (and these with other options, on a BERT export) run twice on inputs of their own
#: in tests/contracts/test_pass_determinism.py: the exports, ort_fusion, graph_surgery, ort_serialize,
#: ort_quantize_accuracy, the OpenVINO / NNCF passes, the decoder and PyTorch quantization passes, and
#: ort_compile, the inc_* passes and quark_quantize in their own environments.
DETERMINISTIC = {
    "fp16": None,
    "int4_weights": None,
    "onnx_simplify": None,
    "onnx_peephole": None,
    "qnn_preprocess": None,
    "ort_graph_optimize": None,
    "ort_quantize": {},
}

globals().update(conformance_tests(examples=EXAMPLES, deterministic=DETERMINISTIC))
