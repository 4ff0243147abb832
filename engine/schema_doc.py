"""The full JSON Schema of a workflow: the file's shape plus every registered plugin's options."""

from __future__ import annotations

import json
import logging
from typing import Any

from engine import registry
from engine.core.errors import KilnError
from engine.workflow.schema import Workflow

log = logging.getLogger(__name__)


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


def _plugin_branches(kind: str, key: str, where: str, defs: dict[str, Any]) -> list[dict[str, Any]]:
    branches = []
    for name in registry.names(kind):
        try:
            cls = registry.load(kind, name)
        except KilnError as error:  # a broken or uninstalled plugin must not take the schema down
            log.warning("%s", error)
            continue
        schema = _hoist_defs(cls.Config.model_json_schema(), f"{kind}.{name}", defs)
        if where:
            then = {"properties": {where: schema}}
        else:
            then = schema
        branches.append({"if": {"properties": {key: {"const": name}}, "required": [key]}, "then": then})
    return branches


def full_schema() -> dict[str, Any]:
    schema = Workflow.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Kiln workflow (version 1)"
    defs = schema.setdefault("$defs", {})
    defs["StepSpec"]["allOf"] = _plugin_branches("passes", "pass", "config", defs)
    defs["EvaluateSpec"]["allOf"] = _plugin_branches("evaluators", "evaluator", "config", defs)
    schema["properties"]["targets"]["items"] = {
        "type": "object",
        "required": ["id", "runtime"],
        "allOf": _plugin_branches("targets", "runtime", "", defs),
    }
    schema["properties"]["data"]["additionalProperties"] = {
        "type": "object",
        "required": ["source"],
        "allOf": _plugin_branches("datasources", "source", "", defs),
    }
    return schema
