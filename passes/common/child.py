"""A step of a pass run in a child process, for a model past 2 GB.

A library step that holds several copies of a large model (ort_quantize's ``quant_pre_process``)
leaves much of that memory in the worker's allocator after it returns,
and the next step in the same process starts from there: a 4.3 GB encoder's quantization peaked
at 22.6 GiB with both steps in one process. In a child the memory goes back to the system when it
exits, so the job peaks at the larger of its steps, not near their sum.

The child is spawned (a fresh interpreter: no fork of a process holding threads and gigabytes),
runs ``function(*args)`` and sends back its result or its exception; ``function`` must be a
module-level function (it is pickled by name). A child that dies (killed for memory) raises
``concurrent.futures.process.BrokenProcessPool`` here. The child shares the job's process group
and its output, so a timeout or Ctrl-C that kills the job kills it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def run_in_child(function: Callable[..., T], *args: Any) -> T:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()
