"""The paths a target runs through the steps, and how many points its search space holds:
counted by arithmetic, so that a space of 10^12 points is sized (and refused or capped) at once."""

from __future__ import annotations

from typing import Any

from engine.core.search import SearchDim, grid_size
from engine.workflow.resolve.model import Step


def chains_for(steps: dict[str, Step], target: str) -> list[list[Step]]:
    """Every root-to-leaf path through the steps that run on ``target``."""
    applies = {sid: s for sid, s in steps.items() if s.targets is None or target in s.targets}
    children: dict[str | None, list[str]] = {}
    for sid, step in applies.items():
        children.setdefault(step.after, []).append(sid)
    chains: list[list[Step]] = []
    stack = list(reversed(children.get(None, [])))  # depth first, in file order, without recursion
    while stack:
        sid = stack.pop()
        kids = children.get(sid, [])
        if not kids:
            chain = [applies[sid]]
            while chain[-1].after is not None:
                chain.append(applies[chain[-1].after])
            chains.append(chain[::-1])
        stack.extend(reversed(kids))
    return chains


def space_size(chains: list[list[Step]], settings_dims: dict[str, SearchDim], settings_base: dict[str, Any]) -> int:
    """How many grid points a target's space holds: per path, the product of its steps' grid
    sizes (an optional step adds its skip), summed over paths, times the settings' grid size."""
    settings = grid_size(settings_dims, settings_base) if settings_dims else 1
    models = 0
    for chain in chains:
        count = 1
        for step in chain:
            count *= grid_size(step.search, step.config) + int(step.optional)
        models += count
    return models * settings
