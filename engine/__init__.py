"""Kiln: a declarative engine that turns a trained model into the fastest model meeting its bar."""

from __future__ import annotations

__version__ = "0.1.0"
