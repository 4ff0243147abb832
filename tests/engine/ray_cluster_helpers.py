"""A Ray cluster of two nodes on this machine for tests: node_a (the head) and node_b, one CPU each,
each with its own custom resource; the test plugins reach the nodes' workers through their
environment. ``node_b_env`` gives node_b's raylet (and so every worker on it) its own variables,
as a second host started with them would have."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import registry

HERE = Path(__file__).parent
PLUGINS = "passes:sleep=kiln_test_plugins:Sleep"
SMALL = {"object_store_memory": 80 * 2**20}


@contextlib.contextmanager
def two_node_cluster(env: dict[str, str] | None = None, node_b_env: dict[str, str] | None = None) -> Iterator[Any]:
    """The cluster, connected with ``ray.init``; ``env``: variables set for the driver and the head node."""
    import ray
    from ray import cluster_utils

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        patch.setenv("KILN_PLUGINS", PLUGINS)
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        patch.syspath_prepend(str(HERE))
        registry._index.cache_clear()
        registry.load.cache_clear()
        two = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}, **SMALL})
        try:
            extra = {"env_vars": node_b_env} if node_b_env else {}
            two.add_node(num_cpus=1, resources={"node_b": 1}, **extra, **SMALL)
            ray.init(address=two.address, include_dashboard=False, log_to_driver=False)
            two.wait_for_nodes()
            yield two
        finally:
            ray.shutdown()
            two.shutdown()
    registry._index.cache_clear()
    registry.load.cache_clear()
