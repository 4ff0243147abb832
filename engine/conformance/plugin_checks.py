"""The plugin contract as checks anyone can run: Kiln's own tests run them over every built-in
plugin, and a plugin author runs the same checks over an entry-point plugin with one import::

    # tests/test_kiln_contract.py of a plugin package
    from engine.conformance import conformance_tests

    globals().update(conformance_tests(only={"passes": ["my_pass"]}))

Plugins are reached only through the registry (by kind and name), never imported directly. Each
check raises ``AssertionError`` naming the plugin and what is wrong:

- ``check_metadata``: a name equal to the registered one, a summary and a version;
- ``check_config_json``: an example config dumps to JSON that validates against the config's
  JSON schema and loads back to an equal config;
- ``check_unknown_keys``: an unknown key is rejected;
- ``check_search_space``: a pass's search space names its config's options, its distributions
  round-trip through JSON, and every value of its grid is accepted by the config;
- ``check_deterministic``: a pass run twice on the same tiny ONNX model writes the same bytes.

An example config is built from the config's JSON schema (required fields get the simplest value
their schema allows); a plugin whose required fields need more passes ``examples``.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import registry
from engine.core.search import distribution_from_json

Example = dict[str, Any]
#: at most this many grid values of one searched option are checked
MAX_POINTS = 512
_UNKNOWN_KEY = "kiln_conformance_unknown_key"


def plugins(only: dict[str, list[str]] | None = None) -> list[tuple[str, str]]:
    """(kind, name) of every registered plugin, or of those ``only`` names, by kind."""
    return [(kind, name) for kind in registry.KINDS for name in registry.names(kind) if only is None or name in only.get(kind, ())]


def plugin_name(cls: Any, kind: str) -> str:
    return str(cls.runtime if kind == "targets" else cls.name)


# -- example configs ------------------------------------------------------------------------------
def _simplest(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    if "$ref" in schema:
        return _simplest(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "default" in schema:
        return schema["default"]
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        branches = [b for b in schema.get(key, ()) if b.get("type") != "null"]
        if branches:
            return _simplest(branches[0], defs)
    kind = schema.get("type")
    if kind == "object":
        required = schema.get("required", [])
        return {name: _simplest(schema["properties"][name], defs) for name in required}
    if kind == "array":
        return [_simplest(schema.get("items", {}), defs) for _ in range(int(schema.get("minItems", 0)))]
    if kind == "integer":
        return int(schema.get("minimum", schema.get("exclusiveMinimum", 0) + 1))
    if kind == "number":
        return float(schema.get("minimum", 1.0))
    if kind == "boolean":
        return False
    return "x"


def example_config(cls: Any, example: Example | None = None) -> Any:
    """A valid config of plugin class ``cls``: ``example`` if given, else one built from the schema."""
    if example is not None:
        return cls.Config.model_validate(example)
    schema = cls.Config.model_json_schema()
    return cls.Config.model_validate(_simplest(schema, schema.get("$defs", {})))


# -- the checks -----------------------------------------------------------------------------------
def check_metadata(kind: str, name: str) -> None:
    cls = registry.load(kind, name)
    assert plugin_name(cls, kind) == name, f"{kind} '{name}' is registered as '{name}' but names itself '{plugin_name(cls, kind)}'"
    for attribute in ("summary", "version"):
        value = getattr(cls, attribute, None)
        assert isinstance(value, str) and value.strip(), f"{kind} '{name}' has no {attribute}"
    describe = getattr(cls, "describe", None)
    described = describe() if describe is not None else {}
    assert json.loads(json.dumps(described)) == described, f"{kind} '{name}': describe() is not plain JSON"


def check_config_json(kind: str, name: str, example: Example | None = None) -> None:
    import jsonschema

    cls = registry.load(kind, name)
    config = example_config(cls, example)
    dumped = json.loads(json.dumps(config.to_json()))
    jsonschema.validate(dumped, cls.Config.model_json_schema())
    again = cls.Config.model_validate(dumped)
    assert again == config, f"{kind} '{name}': the config does not load back from its JSON ({dumped})"
    assert again.to_json() == dumped, f"{kind} '{name}': the config's JSON changes on a round trip"


def check_unknown_keys(kind: str, name: str, example: Example | None = None) -> None:
    from pydantic import ValidationError

    cls = registry.load(kind, name)
    given = {**example_config(cls, example).to_json(), _UNKNOWN_KEY: 1}
    try:
        cls.Config.model_validate(given)
    except ValidationError as error:
        assert _UNKNOWN_KEY in str(error), f"{kind} '{name}': the error for an unknown key does not name it: {error}"
    else:
        raise AssertionError(f"{kind} '{name}' accepts the unknown config key '{_UNKNOWN_KEY}'")


def check_search_space(kind: str, name: str, example: Example | None = None) -> None:
    cls = registry.load(kind, name)
    space = getattr(cls, "search_space", {}) or {}
    fields = cls.Config.model_fields
    for option, distribution in space.items():
        assert option in fields, f"{kind} '{name}' searches '{option}', which its config does not have"
        assert distribution_from_json(distribution.to_json()) == distribution, f"{kind} '{name}': '{option}' does not round-trip"
        assert distribution.grid(), f"{kind} '{name}': '{option}' has an empty grid"
    if not space:
        return
    base = example_config(cls, example).to_json()
    for option, distribution in space.items():  # each option on its own: a workflow searches some of them
        for value in distribution.grid()[:MAX_POINTS]:
            try:
                cls.Config.model_validate({**base, option: value})
            except Exception as error:
                raise AssertionError(f"{kind} '{name}': the config rejects {option}={value!r} of its search space: {error}") from error


def tiny_onnx_model(folder: Path) -> Path:
    """A small float model (MatMul with a 64x64 weight, Add, Relu) saved as ``folder/model.onnx``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "weight")
    bias = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "bias")
    nodes = [
        helper.make_node("MatMul", ["x", "weight"], ["h"], name="matmul"),
        helper.make_node("Add", ["h", "bias"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [weight, bias],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, str(folder / "model.onnx"))
    return folder / "model.onnx"


def tiny_encoder(hidden: int = 32, vocab: int = 1000, seed: int = 0) -> Any:
    """A tiny text encoder as an ``onnx.ModelProto`` (checked, not saved): input_ids,
    attention_mask [batch, sequence] -> Gather(embeddings) -> MatMul -> Add -> Relu -> MatMul ->
    last_hidden_state [batch, sequence, hidden], masked positions zeroed. Plugin tests run on it."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "embeddings"),
        numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32) * 0.1, "b1"),
        numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "last_axis"),
    ]
    nodes = [
        helper.make_node("Gather", ["embeddings", "input_ids"], ["embedded"]),
        helper.make_node("MatMul", ["embedded", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("MatMul", ["h3", "w2"], ["h4"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last_axis"], ["mask_3d"]),
        helper.make_node("Mul", ["h4", "mask_3d"], ["last_hidden_state"]),
    ]
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"]) for name in ("input_ids", "attention_mask")]
    output = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden])
    graph = helper.make_graph(nodes, "tiny_encoder", inputs, [output], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-tests")
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def _tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def check_deterministic(name: str, example: Example | None = None) -> None:
    """Run pass ``name`` twice on the tiny ONNX model; the two outputs must be the same bytes."""
    from engine.core.artifact import ModelArtifact
    from engine.core.passes import PassContext

    cls = registry.load("passes", name)
    assert "onnx" in cls.accepts, f"pass '{name}' does not accept ONNX models; give it its own determinism test"
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        tiny_onnx_model(root / "input")
        model = ModelArtifact.from_folder("onnx", root / "input")
        digests = []
        for attempt in ("first", "second"):
            ctx = PassContext(step_id="conformance", workdir=root / attempt / "work", output_dir=root / attempt / "out")
            ctx.workdir.mkdir(parents=True)
            ctx.output_dir.mkdir(parents=True)
            cls(example_config(cls, example))(model, ctx)
            digests.append(_tree_digest(ctx.output_dir))
        assert digests[0] == digests[1], f"pass '{name}' wrote different bytes in two runs on the same model"


# -- one import for a test module -----------------------------------------------------------------
def conformance_tests(
    only: dict[str, list[str]] | None = None,
    examples: dict[str, Example] | None = None,
    deterministic: dict[str, Example | None] | None = None,
) -> dict[str, Callable[..., None]]:
    """pytest test functions running every check over the plugins ``only`` names (default: all
    registered). ``examples`` maps "kind:name" to an example config for plugins whose required
    options the schema cannot fill; ``deterministic`` maps the passes to run twice on a tiny
    ONNX model to their config there (None: the example config). Put the result in a test
    module's globals."""
    import pytest

    examples = examples or {}
    chosen = plugins(only)
    ids = [f"{kind}:{name}" for kind, name in chosen]

    @pytest.mark.parametrize(("kind", "name"), chosen, ids=ids)
    def test_metadata(kind: str, name: str) -> None:
        check_metadata(kind, name)

    @pytest.mark.parametrize(("kind", "name"), chosen, ids=ids)
    def test_config_json(kind: str, name: str) -> None:
        check_config_json(kind, name, examples.get(f"{kind}:{name}"))

    @pytest.mark.parametrize(("kind", "name"), chosen, ids=ids)
    def test_unknown_keys(kind: str, name: str) -> None:
        check_unknown_keys(kind, name, examples.get(f"{kind}:{name}"))

    @pytest.mark.parametrize(("kind", "name"), chosen, ids=ids)
    def test_search_space(kind: str, name: str) -> None:
        check_search_space(kind, name, examples.get(f"{kind}:{name}"))

    runs = dict(deterministic or {})

    @pytest.mark.parametrize("name", list(runs), ids=list(runs))
    def test_deterministic(name: str) -> None:
        check_deterministic(name, runs[name] if runs[name] is not None else examples.get(f"passes:{name}"))

    return {
        "test_metadata": test_metadata,
        "test_config_json": test_config_json,
        "test_unknown_keys": test_unknown_keys,
        "test_search_space": test_search_space,
        "test_deterministic": test_deterministic,
    }
