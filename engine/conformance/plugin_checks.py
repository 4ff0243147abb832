"""The plugin checks: metadata, config JSON, unknown keys, search space, determinism (see the
package's docstring), and ``conformance_tests``, which makes pytest tests of them."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import registry
from engine.conformance.models import tiny_onnx_model
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
