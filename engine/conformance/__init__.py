"""The plugin and executor contracts as checks anyone can run: Kiln's own tests run them over
every built-in plugin and both executors, and a plugin author runs the same checks over an
entry-point plugin with one import::

    # tests/test_kiln_contract.py of a plugin package
    from engine.conformance import conformance_tests

    globals().update(conformance_tests(only={"passes": ["my_pass"]}))

Plugins are reached only through the registry (by kind and name), never imported directly. Each
check raises ``AssertionError`` naming the plugin and what is wrong (plugin_checks):

- ``check_metadata``: a name equal to the registered one, a summary and a version;
- ``check_config_json``: an example config dumps to JSON that validates against the config's
  JSON schema and loads back to an equal config;
- ``check_unknown_keys``: an unknown key is rejected;
- ``check_search_space``: a pass's search space names its config's options, its distributions
  round-trip through JSON, and every value of its grid is accepted by the config;
- ``check_deterministic``: a pass run twice on the same tiny ONNX model writes the same bytes.

An example config is built from the config's JSON schema (required fields get the simplest value
their schema allows); a plugin whose required fields need more passes ``examples``.

An executor (engine.execute.protocol) is checked through a factory that makes one for a store,
``globals().update(executor_conformance_tests(lambda store: MyExecutor(store)))``, with real jobs
(a built-in pass on the tiny ONNX model) compared with the local executor's (executor_checks):

- ``check_executor_members``: every member of the protocol, ``default_workers`` None or a
  positive number, ``warm``/``preload`` taking what the engine gives, ``close`` twice;
- ``check_executor_runs_a_pass``: the local executor's record, filed in the store;
- ``check_executor_reports_a_failure``: a failing job is an ``Outcome`` that is not ok, not an
  exception, and leaves no record;
- ``check_executor_runs_jobs_at_once``: two jobs from two threads at once both succeed.

The tiny models they run on (models) serve plugin tests too.
"""

from __future__ import annotations

from engine.conformance.executor_checks import (
    EXECUTOR_CHECKS,
    EXECUTOR_PASS,
    ExecutorFactory,
    check_executor_members,
    check_executor_reports_a_failure,
    check_executor_runs_a_pass,
    check_executor_runs_jobs_at_once,
    executor_conformance_tests,
    pass_order,
)
from engine.conformance.models import tiny_encoder, tiny_onnx_model
from engine.conformance.plugin_checks import (
    MAX_POINTS,
    Example,
    check_config_json,
    check_deterministic,
    check_metadata,
    check_search_space,
    check_unknown_keys,
    conformance_tests,
    example_config,
    plugin_name,
    plugins,
)

__all__ = [
    "EXECUTOR_CHECKS",
    "EXECUTOR_PASS",
    "MAX_POINTS",
    "Example",
    "ExecutorFactory",
    "check_config_json",
    "check_deterministic",
    "check_executor_members",
    "check_executor_reports_a_failure",
    "check_executor_runs_a_pass",
    "check_executor_runs_jobs_at_once",
    "check_metadata",
    "check_search_space",
    "check_unknown_keys",
    "conformance_tests",
    "example_config",
    "executor_conformance_tests",
    "pass_order",
    "plugin_name",
    "plugins",
    "tiny_encoder",
    "tiny_onnx_model",
]
