"""The full JSON Schema of a workflow: the file's shape plus every registered plugin's options."""

from __future__ import annotations

import json
from typing import Any

from engine.workflow.resolve.plugins import SECTIONS, config_model, loadable
from engine.workflow.schema import Workflow


def _hoist_defs(schema: dict[str, Any], prefix: str, defs: dict[str, Any]) -> dict[str, Any]:
    """Move a plugin schema's own ``$defs`` to the document's, renamed ``<prefix>.<name>`` so two
    plugins' definitions never collide, and point its references there."""
    own = schema.pop("$defs", {})
    text = json.dumps(schema)
    for name in own:
        text = text.replace(f'"#/$defs/{name}"', f'"#/$defs/{prefix}.{name}"')
    for name, definition in own.items():
        body = json.dumps(definition)
        for other in own:
            body = body.replace(f'"#/$defs/{other}"', f'"#/$defs/{prefix}.{other}"')
        defs[f"{prefix}.{name}"] = json.loads(body)
    return dict(json.loads(text))


def _plugin_branches(kind: str, defs: dict[str, Any]) -> list[dict[str, Any]]:
    """One ``if <key> is NAME then <its Config's schema>`` branch per plugin of ``kind``: the same
    table (``SECTIONS``) and models that validation checks a workflow's plugin options with."""
    section = SECTIONS[kind]
    branches = []
    for name, cls in loadable(kind).items():
        schema = _hoist_defs(config_model(cls).model_json_schema(), f"{kind}.{name}", defs)
        then = {"properties": {section.options_at: schema}} if section.options_at else schema
        branches.append({"if": {"properties": {section.key: {"const": name}}, "required": [section.key]}, "then": then})
    return branches


def full_schema() -> dict[str, Any]:
    schema = Workflow.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Kiln workflow (version 1)"
    defs = schema.setdefault("$defs", {})
    defs["StepSpec"]["allOf"] = _plugin_branches("passes", defs)
    defs["EvaluateSpec"]["allOf"] = _plugin_branches("evaluators", defs)
    targets = _plugin_branches("targets", defs)
    for branch in targets:  # `search:` is the workflow's, beside the runtime's own options
        branch["then"].setdefault("properties", {})["search"] = {
            "type": "object",
            "description": (
                "Session settings to search over, by option name (dotted for nested options: cuda.enable_cuda_graph): "
                "a list of values, or {low, high, log, step}, optionally with `when:`. A candidate is a model and its settings."
            ),
            "additionalProperties": {"anyOf": [{"type": "array", "minItems": 1}, {"$ref": "#/$defs/SearchOption"}]},
        }
    schema["properties"]["targets"]["items"] = {"type": "object", "required": ["id", "runtime"], "allOf": targets}
    schema["properties"]["data"]["additionalProperties"] = {
        "type": "object",
        "required": ["source"],
        "allOf": _plugin_branches("datasources", defs),
    }
    return schema
