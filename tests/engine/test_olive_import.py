"""Olive configs, written as Olive's users write them (one per pass family), translated into
workflows: the steps, targets, data and selection they give, the exact keys not carried over,
and each result through validation. Translation only, except one tiny run of an Olive config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import make_tiny_encoder

from engine.cli.main import main
from engine.olive.cli import to_yaml
from engine.olive.importer import Translation, is_olive_config, translate
from engine.workflow import load_workflow

CPU = {"local_system": {"type": "LocalSystem", "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}}
LATENCY = {"name": "latency", "type": "latency", "sub_types": [{"name": "avg", "priority": 1}]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("olive")
    make_tiny_encoder(root / "model.onnx")
    (root / "bert").mkdir()
    (root / "bert" / "config.json").write_text('{"model_type": "bert"}')
    header = b'{"__metadata__":{"format":"pt"}}'
    (root / "bert" / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)  # no tensors: never loaded here
    (root / "bert" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")  # text data is tokenized with the input's tokenizer
    (root / "user_script.py").write_text(
        "def load_model(model_path=None):\n    pass\n\ndef eval_accuracy(model, device, eps):\n    return 1\n\n"
        "def my_loader(model=None):\n    return {}\n\n"
        "def outputs_of(run, data):\n    return float(len(run.outputs))\n"
    )
    (root / "sst2.csv").write_text("sentence,label\ngood,1\nbad,0\n")
    return root


def olive(folder: Path, passes: dict[str, Any], **rest: Any) -> dict[str, Any]:
    return {
        "input_model": {"type": "ONNXModel", "model_path": "model.onnx"},
        "systems": CPU,
        "evaluators": {"common_evaluator": {"metrics": [LATENCY]}},
        "passes": passes,
        "engine": {"evaluator": "common_evaluator", "target": "local_system", "output_dir": "out"},
        **rest,
    }


def roundtrip(folder: Path, config: dict[str, Any], name: str) -> Translation:
    """Translate, write the workflow into a sub-folder (paths relative to it) and validate it."""
    assert is_olive_config(config)
    source = folder / f"{name}.json"
    source.write_text(json.dumps(config))
    dest = folder / "kiln" / f"{name}.yaml"
    dest.parent.mkdir(exist_ok=True)
    translation = translate(config, source, dest.parent)
    dest.write_text(to_yaml(translation, source))
    load_workflow(dest)  # raises InputError, with every problem, when the output does not validate
    return translation


def steps(translation: Translation) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    return [(s["id"], s["pass"], s.get("config", {}), s.get("search", {})) for s in translation.workflow["steps"]]


def test_hf_model_export_fusion_dynamic_int8_with_goals(folder):
    config = olive(
        folder,
        {
            "conversion": {"type": "OnnxConversion", "target_opset": 17, "save_as_external_data": True},
            "transformers_optimization": {"type": "OrtTransformersOptimization", "model_type": "bert", "opt_level": 1, "float16": True},
            "quantization": {"type": "OnnxDynamicQuantization", "per_channel": "SEARCHABLE_VALUES", "weight_type": "QUInt8"},
        },
        input_model={"type": "HfModel", "model_path": "bert", "task": "text-classification"},
        data_configs=[
            {
                "name": "sst2",
                "type": "HuggingfaceContainer",
                "load_dataset_config": {"data_name": "csv", "data_files": "sst2.csv", "split": "train"},
                "pre_process_data_config": {"input_cols": ["sentence"], "label_col": "label", "max_length": 64, "max_samples": 100},
            }
        ],
        search_strategy={"execution_order": "joint", "sampler": "tpe", "sampler_config": {"max_samples": 4, "seed": 0}},
    )
    config["evaluators"]["common_evaluator"]["metrics"] = [
        {
            "name": "accuracy",
            "type": "accuracy",
            "data_config": "sst2",
            "sub_types": [{"name": "accuracy_score", "priority": 2, "goal": {"type": "max-degradation", "value": 0.01}}, {"name": "auroc"}],
        },
        {
            "name": "latency",
            "type": "latency",
            "sub_types": [{"name": "p90", "priority": 1, "goal": {"type": "percent-min-improvement", "value": 20}}],
        },
    ]
    config["engine"]["evaluate_input_model"] = False  # not followed: a goal is a drop from the input model
    t = roundtrip(folder, config, "hf")
    assert any("evaluate_input_model: false not followed" in note and "accuracy.top1" in note for note in t.notes)
    assert t.workflow["input"] == {"format": "hf", "path": "../bert", "task": "text-classification"}
    assert steps(t) == [
        ("conversion", "torch_export", {"opset": 17}, {}),
        ("transformers_optimization", "ort_fusion", {"model_type": "bert", "opt_level": 1}, {}),
        # Olive's float16 converts the fused model (its keep_io_types default: true): an fp16 step of its own
        ("transformers_optimization_fp16", "fp16", {"keep_io_types": True}, {}),
        ("quantization", "ort_quantize", {"mode": "dynamic", "weight_type": "quint8"}, {"per_channel": [False, True]}),
    ]
    assert [s.get("after") for s in t.workflow["steps"]] == [
        None,
        "conversion",
        "transformers_optimization",
        "transformers_optimization_fp16",
    ]
    assert t.workflow["data"]["sst2"] == {
        "source": "csv",
        "path": "../sst2.csv",
        "text_column": "sentence",
        "label_column": "label",
        "max_length": 64,
        "split": {"take": "first", "count": 100},
    }
    assert t.workflow["select"] == {
        "objective": {"metric": "latency.p90_ms", "goal": "min"},
        "constraints": [{"metric": "accuracy.top1", "max_drop": 0.01}, {"metric": "latency.speedup", "min": 1.25}],
    }
    assert t.workflow["search"] == {"sampler": "tpe", "max_candidates": 4, "seed": 0}
    assert [w for w, _ in t.unmapped] == ["evaluators.common_evaluator.metrics[0].sub_types[1].name"]
    assert any("passes.conversion.save_as_external_data: Kiln writes weights over" in n for n in t.notes)


def test_static_and_searched_quantization_with_a_user_script_dataloader(folder):
    config = olive(
        folder,
        {
            "quantization": {
                "type": "OnnxQuantization",
                "quant_mode": "SEARCHABLE_VALUES",
                "data_config": "calib",
                "quant_format": "QDQ",
                "calibrate_method": "Entropy",
            },
            "static": {"type": "OnnxStaticQuantization", "data_config": "user_data", "per_channel": True},
        },
        data_configs=[
            {"name": "calib", "type": "DummyDataContainer", "load_dataset_config": {"input_shapes": [[1, 16], [1, 16]], "max_samples": 8}},
            {
                "name": "user_data",
                "type": "HuggingfaceContainer",
                "user_script": "user_script.py",
                "load_dataset_config": {"type": "my_loader"},
            },
        ],
        search_strategy={"execution_order": "joint", "sampler": "sequential"},
    )
    t = roundtrip(folder, config, "static")
    assert steps(t) == [
        (
            "quantization",
            "ort_quantize",
            {},
            {
                "mode": ["dynamic", "static"],
                # Olive 0.13's static defaults: int8 activations (Kiln's default is quint8), QDQ (Kiln's too)
                "activation_type": {"values": ["qint8"], "when": {"mode": "static"}},
                "calibration": {"values": ["calib"], "when": {"mode": "static"}},
                "calibration_method": {"values": ["Entropy"], "when": {"mode": "static"}},
            },
        ),
        ("static", "ort_quantize", {"mode": "static", "activation_type": "qint8", "calibration": "user_data", "per_channel": True}, {}),
    ]
    assert t.workflow["data"] == {
        "calib": {"source": "synthetic", "samples": 8, "sequence_length": 16},
        # named, never run by the translation: Kiln calls it when the data is read
        "user_data": {"source": "custom", "file": "../user_script.py", "function": "my_loader", "options": {}},
    }
    assert t.unmapped == []
    assert any("runs my_loader(model, **options)" in n for n in t.notes)
    assert t.workflow["search"] == {"sampler": "grid"}


def test_int4_fp16_peephole_on_cuda_and_a_hub_dataset(folder):
    config = olive(
        folder,
        {
            "peephole": {"type": "OnnxPeepholeOptimizer"},
            "int4": {"type": "OnnxMatMul4Quantizer", "block_size": 128, "is_symmetric": False, "accuracy_level": 4},
            "rtn": {"type": "OnnxBlockWiseRtnQuantization", "block_size": 32, "fuse_something": 1},
            "fp16": {"type": "OnnxFloatToFloat16", "keep_io_types": True, "op_include_list": ["MatMul"]},
        },
        systems={
            "gpu": {
                "type": "LocalSystem",
                "accelerators": [{"device": "gpu", "execution_providers": ["CUDAExecutionProvider", "TensorrtExecutionProvider"]}],
            }
        },
        data_configs=[
            {
                "name": "wiki",
                "type": "TextGenerationContainer",
                "load_dataset_config": {"data_name": "wikitext", "subset": "wikitext-2-raw-v1"},
            }
        ],
    )
    config["engine"]["target"] = "gpu"
    t = roundtrip(folder, config, "int4")
    assert steps(t) == [
        ("peephole", "onnx_simplify", {}, {}),
        ("int4", "int4_weights", {"block_size": 128, "is_symmetric": False, "accuracy_level": 4}, {}),
        ("rtn", "int4_weights", {"block_size": 32, "op_types": ["MatMul", "Gather"]}, {}),  # Olive quantizes Gather too
        ("fp16", "fp16", {"min_positive_val": 1e-7, "max_finite_val": 1e4, "keep_io_types": True}, {}),
    ]
    assert [s.get("after") for s in t.workflow["steps"]] == [None, "peephole", "int4", "rtn"]
    assert t.workflow["targets"] == [
        {"id": "cuda-gpu", "runtime": "onnxruntime", "device": "cuda", "providers": ["CUDAExecutionProvider"]},
        {"id": "tensorrt-gpu", "runtime": "onnxruntime", "device": "cuda", "providers": ["TensorrtExecutionProvider"]},
    ]
    assert [w for w, _ in t.unmapped] == ["data_configs[0].load_dataset_config", "passes.rtn.fuse_something", "passes.fp16.op_include_list"]


def test_session_params_tuning_becomes_the_targets_searched_settings(folder):
    tuning = {
        "type": "OrtSessionParamsTuning",
        "intra_thread_num_list": [1, 2],
        "execution_mode_list": [0, 1],
        "io_bind": True,
        "enable_profiling": True,
    }
    t = roundtrip(folder, olive(folder, {"tune": tuning}, search_strategy={"sampler": "random"}), "session")
    assert t.workflow["steps"] == []
    assert t.workflow["targets"] == [
        {
            "id": "cpu",
            "runtime": "onnxruntime",
            "device": "cpu",
            "search": {"intra_op_threads": [1, 2], "execution_mode": ["sequential", "parallel"], "io_binding": [False, True]},
        }
    ]
    assert [w for w, _ in t.unmapped] == ["passes.tune.enable_profiling"]


def test_openvino_conversion_quantization_and_weight_compression(folder):
    config = olive(
        folder,
        {
            "ov_convert": {"type": "OpenVINOConversion", "input_shapes": [[1, 128]], "static": True},
            "ov_quant": {
                "type": "OpenVINOQuantization",
                "data_config": "calib",
                "model_type": "TRANSFORMER",
                "ignored_scope": ["Softmax"],
                "ignored_scope_type": "types",
            },
            "ov_wc": {"type": "OpenVINOWeightCompression", "compress_config": {"mode": "INT4_SYM", "group_size": 64, "ratio": 0.8}},
        },
        input_model={"type": "HfModel", "model_path": "bert"},
        systems={"ov": {"type": "LocalSystem", "accelerators": [{"device": "cpu", "execution_providers": ["OpenVINOExecutionProvider"]}]}},
        data_configs=[{"name": "calib", "type": "DummyDataContainer", "load_dataset_config": {"input_shapes": [[1, 128]]}}],
    )
    config["engine"].update(target="ov", evaluate_input_model=False)
    t = roundtrip(folder, config, "openvino")
    assert t.workflow["search"] == {"sampler": "grid", "reference": False}  # Olive does not evaluate the input model
    assert any("search.reference: false" in note for note in t.notes)
    assert t.workflow["targets"] == [{"id": "openvino-cpu", "runtime": "openvino", "device": "CPU"}]
    assert steps(t) == [
        ("ov_convert", "openvino_convert", {"compress_to_fp16": True}, {}),
        (
            "ov_quant",
            "nncf_quantize",
            {"preset": "performance", "calibration": "calib", "model_type": "transformer", "ignored_scope": {"types": ["Softmax"]}},
            {},
        ),
        ("ov_wc", "nncf_compress_weights", {"mode": "INT4_SYM", "group_size": 64, "ratio": 0.8}, {}),
    ]
    assert [w for w, _ in t.unmapped] == ["passes.ov_convert.input_shapes", "passes.ov_convert.static"]


def test_pytorch_model_inc_custom_metric_and_unknown_pass(folder):
    config = olive(
        folder,
        {
            "conversion": {"type": "OnnxConversion", "target_opset": 17},
            "inc": {"type": "IncStaticQuantization", "approach": "static"},
            "mystery": {"type": "SomeFuturePass", "knob": 3},
            "dyn": [{"type": "OnnxDynamicQuantization", "per_channel": False}, {"type": "OnnxDynamicQuantization", "per_channel": True}],
        },
        input_model={
            "type": "PyTorchModel",
            "model_path": "weights.pt",
            "model_script": "user_script.py",
            "model_loader": "load_model",
            "dummy_inputs_func": "dummy_inputs",
            "io_config": {"input_names": ["x"], "input_shapes": [[1, 3, 8, 8]], "input_types": ["float32"], "output_names": ["y"]},
        },
        workflow_id="resnet_ptq",
        search_strategy=True,
    )
    config["evaluators"]["common_evaluator"]["metrics"] = [
        {
            "name": "acc",
            "type": "custom",
            "user_config": {"user_script": "user_script.py", "evaluate_func": "eval_accuracy"},
            "sub_types": [
                {"name": "accuracy_custom", "priority": 1, "higher_is_better": True, "goal": {"type": "threshold", "value": 0.9}}
            ],
        }
    ]
    t = roundtrip(folder, config, "torch")
    assert t.workflow["name"] == "resnet_ptq"
    # Olive passes model_path to the loader: Kiln passes it by the name of the loader's first parameter
    assert t.workflow["input"] == {"format": "torch", "factory": "../user_script.py:load_model", "kwargs": {"model_path": "weights.pt"}}
    assert steps(t) == [
        (
            "conversion",
            "torch_export",
            {"input_shapes": {"x": [1, 3, 8, 8]}, "input_dtypes": {"x": "float32"}, "outputs": ["y"], "opset": 17},
            {},
        ),
        ("inc", "inc_quantize", {"mode": "static", "calibration": "calibration"}, {}),
        ("dyn", "ort_quantize", {"mode": "dynamic"}, {"per_channel": [False, True]}),
    ]
    assert t.workflow["steps"][2]["after"] == "inc"
    assert t.workflow["evaluate"] == [
        {
            "id": "acc",
            "evaluator": "custom",
            "config": {"file": "../user_script.py", "function": "eval_accuracy", "metrics": ["accuracy_custom"]},
        }
    ]
    assert t.workflow["select"] == {
        "objective": {"metric": "acc.accuracy_custom", "goal": "max"},
        "constraints": [{"metric": "acc.accuracy_custom", "min": 0.9}],
    }
    assert [w for w, _ in t.unmapped] == ["input_model.model_path", "input_model.dummy_inputs_func", "passes.mystery"]
    assert "is not there" in dict(t.unmapped)["input_model.model_path"]
    assert "SomeFuturePass" in dict(t.unmapped)["passes.mystery"]


def test_model_builder_and_a_hub_model(folder):
    config = olive(
        folder,
        {"builder": {"type": "ModelBuilder", "precision": "int4", "int4_block_size": 64}},
        input_model={"type": "HfModel", "model_path": "bert"},
    )
    t = roundtrip(folder, config, "genai")
    assert steps(t) == [("builder", "genai_build", {"precision": "int4", "block_size": 64}, {})]
    assert t.workflow["targets"] == [{"id": "genai-cpu", "runtime": "onnxruntime-genai", "device": "cpu"}]
    hub_model = {"type": "hfmodel", "model_path": "microsoft/Phi-3-mini-4k-instruct", "load_kwargs": {"trust_remote_code": True}}
    hub = translate(
        {**config, "input_model": {**hub_model, "load_kwargs": {"trust_remote_code": True, "revision": "v1"}}}, folder / "hub.json"
    )
    # a Hub id is the Hub model (engine run fetches it into the Hugging Face cache), with Olive's load_kwargs that Kiln has
    assert hub.workflow["input"] == {
        "format": "hf",
        "model": "microsoft/Phi-3-mini-4k-instruct",
        "revision": "v1",
        "trust_remote_code": True,
    }
    assert hub.unmapped == []


def test_import_olive_cli_writes_the_workflow_and_refuses_bad_input(folder, capsys):
    source = folder / "cli.json"
    source.write_text(json.dumps(olive(folder, {"q": {"type": "OnnxDynamicQuantization"}, "x": {"type": "Nope"}})))
    out = folder / "kiln" / "cli.yaml"
    assert main(["import-olive", str(source), "-o", str(out)]) == 0
    assert out.read_text().startswith("# Translated from the Olive config cli.json")
    assert "passes.x" in capsys.readouterr().out
    assert main(["validate", str(out)]) == 0
    assert main(["validate", str(source)]) == 2
    assert "is an Olive config: `engine import-olive" in capsys.readouterr().err
    (folder / "kiln.json").write_text(json.dumps({"version": 1, "steps": []}))
    assert main(["import-olive", str(folder / "kiln.json")]) == 2
    assert "not an Olive config" in capsys.readouterr().err
    (folder / "broken.json").write_text('{"passes": {')
    assert main(["import-olive", str(folder / "broken.json")]) == 2
    err = capsys.readouterr().err
    assert "broken.json:1" in err and "malformed JSON" in err


def test_engine_run_translates_an_olive_config_and_runs_it(folder, tmp_path, capsys):
    config = olive(
        folder,
        {"quantization": {"type": "OnnxDynamicQuantization", "per_channel": True}},
        data_configs=[
            {"name": "dummy", "type": "DummyDataContainer", "load_dataset_config": {"input_shapes": [[1, 16]], "max_samples": 4}}
        ],
    )
    config["evaluators"]["common_evaluator"]["metrics"] = [  # a custom metric: cheap, and no timing in a test
        {
            "name": "outputs",
            "type": "custom",
            "sub_types": [{"name": "count", "priority": 1, "higher_is_better": True}],
            "user_config": {"user_script": "user_script.py", "evaluate_func": "outputs_of"},
        }
    ]
    source = folder / "run.json"
    source.write_text(json.dumps(config))
    code = main(["run", str(source), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out"), "-q"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "pass: ort_quantize" in printed
    assert (folder / "run.from-olive.yaml").is_file()
    records = json.loads((tmp_path / "out" / "candidates.json").read_text())["candidates"]
    assert [r["metrics"].get("outputs.count") for r in records] == [1.0, 1.0]  # the reference and the INT8 model


def test_an_olive_config_of_the_wrong_shape_is_refused_with_every_place(folder, capsys):
    config = olive(folder, {"q": {"type": "OnnxDynamicQuantization"}, "bad": [{"type": "OnnxDynamicQuantization"}, 3]}, systems=[])
    config["evaluators"]["common_evaluator"]["metrics"] = [
        {"name": "l", "type": "latency", "sub_types": [{"name": "avg", "goal": {"type": "threshold", "value": "fast"}}]}
    ]
    (folder / "shape.json").write_text(json.dumps(config))
    assert main(["import-olive", str(folder / "shape.json")]) == 2
    err = capsys.readouterr().err
    assert "3 problems found" in err
    for where in ("passes.bad[1]", "systems", "evaluators.common_evaluator.metrics[0].sub_types[0].goal.value"):
        assert f"shape.json: {where}: has the wrong type" in err
    config = olive(
        folder, {"q": {"type": "OnnxDynamicQuantization"}}, systems={"local_system": {"type": "LocalSystem", "accelerators": ["cpu"]}}
    )
    (folder / "deep.json").write_text(json.dumps(config))
    assert main(["import-olive", str(folder / "deep.json")]) == 2
    assert "deep.json: systems.local_system.accelerators[0]: a value of a type or shape" in capsys.readouterr().err


def test_a_pass_that_needs_data_and_names_none_gets_a_named_stand_in(folder):
    t = roundtrip(folder, olive(folder, {"s": {"type": "OnnxStaticQuantization"}}), "nodata")
    assert steps(t) == [("s", "ort_quantize", {"mode": "static", "activation_type": "qint8", "calibration": "calibration"}, {})]
    assert t.workflow["data"] == {"calibration": {"source": "synthetic", "samples": 32}}
    assert t.notes == ["passes.s.data_config: dataset 'calibration' is a synthetic stand-in; replace it with your data"]


def test_a_long_file_name_becomes_a_valid_stable_workflow_name(folder, capsys):
    """A config named after its path in a repository (past the 64-character rule) imports to a workflow
    the validator accepts: a shortened name with a hash of the whole, the full name in the description."""
    config = olive(folder, {"q": {"type": "OnnxDynamicQuantization"}})
    long = "microsoft-Phi-4-mini-instruct-QNN-phi4_mini_qnn_docker-with.a.very.long.name-and-more-words"
    names = []
    for stem in (long, long + "-2", "2-" + long):
        source = folder / f"{stem}.json"
        source.write_text(json.dumps(config))
        out = folder / "kiln" / "long.yaml"
        assert main(["import-olive", str(source), "-o", str(out)]) == 0
        assert f"{out}: valid" in capsys.readouterr().out
        written = load_workflow(out).spec
        assert len(written.name) <= 64 and written.name[0].isalpha()
        assert stem in (written.description or "")
        names.append(written.name)
    assert len(set(names)) == 3  # same head, different names: the hash keeps them apart
    assert translate(config, folder / f"{long}.json", folder).workflow["name"] == names[0]  # stable


def test_the_importer_validates_what_it_writes(folder):
    """load_translation runs Kiln's validator on the workflow as written: the problems come with the translation."""
    from engine.olive.cli import load_translation

    source = folder / "checked.json"
    source.write_text(json.dumps(olive(folder, {"q": {"type": "OnnxDynamicQuantization"}})))
    assert load_translation(source, folder / "kiln").problems == []
    source.write_text(
        json.dumps(
            {**olive(folder, {"q": {"type": "OnnxDynamicQuantization"}}), "input_model": {"type": "ONNXModel", "model_path": "gone.onnx"}}
        )
    )
    problems = load_translation(source, folder / "kiln").problems
    assert [p.where for p in problems] == ["input.path"]
    assert not list((folder / "kiln").glob(".kiln-import-*"))  # the scratch copy is gone


def test_the_written_workflow_says_how_keys_were_carried(folder):
    """The notes (a CaptureSplitInfo folded into split_model, say) are in the written file, not only on the terminal."""
    split = {"type": "CaptureSplitInfo", "num_splits": 2}
    config = olive(folder, {"info": split, "split": {"type": "SplitModel"}})
    source = folder / "split.json"
    source.write_text(json.dumps(config))
    translation = translate(config, source, folder)
    text = to_yaml(translation, source)
    assert "# Notes:\n" in text and "#   passes.info: the split it records ({'num_splits': 2}) is made by the split_model step" in text


def test_olive_hub_datasets_become_hf_datasets_not_stand_ins(folder):
    """load_dataset_config (data_name, subset, split) and its pre-processing (columns, lengths, samples) map to
    hf_dataset: GLUE's sentence pairs with labels, wikitext joined into windows for a GPTQ calibration, and a
    GPTQ that names no data gets Olive's default (wikitext-2 train[:1000], 128 windows of 2048 tokens)."""
    glue = {
        "name": "glue_mrpc",
        "type": "HuggingfaceContainer",
        "load_dataset_config": {"data_name": "glue", "subset": "mrpc", "split": "validation"},
        "pre_process_data_config": {
            "input_cols": ["sentence1", "sentence2"],
            "label_col": "label",
            "max_length": 128,
            "padding": "max_length",
            "max_samples": 100,
        },
    }
    wiki = {
        "name": "wiki",
        "type": "HuggingfaceContainer",
        "load_dataset_config": {"data_name": "wikitext", "subset": "wikitext-2-raw-v1", "split": "train"},
        "pre_process_data_config": {"strategy": "join", "add_special_tokens": False, "max_seq_len": 512, "max_samples": 16},
    }
    config = olive(folder, {"q": {"type": "OnnxStaticQuantization", "data_config": "glue_mrpc"}}, data_configs=[glue, wiki])
    config["input_model"] = {"type": "HfModel", "model_path": "bert", "task": "text-classification"}
    translation = translate(config, folder / "hubdata.json", folder)
    assert translation.workflow["data"]["glue_mrpc"] == {
        "source": "hf_dataset",
        "name": "glue",
        "config": "mrpc",
        "hf_split": "validation",
        "text_column": "sentence1",
        "text_pair_column": "sentence2",
        "label_column": "label",
        "max_length": 128,
        "padding": "max_length",
        "limit": 100,
    }
    assert translation.workflow["data"]["wiki"] == {
        "source": "hf_dataset",
        "name": "wikitext",
        "config": "wikitext-2-raw-v1",
        "hf_split": "train",
        "text_column": "text",
        "join": True,
        "max_length": 512,
        "limit": 16,
    }
    assert not any("stand-in" in note for note in translation.notes)
    gptq = olive(folder, {"g": {"type": "GptqQuantizer", "bits": 4}})
    gptq["input_model"] = {"type": "HfModel", "model_path": "bert"}
    data = translate(gptq, folder / "gptq.json", folder).workflow["data"]
    assert data == {
        "wikitext2_calibration": {**data["wikitext2_calibration"], "name": "wikitext", "hf_split": "train[:1000]", "limit": 128}
    }


def test_an_olive_image_dataset_becomes_an_hf_dataset_image_column_fed_to_the_models_input(folder):
    """timm's MobileNetV3 recipe for Vitis AI: timm/mini-imagenet through its script's image_pre_process
    (input_col image, label_col label) → hf_dataset's image_column, 224 x 224 with ImageNet's mean and std,
    named for the model's input (io_config: x); the approximation is said."""
    data = {
        "name": "calib_data",
        "type": "HuggingfaceContainer",
        "load_dataset_config": {"data_name": "timm/mini-imagenet", "split": "validation[:12]"},
        "pre_process_data_config": {"type": "image_pre_process", "input_col": "image", "label_col": "label"},
    }
    config = olive(folder, {"q": {"type": "OnnxStaticQuantization", "data_config": "calib_data"}}, data_configs=[data])
    config["input_model"] = {
        "type": "PyTorchModel",
        "model_path": "timm/mobilenetv3_small_100.lamb_in1k",
        "model_loader": "load_model",
        "model_script": "user_script.py",
        "io_config": {"input_names": ["x"], "input_shapes": [[1, 3, 224, 224]], "output_names": ["output"]},
    }
    translation = translate(config, folder / "images.json", folder)
    assert translation.workflow["data"]["calib_data"] == {
        "source": "hf_dataset",
        "name": "timm/mini-imagenet",
        "hf_split": "validation[:12]",
        "image_column": "image",
        "size": [224, 224],
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "input_name": "x",
        "label_column": "label",
    }
    assert any("approximated" in note and "fed to input 'x'" in note for note in translation.notes)
