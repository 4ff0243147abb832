"""Loading a function from a Python file a workflow names (a custom metric, a postprocess step, a
custom data source).

This runs the user's code in the worker process, by design: the workflow's author wrote it. The
engine has already made the path absolute, checked it exists, and hashed its content into the
evaluation key (a ``FilePath`` option), so an edited file is measured again.

Files written for Microsoft Olive load unmodified: they import ``olive.data.registry`` only to name
their data functions with its decorators (``@Registry.register_dataset()``, ``register_pre_process``,
``register_post_process``, ``register_dataloader`` and the ``register_default_*`` ones). olive-ai is
not a dependency of Kiln and is never imported for this: when it is not importable, a stand-in
``olive`` / ``olive.data`` / ``olive.data.registry`` is put in ``sys.modules`` for the time the file
is loaded, and only the decorator names are provided. Each records the function under the name
Olive would give it (the name passed, else the function's own; case-insensitive, as Olive's) and
returns it unchanged; a function is then found by its attribute name or by that registered name.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.core.errors import EvaluationError

#: the stand-in's modules (the olive package and its data.registry)
OLIVE_MODULES = ("olive", "olive.data", "olive.data.registry")
#: the names Olive's register_default_* decorators give
OLIVE_DEFAULT_NAMES = {
    "load_dataset": "default_load_dataset",
    "pre_process_data": "default_pre_process_data",
    "post_process_data": "default_post_process_data",
    "dataloader": "default_dataloader",
}
_STAND_IN_LOCK = threading.Lock()


def _registry_stand_in(records: dict[str, Any]) -> type:
    """A class with the decorator names of Olive's ``olive.data.registry.Registry`` that records each
    decorated function in ``records`` (lower-cased name → function) and returns it unchanged."""

    def register(component: str) -> Callable[..., Callable[[Any], Any]]:
        def with_name(name: str | None = None) -> Callable[[Any], Any]:
            def record(function: Any) -> Any:
                records[(name or function.__name__).lower()] = function
                return function

            return record

        return with_name

    def default(component: str) -> Callable[[], Callable[[Any], Any]]:
        return lambda: register(component)(OLIVE_DEFAULT_NAMES[component])

    def lookup(_cls: Any, *names: Any) -> Any:
        return records[str(names[-1]).lower()]

    members: dict[str, Any] = {
        "__doc__": "Kiln's stand-in for olive.data.registry.Registry: its decorators record functions by name (olive-ai is not installed).",
        "register_dataset": staticmethod(register("load_dataset")),
        "register_pre_process": staticmethod(register("pre_process_data")),
        "register_post_process": staticmethod(register("post_process_data")),
        "register_dataloader": staticmethod(register("dataloader")),
        "register": staticmethod(lambda sub_type=None, name=None: register(str(sub_type))(name)),
        "get": classmethod(lookup),
        "get_component": classmethod(lookup),
    }
    for component, short in (("load_dataset", "dataset"), ("pre_process_data", "pre_process"), ("post_process_data", "post_process")):
        members[f"register_default_{short}"] = staticmethod(default(component))
    members["register_default_dataloader"] = staticmethod(default("dataloader"))
    for short in ("load_dataset", "pre_process", "post_process", "dataloader"):
        members[f"get_{short}_component"] = classmethod(lookup)
    return type("Registry", (), members)


def _olive_importable() -> bool:
    try:
        return importlib.util.find_spec("olive") is not None
    except (ImportError, ValueError):
        return False


@contextmanager
def olive_registry(records: dict[str, Any]) -> Iterator[None]:
    """While loading a user file: ``from olive.data.registry import Registry`` gives the stand-in
    (only when olive-ai itself is not importable); sys.modules is as it was afterwards."""
    if _olive_importable():
        yield
        return
    with _STAND_IN_LOCK:
        saved = {name: sys.modules.get(name) for name in OLIVE_MODULES}
        olive, data, registry = (types.ModuleType(name) for name in OLIVE_MODULES)
        for module in (olive, data):
            module.__path__ = []  # a package, so that its submodules import
        registry.Registry = _registry_stand_in(records)  # type: ignore[attr-defined]
        olive.data, data.registry = data, registry  # type: ignore[attr-defined]
        sys.modules.update(zip(OLIVE_MODULES, (olive, data, registry), strict=True))
        try:
            yield
        finally:
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module


def load_function(file: str, function: str, option: str) -> Callable[..., Any]:
    """``function`` defined in ``file``; every failure is an EvaluationError naming the file."""
    path = Path(file)
    if not path.is_file():
        raise EvaluationError(f"the file named by `{option}` does not exist: {path}")
    # a module name of its own per file, so two files with the same name never share one
    module_name = "kiln_user_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise EvaluationError(f"`{option}`: {path} cannot be imported as Python (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    registered: dict[str, Any] = {}
    sys.path.insert(0, folder)  # the file may import helper modules that sit beside it
    try:
        with olive_registry(registered):
            spec.loader.exec_module(module)
    except Exception as error:  # any error in user code is reported, with where it happened
        hint = ""
        if isinstance(error, ImportError) and (error.name or "").startswith("olive"):
            hint = " (olive-ai is not installed: Kiln provides only olive.data.registry's Registry decorators)"
        raise EvaluationError(f"`{option}`: importing {path} failed: {describe_exception(error, path)}{hint}") from error
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    found = getattr(module, function, None)
    if found is None:  # a name given by Olive's registry decorators (case-insensitive, as Olive's)
        found = registered.get(function.lower())
    if not callable(found):
        defined = sorted(
            name for name, value in vars(module).items() if callable(value) and not name.startswith("_") and _defined_in(value, module_name)
        )
        what = "is not a function" if found is not None else "is not defined"
        names = f"; names its registry decorators gave: {', '.join(sorted(registered))}" if registered else ""
        raise EvaluationError(
            f"`{option}`: '{function}' {what} in {path}; functions the file defines: {', '.join(defined) or 'none'}{names}"
        )
    return found  # type: ignore[no-any-return]


def _defined_in(value: Any, module_name: str) -> bool:
    return getattr(value, "__module__", None) == module_name or not (inspect.isfunction(value) or inspect.isclass(value))


def describe_exception(error: BaseException, path: Path) -> str:
    """``TypeError: message (at file.py:12 in f)``: where in the user's file it was raised."""
    text = f"{type(error).__name__}: {error}"
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if Path(frame.filename) == path]
    if isinstance(error, SyntaxError) and error.lineno is not None:
        return f"{text} (at {path.name}:{error.lineno})"
    if frames:
        frame = frames[-1]
        return f"{text} (at {path.name}:{frame.lineno} in {frame.name})"
    return text
