"""Isolated environments on the node a job runs on: found there, or built there, keyed alike.

The driver builds every environment a workflow declares before the run
(engine.execute.environments.prepare: it checks its targets inside them and names their frozen
package lists in the keys), and each job carries the one it runs in (``WorkOrder.environment``:
its requirements, key, the driver's interpreter path, and the hash and versions of the driver's
frozen package list). On a cluster the driver's path need not exist on the node that runs the job
(``KILN_ENVS_DIR`` set per host, a store whose ``envs`` folder is not shared), so the node, before
its worker starts, takes (``node_environment``):

1. the driver's interpreter, when that path exists here and its folder's marker is valid for the
   same key (a shared environments folder): used as is, nothing built;
2. else the environment in the node's own folder (``envs_dir(store)`` as the node sees it: its
   ``$KILN_ENVS_DIR``, else ``<store>/envs``), when its marker is valid;
3. else the node builds it there with the same ``ensure`` (same key, lock and marker), pinned to
   the versions the driver's build froze to, so both builds freeze alike.

The environment a job runs in must have frozen to the driver's package list (the same hash), or
the job is refused with the differences named (``check_packages``): a step's key names the
driver's package hash (``key_doc.environment.packages``) and a target's fingerprint does too
(``fingerprint.environment.packages``, part of every evaluation's key and every target-dependent
pass's), so a job run with other packages would publish its result under a key that says
something untrue, and every later run would take that result from the store as if it had been
made with the driver's packages. Running it and recording the difference would keep the run going
but leave the cache lying; refusing keeps the keys truthful and the fix is plain (build the
environment alike, or share the environments folder).
"""

from __future__ import annotations

import socket
import sys
import sysconfig
from pathlib import Path
from typing import Any

from engine.core.config import EnvironmentSpec
from engine.core.errors import KilnError
from engine.execute.environments import ensure, envs_dir, existing
from engine.plan.jobs import environment_from_json
from engine.workflow.resolve.model import BuiltEnvironment


class _Heard:
    """Hooks for ``ensure`` that only note whether it built anything."""

    def __init__(self) -> None:
        self.built = False

    def environment_started(self, key: str, requirements: list[str]) -> None:
        self.built = True

    def environment_done(self, key: str, seconds: float) -> None:
        """Nothing more to note."""


def package_differences(driver: dict[str, str], node: dict[str, str]) -> list[str]:
    """How two frozen package lists (name: version) differ, one line per package, by name."""
    lines = []
    for name in sorted(set(driver) | set(node)):
        mine, theirs = driver.get(name), node.get(name)
        if mine == theirs:
            continue
        if theirs is None:
            lines.append(f"{name}: {mine} on the driver, absent here")
        elif mine is None:
            lines.append(f"{name}: absent on the driver, {theirs} here")
        else:
            lines.append(f"{name}: {mine} on the driver, {theirs} here")
    return lines


def check_packages(wanted: BuiltEnvironment, found: BuiltEnvironment) -> None:
    """Refuse an environment that froze to other packages than the driver's (the module's
    docstring says why): a KilnError naming each package that differs."""
    if found.packages == wanted.packages:
        return
    differences = package_differences(dict(wanted.versions), dict(found.versions))
    listed = "; ".join(differences) or "the frozen lists differ in lines that name no version (direct references)"
    raise KilnError(
        f"environment {wanted.key[:12]} ({', '.join(wanted.requirements)}) froze to other packages on "
        f"{socket.gethostname()} ({Path(found.python).parent.parent}) than on the driver: {listed}. The job's key names the "
        "driver's packages, so it is not run with these; rebuild the environment here alike (remove its folder: "
        "it is rebuilt pinned to the driver's versions) or share the environments folder ($KILN_ENVS_DIR)"
    )


def node_environment(wanted: BuiltEnvironment, store_root: Path) -> tuple[BuiltEnvironment, bool]:
    """The environment ``wanted`` (as the driver built it) on this node, and whether this node
    built it now: the driver's own folder when this node sees it, else the node's own, built
    there when missing. Raises KilnError when it cannot be the same environment here."""
    spec = EnvironmentSpec(requirements=list(wanted.requirements))
    if spec.key() != wanted.key:  # the key names Python major.minor and the platform tag
        here = f"Python {sys.version_info.major}.{sys.version_info.minor}, {sysconfig.get_platform()}"
        raise KilnError(
            f"environment {wanted.key[:12]} ({', '.join(wanted.requirements)}) was built for another Python or platform "
            f"than {socket.gethostname()}'s ({here}); here its key would be {spec.key()[:12]}"
        )
    driver_folder = Path(wanted.python).parent.parent  # <envs>/<key>/bin/python
    found = existing(spec, driver_folder.parent) if driver_folder.name == wanted.key else None
    if found is not None:  # this node sees the driver's folder, its marker valid for the key
        check_packages(wanted, found)
        return found, False
    heard = _Heard()
    found = ensure(spec, envs_dir(store_root), heard, pins=dict(wanted.versions))
    check_packages(wanted, found)
    return found, heard.built


def node_python(environment: dict[str, Any] | None, python: str, store_root: str) -> tuple[str, dict[str, Any] | None]:
    """The interpreter a job runs with on this node, and what its node record says of its
    environment (``{key, built, python}``; None for a job in the engine's own environment).
    ``environment``: the job's ``WorkOrder.environment`` as its job file carries it."""
    wanted = environment_from_json(environment)
    if wanted is None:
        return python, None
    found, built = node_environment(wanted, Path(store_root))
    return found.python, {"key": found.key, "built": built, "python": found.python}
