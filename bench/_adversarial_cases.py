"""What bench/adversarial.py feeds Kiln: tiny real ONNX models (good and broken), a small real
workflow over them, and a seeded generator of mutated and hostile workflow files."""

from __future__ import annotations

import copy
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import yaml
from onnx import TensorProto, helper

from engine.conformance import tiny_encoder


def make_tiny_encoder(path: Path, hidden: int = 32, vocab: int = 1000, seed: int = 0) -> Path:
    """input_ids, attention_mask [batch, sequence] -> ... -> last_hidden_state; a real ONNX model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(tiny_encoder(hidden, vocab, seed), str(path))
    return path


def tiny_workflow(model_path: Path, **overrides: Any) -> dict[str, Any]:
    """FP32 reference and dynamic INT8 per-tensor / per-channel, sized and timed (few runs). The
    choice is by size, so that two runs of it choose the same bytes whatever the timings say."""
    workflow: dict[str, Any] = {
        "version": 1,
        "name": "tiny",
        "input": {"format": "onnx", "path": str(model_path)},
        "data": {"rows": {"source": "synthetic", "samples": 8, "sequence_length": 16}},
        "targets": [{"id": "cpu", "runtime": "onnxruntime", "intra_op_threads": 1}],
        "steps": [{"id": "int8", "pass": "ort_quantize", "config": {"mode": "dynamic"}, "search": {"per_channel": [False, True]}}],
        "evaluate": [
            {"id": "size", "evaluator": "size"},
            {"id": "fidelity", "evaluator": "fidelity", "config": {"data": "rows"}},
            {
                "id": "latency",
                "evaluator": "latency",
                "config": {"batch_size": 1, "sequence_length": 16, "warmup": 2, "runs": 10, "quiet_wait_s": 1},
            },
        ],
        "select": {
            "objective": {"metric": "size.file_bytes", "goal": "min"},
            "constraints": [{"metric": "fidelity.cosine_mean", "min": 0.9}],
        },
    }
    workflow.update(overrides)
    return workflow


def write_workflow(folder: Path, workflow: dict[str, Any], name: str = "workflow.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(workflow, sort_keys=False))
    return path


# --- broken models -------------------------------------------------------------------------


def _graph_model(nodes: list[Any], inputs: list[Any], outputs: list[Any], domains: dict[str, int] | None = None) -> Any:
    graph = helper.make_graph(nodes, "broken", inputs, outputs)
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _save_unchecked(model: Any, path: Path) -> None:
    path.write_bytes(model.SerializeToString())


def bad_models(folder: Path) -> dict[str, Path]:
    """name -> an ONNX file no runtime can load (or that is not an ONNX model at all)."""
    folder.mkdir(parents=True, exist_ok=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    made: dict[str, Path] = {}

    path = folder / "unknown_domain.onnx"
    _save_unchecked(
        _graph_model([helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example.nowhere")], [x], [y], {"com.example.nowhere": 1}),
        path,
    )
    made["unknown-domain op"] = path

    good = tiny_encoder(32, 1000, 0)
    ext = folder / "external" / "model.onnx"
    ext.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(good, str(ext), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    (ext.parent / "weights.bin").unlink()
    made["missing external data"] = ext

    whole = good.SerializeToString()
    path = folder / "truncated.onnx"
    path.write_bytes(whole[: len(whole) // 2])
    made["truncated protobuf"] = path

    path = folder / "empty.onnx"
    path.write_bytes(b"")
    made["empty file"] = path

    path = folder / "cycle.onnx"
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Identity", ["a"], ["y"])]
    _save_unchecked(_graph_model(nodes, [x], [y]), path)
    made["graph cycle"] = path

    path = folder / "dangling.onnx"
    _save_unchecked(_graph_model([helper.make_node("Add", ["x", "nowhere"], ["y"])], [x], [y]), path)
    made["dangling input"] = path
    return made


# --- fuzzed workflows ----------------------------------------------------------------------

NASTY: list[Any] = [None, True, 0, -1, 2**31, 2**64, 10**40, 1e308, 0.5, "", "x", "../../escape", "/abs/path", "a" * 5000]
NASTY += ["nul\x00byte", "ünïcode", [], {}, [[[[[[]]]]]], {"a": {"b": {"c": {}}}}, ["a", "b"], [{"id": "x"}]]
SYNTAX = [*":{}[],&*!|>-#'\"\n\t ?%@`", "&a ", "*a", "<<: *a", "---\n", "\\u0000", ": :", "- -"]


def _containers(value: Any, found: list[Any]) -> list[Any]:
    if isinstance(value, dict):
        found.append(value)
        for item in value.values():
            _containers(item, found)
    elif isinstance(value, list):
        found.append(value)
        for item in value:
            _containers(item, found)
    return found


def mutate_structure(workflow: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Drop, retype, rename, add or nest keys; drop, retype or duplicate list items."""
    workflow = copy.deepcopy(workflow)
    for _ in range(rng.randint(1, 3)):
        target = rng.choice(_containers(workflow, []))
        if isinstance(target, dict) and target:
            key = rng.choice(list(target))
            action = rng.choice(["drop", "retype", "rename", "add", "nest"])
            if action == "drop":
                del target[key]
            elif action == "retype":
                target[key] = copy.deepcopy(rng.choice(NASTY))
            elif action == "rename":
                target[key + rng.choice(["s", "_", "x"])] = target.pop(key)
            elif action == "add":
                name = rng.choice(["id", "after", "source", "search", "config", "when", "pass", "values", "low", "evaluator"])
                target[name] = copy.deepcopy(rng.choice(NASTY))
            else:
                target[key] = {key: target[key]}
        elif isinstance(target, list) and target:
            index = rng.randrange(len(target))
            action = rng.choice(["drop", "retype", "duplicate"])
            if action == "drop":
                del target[index]
            elif action == "retype":
                target[index] = copy.deepcopy(rng.choice(NASTY))
            else:
                target.insert(index, copy.deepcopy(target[index]))
    return workflow


def mutate_text(text: str, rng: random.Random) -> str:
    """Cut, insert syntax characters, duplicate lines, truncate."""
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(text) + 1)
        action = rng.choice(["cut", "insert", "line", "truncate"])
        if action == "cut":
            text = text[:at] + text[at + rng.randint(1, 12) :]
        elif action == "insert":
            text = text[:at] + rng.choice(SYNTAX) + text[at:]
        elif action == "line":
            lines = text.splitlines(keepends=True)
            if lines:
                lines.insert(rng.randrange(len(lines)), lines[rng.randrange(len(lines))])
                text = "".join(lines)
        elif rng.random() < 0.3:
            text = text[:at]
    return text


def _dump(workflow: dict[str, Any]) -> str:
    return yaml.safe_dump(workflow, sort_keys=False, allow_unicode=True)


def _with_data_path(workflow: dict[str, Any], path: str) -> dict[str, Any]:
    workflow["data"]["held"] = {"source": "jsonl", "path": path, "feature_columns": ["x"], "input_name": "input_ids"}
    workflow["evaluate"][1]["config"]["data"] = "held"
    return workflow


def _loop_dir(folder: Path) -> str:
    loop = folder / "loopdir"
    loop.mkdir(exist_ok=True)
    os.symlink("..", loop / "up")
    os.symlink(".", loop / "self")
    return str(loop)


def _loop_link(folder: Path) -> str:
    os.symlink(str(folder / "b.onnx"), folder / "a.onnx")
    os.symlink(str(folder / "a.onnx"), folder / "b.onnx")
    return str(folder / "a.onnx")


def _fifo(folder: Path) -> str:
    os.mkfifo(folder / "fifo")
    return str(folder / "fifo")


def _empty_dir(folder: Path) -> str:
    (folder / "adir").mkdir(exist_ok=True)
    return str(folder / "adir")


def _input(path_of: Callable[[Path], str]) -> Callable[[dict[str, Any], Path], str]:
    def make(workflow: dict[str, Any], folder: Path) -> str:
        workflow["input"]["path"] = path_of(folder)
        return _dump(workflow)

    return make


def _data(path_of: Callable[[Path], str]) -> Callable[[dict[str, Any], Path], str]:
    def make(workflow: dict[str, Any], folder: Path) -> str:
        return _dump(_with_data_path(workflow, path_of(folder)))

    return make


def _edit(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any], Path], str]:
    def make(workflow: dict[str, Any], folder: Path) -> str:
        change(workflow)
        return _dump(workflow)

    return make


def _set_search(option: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda w: w["steps"][0]["search"].__setitem__(option, value)


def _set_session_search(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda w: w["targets"][0].__setitem__("search", {"intra_op_threads": value})


def _long_ids(w: dict[str, Any]) -> None:
    w["steps"][0]["id"] = "s" * 300
    w["targets"][0]["id"] = "t" * 300
    w["evaluate"][0]["id"] = "e" * 300


def _bom_json(workflow: dict[str, Any], folder: Path) -> str:
    return "\ufeff" + json.dumps(workflow, indent=1)


def _python_tag(workflow: dict[str, Any], folder: Path) -> str:
    marker = folder / "EXECUTED"
    return _dump(workflow).replace("name: tiny", f'name: !!python/object/apply:os.system ["touch {marker}"]', 1)


def _alias_bomb(workflow: dict[str, Any], folder: Path) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    text = _dump(workflow)
    return text.replace("name: tiny", "name: tiny\nx-bomb:\n" + "\n".join("  " + line for line in lines), 1)


def _deep_nesting(workflow: dict[str, Any], folder: Path) -> str:
    return _dump(workflow).replace("name: tiny", "name: tiny\nx-deep: " + "[" * 20000 + "]" * 20000, 1)


def _invalid_utf8(workflow: dict[str, Any], folder: Path) -> str:
    return _dump(workflow).replace("name: tiny", "name: tiny-\udcff\udcfe", 1)


def _duplicate_keys(workflow: dict[str, Any], folder: Path) -> str:
    return _dump(workflow).replace("name: tiny", "name: tiny\nname: other\nsteps: []", 1)


def _secret_token(workflow: dict[str, Any], folder: Path) -> str:
    workflow["input"]["token"] = SECRET
    workflow["data"]["rows"]["token"] = SECRET
    return _dump(workflow)


SECRET = "hf_AdversarialSecretToken0123456789abcdef"

#: hostile kind -> makes the file's text (and whatever files it names) in the case folder
HOSTILE: dict[str, Callable[[dict[str, Any], Path], str]] = {
    "input: symlink loop folder": _input(_loop_dir),
    "input: symlinks to each other": _input(_loop_link),
    "input: an empty folder": _input(_empty_dir),
    "input: a FIFO": _input(_fifo),
    "input: /dev/zero": _input(lambda folder: "/dev/zero"),
    "data path: a FIFO": _data(_fifo),
    "data path: /dev/zero": _data(lambda folder: "/dev/zero"),
    "data path: a folder": _data(_empty_dir),
    "data path: symlink loop folder": _data(_loop_dir),
    "range 1..10**12 step 1": _edit(_set_session_search({"low": 1, "high": 10**12, "step": 1})),
    "range on a bool option": _edit(_set_search("per_channel", {"low": 0, "high": 1, "step": 1})),
    "1000 duplicate values": _edit(_set_search("per_channel", [False] * 1000)),
    "inverted range low 10 high 1": _edit(_set_session_search({"low": 10, "high": 1})),
    "inverted bounds min 10 max 1": _edit(
        lambda w: w["select"]["constraints"].__setitem__(0, {"metric": "fidelity.cosine_mean", "min": 10, "max": 1})
    ),
    "version: true": _edit(lambda w: w.__setitem__("version", True)),
    "BOM-prefixed JSON": _bom_json,
    "300-char ids": _edit(_long_ids),
    "python tag (os.system)": _python_tag,
    "alias bomb (10**9 leaves)": _alias_bomb,
    "20000-deep nesting": _deep_nesting,
    "invalid UTF-8": _invalid_utf8,
    "duplicate keys": _duplicate_keys,
    "token in the file": _secret_token,
}


def richer_workflow(base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with two targets, an optional step, branches, a condition, TPE and an output folder."""
    richer = copy.deepcopy(base)
    richer["targets"].append({"id": "cpu2", "runtime": "onnxruntime", "graph_optimization_level": "basic"})
    richer["steps"] = [
        {"id": "simplify", "pass": "onnx_simplify", "optional": True},
        {
            "id": "int8",
            "pass": "ort_quantize",
            "after": "simplify",
            "targets": ["cpu"],
            "search": {
                "per_channel": [False, True],
                "mode": ["dynamic", "static"],
                "calibration": {"values": ["rows"], "when": {"mode": "static"}},
            },
        },
        {"id": "fp16", "pass": "fp16", "after": "simplify", "timeout_s": 60},
    ]
    richer["search"] = {"sampler": "tpe", "max_candidates": 4, "seed": 1}
    richer["output"] = {"dir": "out/fuzz", "keep": "pareto"}
    return richer


def make_case(index: int, seed: int, base: dict[str, Any], folder: Path) -> tuple[str, Path]:
    """The ``index``-th case: every other case a hostile kind (in turn), the others a random
    structural and/or textual mutation of ``base`` or of a richer workflow. Returns (kind, workflow file)."""
    rng = random.Random(seed * 100_003 + index)
    folder.mkdir(parents=True, exist_ok=True)
    workflow = copy.deepcopy(base if index % 2 == 0 or rng.random() < 0.5 else richer_workflow(base))
    if index % 2 == 0:
        kind = list(HOSTILE)[(index // 2) % len(HOSTILE)]
        text = HOSTILE[kind](workflow, folder)
        suffix = "json" if kind == "BOM-prefixed JSON" else "yaml"
    else:
        structural = rng.random() < 0.6
        if structural:
            workflow = mutate_structure(workflow, rng)
        as_json = rng.random() < 0.4
        text = json.dumps(workflow, indent=1, default=str) if as_json else _dump(workflow)
        textual = not structural or rng.random() < 0.5
        if textual:
            text = mutate_text(text, rng)
        kind = "mutation: " + "+".join(name for name, on in (("structure", structural), ("text", textual)) if on)
        suffix = "json" if as_json else "yaml"
    path = folder / f"workflow.{suffix}"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    return kind, path
