"""The workflow file: its schema, how it is read, and how it is checked and resolved."""

from __future__ import annotations

from engine.workflow.resolve import ResolvedWorkflow, default_store_dir, load_workflow, resolve
from engine.workflow.schema import Workflow
from engine.workflow.source import read_workflow

__all__ = ["ResolvedWorkflow", "Workflow", "default_store_dir", "load_workflow", "read_workflow", "resolve"]
