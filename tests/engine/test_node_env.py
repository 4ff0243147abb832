"""Isolated environments on the node a job runs on (engine.execute.node_env): the driver's folder
used when the node sees it, else the node's own, built there with the same key when missing, and
an environment that froze to other packages than the driver's refused, naming the differences.
Real builds with uv (PyPI), as tests/engine/test_environments.py does."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.core.config import EnvironmentSpec
from engine.core.errors import KilnError
from engine.execute.environments import MARKER, ensure
from engine.execute.node_env import node_environment, node_python, package_differences
from engine.plan.jobs import WorkOrder, environment_json

SIX = EnvironmentSpec(requirements=["six==1.16.0"])


def test_package_differences_name_each_package_that_differs():
    driver = {"six": "1.16.0", "attrs": "25.1.0", "idna": "3.10"}
    node = {"six": "1.17.0", "attrs": "25.1.0", "wheel": "0.45.1"}
    assert package_differences(driver, node) == [
        "idna: 3.10 on the driver, absent here",
        "six: 1.16.0 on the driver, 1.17.0 here",
        "wheel: absent on the driver, 0.45.1 here",
    ]


def test_a_work_order_carries_its_environment_through_the_job_file(envs_dir):
    built = ensure(SIX, envs_dir)
    order = WorkOrder(kind="eval", key="k", key_doc={}, plugin="size", config={}, python=built.python, environment=built)
    again = WorkOrder.from_json(json.loads(json.dumps(order.to_json())))
    assert again.environment == built and again.python == built.python
    assert WorkOrder.from_json(WorkOrder(kind="eval", key="k", key_doc={}, plugin="size", config={}).to_json()).environment is None


def test_the_driver_folder_is_used_when_the_node_sees_it(envs_dir, tmp_path, monkeypatch):
    driver = ensure(SIX, envs_dir)
    monkeypatch.setenv("KILN_ENVS_DIR", str(tmp_path / "node-envs"))
    found, built = node_environment(driver, tmp_path / "store")
    assert (found, built) == (driver, False)
    assert not (tmp_path / "node-envs").exists()  # nothing built in the node's own folder


def test_a_node_without_the_driver_folder_builds_it_in_its_own_once(envs_dir, tmp_path, monkeypatch):
    driver = ensure(SIX, envs_dir)
    elsewhere = replace(driver, python=str(tmp_path / "other-host" / SIX.key() / "bin" / "python"))  # a path this node lacks
    node_envs = tmp_path / "node-envs"
    monkeypatch.setenv("KILN_ENVS_DIR", str(node_envs))
    python, record = node_python(environment_json(elsewhere), elsewhere.python, str(tmp_path / "store"))
    assert record == {"key": SIX.key(), "built": True, "python": str(node_envs / SIX.key() / "bin" / "python")}
    assert python == record["python"] and Path(python).exists()
    marker = json.loads((node_envs / SIX.key() / MARKER).read_text())
    assert marker["key"] == driver.key and marker["requirements"] == ["six==1.16.0"]
    _, again = node_python(environment_json(elsewhere), elsewhere.python, str(tmp_path / "store"))
    assert again is not None and again["built"] is False  # the node's own copy now: nothing built
    # without $KILN_ENVS_DIR the node's folder is the store's
    monkeypatch.delenv("KILN_ENVS_DIR")
    found, built = node_environment(elsewhere, tmp_path / "store")
    assert built and found.python.startswith(str(tmp_path / "store" / "envs" / SIX.key()))


def test_an_environment_that_froze_to_other_packages_is_refused(envs_dir, tmp_path, monkeypatch):
    driver = ensure(SIX, envs_dir)
    # the driver's build, as if it had frozen to six 1.15.0 and another package beside it
    other = replace(driver, packages="0" * 64, versions=(("colorama", "0.4.6"), ("six", "1.15.0")))
    with pytest.raises(KilnError) as caught:
        node_environment(other, tmp_path / "store")
    text = str(caught.value)
    assert "froze to other packages" in text and SIX.key()[:12] in text
    assert "six: 1.15.0 on the driver, 1.16.0 here" in text and "colorama: 0.4.6 on the driver, absent here" in text


def test_an_environment_keyed_for_another_python_is_refused(envs_dir, tmp_path):
    driver = ensure(SIX, envs_dir)
    other = replace(driver, key=SIX.key(python="3.99"))
    with pytest.raises(KilnError, match="another Python or platform"):
        node_environment(other, tmp_path / "store")
