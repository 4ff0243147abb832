"""Run jobs as Ray tasks: the same worker command, on whichever node has the resources.

Each job is a Ray task that runs the job in a worker process on its node, so a crash stays in
that process exactly as it does locally. The worker is a warm one (engine.execute.pool) that the Ray
worker process keeps between tasks, so a node pays for Python and its libraries once per Ray
worker, not once per job (``KILN_POOL=0``: a fresh ``python -m engine.execute.worker JOB`` per job). The artifact store must be a path every node sees
(a shared file system mounted at the same place): workers read inputs from it and publish into
it. A target's ``resources`` (e.g. ``{GPU: 1}`` or a custom ``{intel_cpu: 1}``) are requested
for every job on that target, so its evaluations land on a node that has its device.
Without ``--workers``, as many jobs run at once as the cluster has CPUs (``default_workers``).
Ray is optional: it is imported only when this executor is used.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from engine.core.errors import MissingDependency
from engine.execute.executor import LocalExecutor, run_on_node
from engine.plan.jobs import WorkOrder
from engine.store.store import Store


class RayExecutor(LocalExecutor):
    """The ``Executor`` (engine.execute.protocol) of Ray tasks: ``run``, ``stop`` and ``close``
    are the local executor's around ``execute``, which sends the job to a node."""

    #: jobs run on the cluster's nodes, in their memory
    local = False
    #: a node runs several jobs at once, and the engine cannot tell which node a timing job lands on
    timing_holds_machine = True

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
        self._remote = ray.remote(run_on_node)
        self.resources: dict[str, dict[str, float]] = {}
        for target_id, entry in getattr(targets, "targets", {}).items():
            wanted = getattr(entry.instance.config, "resources", None)
            if wanted:
                self.resources[target_id] = dict(wanted)

    def default_workers(self) -> int:
        """How many jobs run at once when ``--workers`` is not given: the cluster's CPUs (each
        job asks for one unless its target's ``resources`` say otherwise), so the cluster is kept
        busy; timing evaluations still run alone (engine.execute.gate)."""
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def warm(self, count: int) -> None:
        """Nothing to start here: each Ray worker process starts its own warm worker with its first job."""

    def preload(self, libraries: list[str]) -> None:
        """Nothing to import ahead: a node's warm worker imports what its jobs need as they come."""

    def _options(self, job: WorkOrder) -> dict[str, Any]:
        target = job.target.config.get("id") if job.target else None
        wanted = dict(self.resources.get(target or "", {}))
        options: dict[str, Any] = {"num_cpus": wanted.pop("CPU", 1), "max_retries": 0}
        if "GPU" in wanted:
            options["num_gpus"] = wanted.pop("GPU")
        if wanted:
            options["resources"] = wanted
        return options

    def execute(self, job: WorkOrder, job_file: Path, log_path: Path, timeout_s: float | None, alone: bool = False) -> int | str:
        # ``alone`` is the gate's business here: the nodes' warm workers import only between their own jobs
        ref = self._remote.options(**self._options(job)).remote(
            job.python or self.python or sys.executable, str(job_file), str(log_path), timeout_s
        )
        try:
            return self.ray.get(ref)
        except BaseException:
            self.ray.cancel(ref, force=True)
            raise
