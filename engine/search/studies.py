"""Which optuna study a search continues: the study is named by what the search explores, not by
how long it may run.

A search's identity is the workflow with its budget taken out (``search.max_candidates``,
``max_time_s``, ``stop_when``, ``storage``) and its paths and output left out: raising the budget
of a finished search continues its study, so the sampler keeps what it learned, while a changed
space, sampler, seed, objective or constraint starts a new one. The identity is kept on the
study (a user attribute), so a new study can say what changed since the last one of the same
workflow and target.
"""

from __future__ import annotations

import json
from typing import Any

from engine.core.hashing import sha256_json

IDENTITY_ATTR = "kiln:identity"
#: the search settings that bound a search without changing what it explores
BUDGET = ("max_candidates", "max_time_s", "stop_when", "storage")
#: the search settings that change how a candidate is measured, not what is explored (a staged bar
#: decides as judging every row would)
MEASURING = ("staged",)


def identity(spec: Any) -> dict[str, Any]:
    """The part of a workflow spec (``WorkflowSpec``) that names its search."""
    data: dict[str, Any] = spec.model_dump(mode="json", exclude={"output", "cache", "description"})
    data["search"] = {k: v for k, v in (data.get("search") or {}).items() if k not in BUDGET + MEASURING}
    return data


def study_name(name: str, ident: dict[str, Any], target: str) -> str:
    """The study of workflow ``name``'s search of ``target`` (``ident``: its identity)."""
    return f"{name}-{sha256_json(ident)[:16]}/{target}"


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) and "id" in v for v in value):
        return _flatten({str(v["id"]): {k: x for k, x in v.items() if k != "id"} for v in value}, prefix)
    return {prefix: value}


def changes(old: dict[str, Any], new: dict[str, Any], limit: int = 4) -> list[str]:
    """What differs between two identities, as `key.path: old → new` lines (at most ``limit``)."""
    a, b = _flatten(old), _flatten(new)
    lines = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            lines.append(f"{key}: {_show(a.get(key, '<absent>'))} → {_show(b.get(key, '<absent>'))}")
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more"]
    return lines


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(storage: Any, name: str, target: str, study: str, ident: dict[str, Any], tried: int) -> str:
    """What opening ``study`` means: it continues (with how many points tried), or it is new, and
    then what changed since the latest study of the same workflow and target (``storage``: an
    optuna storage)."""
    if tried:
        return f"continues its study ({tried} point{'s' if tried != 1 else ''} tried before)"
    earlier = [
        s
        for s in storage.get_all_studies()
        if s.study_name != study and s.study_name.startswith(f"{name}-") and s.study_name.endswith(f"/{target}")
    ]
    if not earlier:
        return "a new study"
    latest = max(earlier)  # optuna orders studies by creation
    old = latest.user_attrs.get(IDENTITY_ATTR)
    if not isinstance(old, dict):
        return "a new study (the search differs from the last one of this workflow)"
    what = changes(old, ident)
    return "a new study, since the search changed: " + "; ".join(what) if what else "a new study"
