"""Which execution provider took which nodes, and the check that the first choice is in use.

ONNX Runtime drops a provider it cannot load, and hands nodes a provider does not support to the
next one in the list, without failing. A result measured that way would be labelled with the
wrong device, so a session whose first-choice provider is not in use (or took no node, or fewer
than ``min_ep_coverage`` of them) is refused unless the target sets ``allow_fallback: true``.
"""

from __future__ import annotations

from typing import Any

from engine.core.errors import TargetUnavailable

RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"
DISABLE_CPU_FALLBACK = "session.disable_cpu_ep_fallback"
OPT_OUT = "set `allow_fallback: true` on the target to accept this"


def prepare(options: Any, providers: list[str], allow_fallback: bool) -> None:
    """Ask onnxruntime to record node placement and, when fallback is not allowed and the CPU
    EP is not listed, to refuse handing nodes to it (onnxruntime rejects that setting when the
    CPU EP is in the list)."""
    options.add_session_config_entry(RECORD_ASSIGNMENT, "1")
    if not allow_fallback and "CPUExecutionProvider" not in providers:
        options.add_session_config_entry(DISABLE_CPU_FALLBACK, "1")


def providers_to_create(providers: list[str], config_entries: dict[str, str] | None) -> list[str]:
    """The providers to create a session with, from those a session reports in use: onnxruntime
    lists the CPU EP in ``get_providers()`` even when fallback to it is disabled, and refuses a
    session that names it while disabling it ("Conflicting session configuration: explicitly
    added the CPU EP to the session, but also disabled fallback to the CPU EP")."""
    if (config_entries or {}).get(DISABLE_CPU_FALLBACK) == "1":
        return [name for name in providers if name != "CPUExecutionProvider"] or list(providers)
    return list(providers)


#: the provider options that turn a CUDA graph on (CUDA's, TensorRT's)
GRAPH_OPTIONS = ("enable_cuda_graph", "trt_cuda_graph_enable")


def graph_capture_problem(placement: dict[str, int] | None, gpu_ep: str) -> str | None:
    """What keeps a session placed so from a CUDA graph, or None: the nodes off the GPU provider
    (the CPU EP, with the Memcpy nodes that moves data to it). Read after onnxruntime refused
    graph capture (it judges which CPU nodes it tolerates: shape computations may stay), from
    the placement of a session opened without the graph. None when placement is unknown."""
    if not placement:
        return None
    off = {ep: count for ep, count in placement.items() if ep != gpu_ep and count}
    if not off:
        return None
    where = ", ".join(f"{count} node{'s' if count != 1 else ''} on {ep}" for ep, count in sorted(off.items()))
    return f"{where} beside {placement.get(gpu_ep, 0)} on {gpu_ep}: onnxruntime captures a CUDA graph only when every node runs on the GPU"


def refused_graph_capture(error: BaseException) -> bool:
    """Whether session creation failed because onnxruntime cannot capture the graph asked for."""
    return "graph capture" in str(error) or "CUDA Graph" in str(error)


def without_graph(provider_options: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """``provider_options`` with the CUDA graph options left out."""
    if provider_options is None:
        return None
    return [{key: value for key, value in options.items() if key not in GRAPH_OPTIONS} for options in provider_options]


def refused_cpu_fallback(error: BaseException) -> bool:
    """Whether session creation failed because nodes needed the CPU EP while it was disabled."""
    return "fallback to CPU EP has been explicitly disabled" in str(error)


def placement_of(session: Any) -> dict[str, int] | None:
    """Nodes per EP, from onnxruntime's graph-assignment record (None where this onnxruntime
    cannot say)."""
    info = getattr(session, "get_provider_graph_assignment_info", None)
    if info is None:
        return None
    try:
        subgraphs = info()
    except Exception:  # noqa: BLE001 - an older build without the record: placement unknown
        return None
    counts: dict[str, int] = {}
    for subgraph in subgraphs:
        counts[subgraph.ep_name] = counts.get(subgraph.ep_name, 0) + len(subgraph.get_nodes())
    return counts


def coverage(placement: dict[str, int] | None, ep: str) -> float | None:
    """The share of nodes ``ep`` took (None when placement is unknown or the graph is empty)."""
    if not placement:
        return None
    total = sum(placement.values())
    return placement.get(ep, 0) / total if total else None


def _describe(placement: dict[str, int] | None) -> str:
    if placement is None:
        return "unknown"
    return ", ".join(f"{ep} {count} node{'s' if count != 1 else ''}" for ep, count in placement.items()) or "no nodes"


def check(
    target_id: str,
    requested: list[str],
    in_use: list[str],
    placement: dict[str, int] | None,
    min_coverage: float | None,
) -> None:
    """Raise ``TargetUnavailable`` when the first-choice EP is not in use, took no node, or took
    a smaller share of nodes than ``min_coverage``."""
    first = requested[0]
    if first not in in_use:
        raise TargetUnavailable(
            f"target '{target_id}': onnxruntime did not load {first}, the first-choice execution provider "
            f"(in use: {', '.join(in_use) or 'none'}; nodes: {_describe(placement)}); {OPT_OUT}"
        )
    share = coverage(placement, first)
    if placement is not None and not placement.get(first):
        raise TargetUnavailable(
            f"target '{target_id}': {first}, the first-choice execution provider, took no node (nodes: {_describe(placement)}); {OPT_OUT}"
        )
    if min_coverage is not None and share is not None and share < min_coverage:
        raise TargetUnavailable(
            f"target '{target_id}': {first} took {share:.0%} of the nodes, below min_ep_coverage {min_coverage:.0%} "
            f"(nodes: {_describe(placement)}); {OPT_OUT}, or lower min_ep_coverage"
        )
