"""Run jobs as Ray tasks: the same worker command, on whichever node has the resources.

Each job is a Ray task that runs the job in a worker process on its node, so a crash stays in
that process exactly as it does locally. The worker is a warm one (engine.execute.pool) that the Ray
worker process keeps between tasks, so a node pays for Python and its libraries once per Ray
worker, not once per job (``KILN_POOL=0``: a fresh ``python -m engine.execute.worker JOB`` per job). The artifact store must be a path every node sees
(a shared file system mounted at the same place): workers read inputs from it and publish into
it. A target's ``resources`` and ``placement.resources`` (e.g. ``{GPU: 1}`` or a custom
``{gpu_h100: 1}``) are requested for every job on that target, so its evaluations land on a node
that has its device; a target no node has is unavailable (engine.execute.nodes.place_targets).

The executor places every job on a node itself (engine.execute.nodes.NodeGate, the job then
pinned there by Ray's node affinity): a timing job gets a node with nothing else on it, asking
Ray for all its CPUs, while passes go on on the other nodes. A node that dies takes only the
jobs running on it: each is run again on another node (``NODE_RETRIES``), its half-written
staging folder emptied first; nothing reaches the store before a job has finished.
Without ``--workers``, as many jobs run at once as the cluster has CPUs (``default_workers``).
A job in an isolated environment runs in that environment as its node has it: found in the
node's own environments folder or built there first, keyed as the driver's (engine.execute.node_env).
Ray is optional: it is imported only when this executor is used.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from engine.core.errors import KilnError, MissingDependency
from engine.execute.executor import LocalExecutor, run_on_node
from engine.execute.node_env import node_python
from engine.execute.nodes import Node, NodeGate, NoNode, target_resources
from engine.execute.shared_store import check_shared_store
from engine.plan.jobs import WorkOrder, environment_json
from engine.store.store import Store

#: how many times a job whose node died is run again elsewhere
NODE_RETRIES = 2


def run_task(
    python: str, job_file: str, log_path: str, timeout_s: float | None, environment: dict[str, Any] | None = None, store_root: str = ""
) -> tuple[int | str, float, float, dict[str, Any] | None]:
    """The Ray task: ``run_on_node``'s outcome, when it began and ended on the node's clock, and
    the environment it ran in (``node_python``: found or built on this node; None: the engine's
    own). An environment that cannot be made ready here is the job's outcome, as a reason."""
    began = time.time()
    try:
        python, env = node_python(environment, python, store_root)
    except KilnError as error:
        Path(log_path).write_text(f"{error}\n", encoding="utf-8")
        return f"not run: {error}", began, time.time(), None
    code = run_on_node(python, job_file, log_path, timeout_s)
    return code, began, time.time(), env


class RayExecutor(LocalExecutor):
    """The ``Executor`` (engine.execute.protocol) of Ray tasks: ``run``, ``stop`` and ``close``
    are the local executor's around ``execute``, which sends the job to a node."""

    #: jobs run on the cluster's nodes, in their memory
    local = False
    #: a timing job holds its node, not the cluster: the executor gives it a node alone (``alone``)
    timing_holds_machine = False
    where = "the Ray cluster"

    def __init__(self, store: Store, address: str | None = None, targets: Any = None, python: str | None = None) -> None:
        super().__init__(store, python, pool=False)  # no pool here: each Ray worker keeps its own
        try:
            import ray
        except ImportError:
            raise MissingDependency("ray", "--executor ray", 'pip install "ray>=2.40"') from None
        self.ray = ray
        if not ray.is_initialized():
            # with no address, a local cluster for this run: a small object store is plenty, since
            # models travel through the shared artifact store, not through Ray
            local = {"object_store_memory": 128 * 2**20} if address is None else {}
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False, **local)
        self._remote = ray.remote(run_task)
        self.resources: dict[str, dict[str, float]] = {}
        for target_id, entry in getattr(targets, "targets", {}).items():
            wanted = target_resources(entry.instance.config)
            if wanted:
                self.resources[target_id] = wanted
        self.gate = NodeGate(self.nodes())
        check_shared_store(store.root, {node.host for node in self.gate.nodes.values()})

    def nodes(self) -> list[Node]:
        """The cluster's live nodes, as Ray lists them."""
        return [
            Node(id=n["NodeID"], host=n.get("NodeManagerHostname") or "", resources=dict(n.get("Resources") or {}))
            for n in self.ray.nodes()
            if n.get("Alive")
        ]

    def default_workers(self) -> int:
        """How many jobs run at once when ``--workers`` is not given: the cluster's CPUs (each
        job asks for one unless its target's ``resources`` say otherwise), so the cluster is kept
        busy; a timing job still has its node alone."""
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def warm(self, count: int) -> None:
        """Nothing to start here: each Ray worker process starts its own warm worker with its first job."""

    def preload(self, libraries: list[str]) -> None:
        """Nothing to import ahead: a node's warm worker imports what its jobs need as they come."""

    def _wanted(self, job: WorkOrder) -> dict[str, float]:
        target = job.target.config.get("id") if job.target else None
        return dict(self.resources.get(target or "", {}))

    def _options(self, job: WorkOrder, node: Node, alone: bool) -> dict[str, Any]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        wanted = self._wanted(job)
        cpus = wanted.pop("CPU", 1)
        options: dict[str, Any] = {
            "num_cpus": node.cpus if alone else min(cpus, node.cpus),  # a timing job asks Ray for the whole node
            "max_retries": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node.id, soft=False),
        }
        if "GPU" in wanted:
            options["num_gpus"] = wanted.pop("GPU")
        if wanted:
            options["resources"] = wanted
        return options

    def execute(self, job: WorkOrder, job_file: Path, log_path: Path, timeout_s: float | None, alone: bool = False) -> int | str:
        wanted = self._wanted(job)
        for attempt in range(NODE_RETRIES + 1):
            try:
                with self.gate.take(wanted, wanted.get("CPU", 1), alone) as node:
                    ran = self._on(node, job, job_file, log_path, timeout_s, alone)
            except NoNode as error:
                log_path.write_text(f"{error}\n", encoding="utf-8")
                return f"not run: {error}"
            if ran is not None:
                code, began, ended, env = ran
                self._where.node = {**node.record(), "began": round(began, 3), "ended": round(ended, 3)}
                if env is not None:
                    self._where.node["env"] = env
                if attempt:
                    self._where.node["attempts"] = attempt + 1
                return code
            _empty_staging(job_file)  # what the dead node left half-written; the store has none of it
        return f"its node died {NODE_RETRIES + 1} times"

    def _on(self, node: Node, job: WorkOrder, job_file: Path, log_path: Path, timeout_s: float | None, alone: bool) -> Any:
        """The task's (code, began, ended) on ``node``, or None when the node died under it."""
        ref = self._remote.options(**self._options(job, node, alone)).remote(
            job.python or self.python or sys.executable,
            str(job_file),
            str(log_path),
            timeout_s,
            environment_json(job.environment),
            str(self.store.root),
        )
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayError as error:
            if isinstance(error, self.ray.exceptions.RayTaskError) or self._alive(node.id):
                raise
            self.gate.lost(node.id)
            return None
        except BaseException:
            self.ray.cancel(ref, force=True)
            raise

    def _alive(self, node_id: str) -> bool:
        deadline = time.monotonic() + 30.0  # Ray notices a dead node after its heartbeats stop
        while time.monotonic() < deadline:
            if not any(n["NodeID"] == node_id and n.get("Alive") for n in self.ray.nodes()):
                return False
            time.sleep(1.0)
        return True


def _empty_staging(job_file: Path) -> None:
    for left in job_file.parent.iterdir():
        if left != job_file:
            shutil.rmtree(left, ignore_errors=True) if left.is_dir() else left.unlink(missing_ok=True)
