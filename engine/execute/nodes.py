"""Nodes: where jobs run, what each node has, and timing that holds its node alone.

A cluster executor (engine.execute.ray_executor) places each job on a node itself, through a
``NodeGate``: a pass takes a CPU on any node that has what its target asks for, a timing job
(latency, throughput) waits until one such node runs nothing else and then has it to itself,
while the other nodes go on running passes. A waiting timing job reserves one node (the least
busy), which takes no new job until the measurement has run, so a stream of passes cannot
starve it. The local executor is one node: this machine (``host_node``).

A target's ``placement.resources`` (and its older ``resources``) name what a node must have;
a target that no node has is unavailable, with that reason (``place_targets``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.errors import InputError, Problem
from engine.core.target import Availability

#: a node's resources that are capacities, not labels
CAPACITIES = ("CPU", "GPU", "memory", "object_store_memory")


@dataclass
class Node:
    """One node: its id, host name, resources (Ray's totals: CPU, GPU, custom ones) and, while
    the gate runs, its load."""

    id: str
    host: str
    resources: dict[str, float]
    alive: bool = True
    used: float = 0.0  # CPUs taken by the jobs running on it
    exclusive: bool = False  # a timing job holds it
    reserved: int = 0  # timing jobs waiting for it to empty
    jobs: int = field(default=0)

    @property
    def cpus(self) -> float:
        return max(1.0, self.resources.get("CPU", 1.0))

    @property
    def label(self) -> str:
        """The node's custom resources, by which people name it (``node_a``, ``gpu_h100``), else its host."""
        names = sorted(n for n in self.resources if n not in CAPACITIES and not n.startswith(("node:", "accelerator_type:")))
        return ",".join(names) or self.host

    def has(self, wanted: dict[str, float]) -> bool:
        return all(self.resources.get(name, 0.0) >= amount for name, amount in wanted.items())

    def record(self) -> dict[str, Any]:
        """What events.jsonl and candidates.json say of the node a job ran on."""
        return {"id": self.id, "label": self.label, "host": self.host}


def host_resources() -> dict[str, float]:
    """This machine as a node: its CPUs, its NVIDIA GPUs (device files) and the custom resources
    ``$KILN_NODE_RESOURCES`` declares (a JSON object, e.g. {"gpu_h100": 1})."""
    resources: dict[str, float] = {"CPU": float(os.cpu_count() or 1)}
    gpus = [p for p in Path("/dev").glob("nvidia[0-9]*")]
    if gpus:
        resources["GPU"] = float(len(gpus))
    declared = os.environ.get("KILN_NODE_RESOURCES")
    if declared:
        try:
            extra = json.loads(declared)
        except ValueError:
            extra = None
        if not isinstance(extra, dict) or not all(isinstance(v, int | float) and v > 0 for v in extra.values()):
            problem = Problem(
                where="$KILN_NODE_RESOURCES",
                message="cannot be read as this machine's resources",
                expected="a JSON object of resource names to amounts above 0",
                given=declared,
                hint="e.g. KILN_NODE_RESOURCES='{\"gpu_h100\": 1}'",
            )
            raise InputError([problem])
        resources.update({str(k): float(v) for k, v in extra.items()})
    return resources


def host_node() -> Node:
    host = socket.gethostname()
    return Node(id=host, host=host, resources=host_resources())


def target_resources(config: Any) -> dict[str, float]:
    """What a target's jobs ask of their node: its ``resources`` and ``placement.resources``."""
    wanted = dict(getattr(config, "resources", None) or {})
    placement = getattr(config, "placement", None)
    if placement is not None:
        wanted.update(placement.resources)
    return wanted


def place_targets(resolved: Any, nodes: list[Node], where: str) -> None:
    """Mark unavailable each target whose ``placement`` no node of ``nodes`` has (``where``: the
    cluster or this machine, for the reason)."""
    for entry in resolved.targets.values():
        placement = getattr(entry.instance.config, "placement", None)
        if placement is None or not entry.availability.ok:
            continue
        if not any(node.alive and node.has(placement.resources) for node in nodes):
            wanted = ", ".join(f"{name}: {amount:g}" for name, amount in placement.resources.items())
            entry.availability = Availability(False, f"no node of {where} has the resources its placement asks for ({wanted})")


class NoNode(Exception):
    """No live node has what a job asks for."""


class NodeGate:
    """Hands out nodes to jobs: shared ones take ``cpus`` of a node that has room, a timing job
    (``alone``) a node with nothing else on it. Thread-safe; ``lost`` takes a dead node out."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = {node.id: node for node in nodes}
        self._cond = threading.Condition()

    def _eligible(self, wanted: dict[str, float]) -> list[Node]:
        fits = [n for n in self.nodes.values() if n.alive and n.has(wanted)]
        if not fits:
            asked = ", ".join(f"{k}: {v:g}" for k, v in wanted.items()) or "a CPU"
            raise NoNode(f"no live node of the cluster has what this job asks for ({asked})")
        return fits

    def _free(self, wanted: dict[str, float], cpus: float) -> Node | None:
        free = [n for n in self._eligible(wanted) if not n.exclusive and not n.reserved and n.used + min(cpus, n.cpus) <= n.cpus]
        return min(free, key=lambda n: (n.used / n.cpus, n.jobs)) if free else None

    def _idle(self, wanted: dict[str, float], mine: Node | None) -> Node | None:
        idle = [n for n in self._eligible(wanted) if not n.exclusive and n.used == 0 and (n is mine or not n.reserved)]
        return idle[0] if idle else None

    @contextmanager
    def take(self, wanted: dict[str, float], cpus: float = 1.0, alone: bool = False) -> Iterator[Node]:
        """A node for one job, held while it runs (raises NoNode when none could ever hold it)."""
        node = self._take_alone(wanted) if alone else self._take_shared(wanted, cpus)
        taken = node.cpus if alone else min(cpus, node.cpus)
        try:
            yield node
        finally:
            with self._cond:
                node.used -= taken
                node.exclusive = node.exclusive and not alone
                self._cond.notify_all()

    def _take_shared(self, wanted: dict[str, float], cpus: float) -> Node:
        with self._cond:
            node: Node | None = None
            while node is None:
                node = self._free(wanted, cpus)
                if node is None:
                    self._cond.wait(0.5)
            node.used += min(cpus, node.cpus)
            node.jobs += 1
            return node

    def _take_alone(self, wanted: dict[str, float]) -> Node:
        with self._cond:
            mine: Node | None = None
            node = self._idle(wanted, None)
            while node is None:
                if mine is None or not mine.alive:  # reserve the least busy one: it takes no new job meanwhile
                    if mine is not None:
                        mine.reserved -= 1
                    mine = min((n for n in self._eligible(wanted) if not n.exclusive), key=lambda n: n.used, default=None)
                    if mine is not None:
                        mine.reserved += 1
                self._cond.wait(0.5)
                node = self._idle(wanted, mine)
            if mine is not None:
                mine.reserved -= 1
            node.exclusive, node.used = True, node.cpus
            node.jobs += 1
            return node

    def lost(self, node_id: str) -> None:
        """The node died: no job goes there any more."""
        with self._cond:
            if node_id in self.nodes:
                self.nodes[node_id].alive = False
            self._cond.notify_all()
