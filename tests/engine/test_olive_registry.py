"""User scripts written for Olive run unmodified: they import olive.data.registry and name their data
functions with its decorators, and Kiln (without olive-ai) provides those names while it loads the
script. The script here has the shape of the recipes' (a dataset class, registered dataset, pre- and
post-processing, a dataloader), with synthetic samples: nothing is downloaded."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import make_tiny_encoder

from engine.cli.main import main
from engine.core.errors import EvaluationError, InputError
from engine.olive.importer import translate
from evaluators._usercode import load_function
from evaluators.data.custom import Custom

SCRIPT = """
import numpy as np

from olive.data.registry import Registry


class TokenDataset:
    def __init__(self, count, length):
        self.count, self.length = count, length

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        ids = (np.arange(self.length, dtype=np.int64) + index) % 50
        return {"input_ids": ids, "attention_mask": np.ones(self.length, dtype=np.int64)}, index % 2


@Registry.register_dataset()
def token_dataset(data_dir=None, count=6, length=8, **kwargs):
    return TokenDataset(count, length)


@Registry.register_pre_process("Tokens_Pre")
def pre(dataset, **kwargs):
    return dataset


@Registry.register_post_process()
def argmax_post(output):
    return output.argmax(axis=-1)


@Registry.register_dataloader()
def token_dataloader(dataset, batch_size=1, **kwargs):
    return dataset


@Registry.register_default_post_process()
def fallback_post(output):
    return output
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    assert importlib.util.find_spec("olive") is None, "these tests show Kiln without olive-ai"
    path = tmp_path / "user_script.py"
    path.write_text(SCRIPT)
    return path


def test_the_registry_decorators_name_functions_and_leave_them_unchanged(script):
    dataset = load_function(str(script), "token_dataset", "file")
    assert dataset.__name__ == "token_dataset" and len(dataset(count=3)) == 3
    assert load_function(str(script), "tokens_pre", "file").__name__ == "pre"  # the registered name, any case
    assert load_function(str(script), "TOKENS_PRE", "file").__name__ == "pre"
    assert load_function(str(script), "default_post_process_data", "file").__name__ == "fallback_post"
    assert np.array_equal(load_function(str(script), "argmax_post", "file")(np.eye(3)), [0, 1, 2])
    assert not any(name == "olive" or name.startswith("olive.") for name in sys.modules)  # the stand-in is gone


def test_a_name_neither_defined_nor_registered_lists_both(script):
    with pytest.raises(EvaluationError) as caught:
        load_function(str(script), "nope", "file")
    assert "names its registry decorators gave: argmax_post, default_post_process_data" in str(caught.value)


def test_only_the_registry_is_provided(tmp_path):
    other = tmp_path / "other.py"
    other.write_text("from olive.model import ONNXModelHandler\n")
    with pytest.raises(EvaluationError) as caught:
        load_function(str(other), "anything", "file")
    assert "olive-ai is not installed: Kiln provides only olive.data.registry's Registry decorators" in str(caught.value)


def test_the_custom_data_source_reads_an_olive_dataset_of_samples(script):
    data = Custom(Custom.Config(source="custom", file=str(script), function="token_dataset", options={"count": 5})).load(None)
    assert len(data) == 5 and data.inputs["input_ids"].shape == (5, 8) and data.inputs["input_ids"].dtype == np.int64
    assert np.array_equal(data.labels, [0, 1, 0, 1, 0])
    with pytest.raises(InputError) as caught:
        Custom(Custom.Config(source="custom", file=str(script), function="argmax_post")).load(None)
    assert "custom.function" in str(caught.value)


def test_an_olive_config_with_registered_data_translates_and_runs(script, tmp_path, capsys):
    make_tiny_encoder(tmp_path / "model.onnx")
    config = {
        "input_model": {"type": "OnnxModel", "model_path": "model.onnx"},
        "systems": {"local": {"type": "LocalSystem", "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}},
        "data_configs": [
            {
                "name": "calib",
                "user_script": "user_script.py",
                "load_dataset_config": {"type": "token_dataset", "params": {"count": 4}},
                "dataloader_config": {"type": "token_dataloader", "params": {"batch_size": 1}},
            }
        ],
        "evaluators": {
            "common": {
                "metrics": [
                    {
                        "name": "outputs",
                        "type": "custom",
                        "sub_types": [{"name": "count", "priority": 1, "higher_is_better": True}],
                        "user_config": {"user_script": "metric.py", "evaluate_func": "outputs_of"},
                    }
                ]
            }
        },
        "passes": {
            "quantization": {"type": "onnxstaticquantization", "data_config": "calib", "precision": "int8", "activation_type": "uint8"}
        },
        "engine": {"target": "local", "evaluator": "common"},
    }
    (tmp_path / "metric.py").write_text("def outputs_of(run, data):\n    return float(len(run.outputs))\n")
    source = tmp_path / "olive.json"
    source.write_text(json.dumps(config))
    translation = translate(config, source)
    assert translation.workflow["data"] == {
        "calib": {"source": "custom", "file": "user_script.py", "function": "token_dataset", "options": {"count": 4}}
    }
    assert [w for w, _ in translation.unmapped] == ["data_configs[0]: token_dataloader"]
    (step,) = translation.workflow["steps"]
    assert step["config"] == {
        "mode": "static",
        "activation_type": "quint8",
        "calibration": "calib",
    }  # uint8 → quint8; int8 weights: Kiln's default
    code = main(["run", str(source), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out"), "-q"])
    assert code == 0, capsys.readouterr()
    records = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    assert len(records) == 2 and all(r.get("metrics", {}).get("outputs.count") == 1.0 for r in records)  # calibrated and measured
