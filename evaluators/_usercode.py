"""Loading a function from a Python file a workflow names (a custom metric, a postprocess step).

This runs the user's code in the worker process, by design: the workflow's author wrote it. The
engine has already made the path absolute, checked it exists, and hashed its content into the
evaluation key (a ``FilePath`` option), so an edited file is measured again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.core.errors import EvaluationError


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
    sys.path.insert(0, folder)  # the file may import helper modules that sit beside it
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # any error in user code is reported, with where it happened
        raise EvaluationError(f"`{option}`: importing {path} failed: {describe_exception(error, path)}") from error
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    found = getattr(module, function, None)
    if not callable(found):
        defined = sorted(
            name for name, value in vars(module).items() if callable(value) and not name.startswith("_") and _defined_in(value, module_name)
        )
        what = "is not a function" if found is not None else "is not defined"
        raise EvaluationError(f"`{option}`: '{function}' {what} in {path}; functions the file defines: {', '.join(defined) or 'none'}")
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
