"""The plots of report.html (engine.report.report_html): per target, the (first) objective against each
other objective and constraint metric, as plotly.js figure JSON: the chosen point, the reference
and the Pareto front marked, intervals as error bars, constraint bounds as dashed lines,
candidates rejected before their timing as crosses in a strip of their own below the plot (they
have no time to be drawn at). The title is the page's (engine.report.report_html writes it above the
figure), so plotly's toolbar covers nothing."""

from __future__ import annotations

from typing import Any


def figures(rows: list[dict[str, Any]], select: dict[str, Any]) -> list[dict[str, Any]]:
    """One figure per constraint metric other than the objective (the objective against the
    candidate number when there is none)."""
    objective, *others = [o["metric"] for o in objectives(select)]
    metrics = list(dict.fromkeys(m for m in [*others, *(c["metric"] for c in select.get("constraints", []))] if m != objective))
    goal = objectives(select)[0].get("goal", "min")
    better = "lower" if goal == "min" else "higher"
    return [
        {
            "x": x,
            "y": objective,
            "title": f"{objective} ({better} is better) against {'candidate' if x == '#' else x}",
            **_figure(rows, select, x),
        }
        for x in metrics or ["#"]
    ]


_GROUPS = (
    ("chosen", lambda c: c.get("chosen"), {"symbol": "star", "size": 18, "color": "#d4a000", "line": {"width": 1, "color": "#000"}}),
    ("reference", lambda c: c.get("reference") and not c.get("chosen"), {"symbol": "diamond", "size": 12, "color": "#555"}),
    ("pareto front", lambda c: c.get("pareto") and not c.get("chosen") and not c.get("reference"), {"size": 10, "color": "#1f77b4"}),
    ("other", lambda c: not (c.get("chosen") or c.get("reference") or c.get("pareto")), {"size": 9, "color": "#aaa"}),
)


def value_of(candidate: dict[str, Any], metric: str) -> float | None:
    if metric == "#":
        return float(candidate["id"].split("/")[-1])
    value = candidate.get("metrics", {}).get(metric)
    return float(value) if isinstance(value, int | float) else None


def _error_bars(members: list[dict[str, Any]], metric: str) -> dict[str, Any] | None:
    plus, minus = [], []
    for candidate in members:
        interval, value = (candidate.get("intervals") or {}).get(metric), value_of(candidate, metric)
        plus.append(max(0.0, interval["high"] - value) if interval and value is not None else 0.0)
        minus.append(max(0.0, value - interval["low"]) if interval and value is not None else 0.0)
    if not any(plus) and not any(minus):
        return None
    return {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "visible": True}


def objectives(select: dict[str, Any]) -> list[dict[str, Any]]:
    objective = select.get("objective") or []
    return list(objective) if isinstance(objective, list) else [objective]  # one, or several


def _figure(rows: list[dict[str, Any]], select: dict[str, Any], x: str) -> dict[str, Any]:
    """``figure``: plotly.js's figure JSON, written here as dicts on purpose (plotly's Python
    graph_objects only validate such dicts, and their validators load on first use: 0.19 s of
    every run's end, a sixth of a warm re-run); ``placed``: how many candidates it draws at a
    measured point."""
    objective = objectives(select)[0]["metric"]
    placed = [c for c in rows if c.get("state") == "complete" and value_of(c, x) is not None and value_of(c, objective) is not None]
    data: list[dict[str, Any]] = []
    for name, member, marker in _GROUPS:
        members = [c for c in placed if member(c)]
        if members:
            data.append(
                _scatter(
                    members, x, objective, name, marker, [f"{c['id']} {c['path']}" for c in members],
                    "%{text}<br>" + f"{x}: %{{x}}<br>{objective}: %{{y}}<extra>{name}</extra>",
                    error_x=_error_bars(members, x) if x != "#" else None, error_y=_error_bars(members, objective),
                )
            )  # fmt: skip
    if len(placed) <= 2:  # a point or two: labelled, so the plot does not look empty
        for trace in data:
            trace.update(mode="markers+text", texttemplate="%{customdata}", textposition="top center")
    untimed = _untimed(rows, x, objective)
    data += untimed
    reference = next((c for c in rows if c.get("reference")), None)
    shapes, notes = [], []
    for constraint in select.get("constraints", []):
        for label, bound in _bounds(constraint, reference):
            if constraint["metric"] not in (x, objective):
                continue
            across = "x" if constraint["metric"] == x else "y"  # a vertical line at an x bound, else a horizontal one
            along = "y" if across == "x" else "x"
            line = {f"{across}ref": across, f"{across}0": bound, f"{across}1": bound, f"{along}ref": f"{along} domain"}
            shapes.append({"type": "line", **line, f"{along}0": 0, f"{along}1": 1, "line": {"dash": "dash", "color": "#d62728"}})
            if untimed and across == "x":  # the bar through the strip of those not timed too
                shapes.append({**shapes[-1], "yref": "y2 domain"})
            notes.append(
                {f"{across}ref": across, across: bound, f"{along}ref": f"{along} domain", along: 1, "showarrow": False,
                 "text": f"{constraint['metric']} {label}", "xanchor": "left" if across == "x" else "right", "yanchor": "bottom"}
            )  # fmt: skip
    grid = {"gridcolor": "#ebf0f8", "zerolinecolor": "#ebf0f8", "automargin": True}
    layout = {
        "xaxis": {"title": {"text": "candidate" if x == "#" else x}, **grid},
        "yaxis": {"title": {"text": objective}, **grid},
        "plot_bgcolor": "white",
        "paper_bgcolor": "white",
        "hovermode": "closest",
        "shapes": shapes,
        "annotations": notes,
        "legend": {"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
        "margin": {"l": 60, "r": 20, "t": 30, "b": 50},
        "modebar": {"orientation": "v"},
    }
    if untimed:
        layout["yaxis"]["domain"] = [0.3, 1]
        layout["xaxis2"] = {"matches": "x", "anchor": "y2", "showticklabels": False, **grid}
        strip = {"showticklabels": False, "showgrid": False, "zeroline": False, "range": [-1, 1], "fixedrange": True}
        layout["yaxis2"] = {"domain": [0, 0.1], "anchor": "x2", "title": {"text": "not timed", "font": {"size": 11}}, **strip}
    return {"figure": {"data": data, "layout": layout}, "placed": len(placed)}


def _scatter(
    members: list[dict[str, Any]], x: str, objective: str, name: str, marker: dict[str, Any], text: list[str], hover: str, **more: Any
) -> dict[str, Any]:
    ys = [value_of(c, objective) for c in members]
    trace = {"type": "scatter", "x": [value_of(c, x) for c in members], "y": ys, "mode": "markers", "name": name, "marker": marker}
    trace.update(text=text, customdata=[c["id"] for c in members], hovertemplate=hover)
    return {**trace, **{key: value for key, value in more.items() if value is not None}}


def _untimed(rows: list[dict[str, Any]], x: str, objective: str) -> list[dict[str, Any]]:
    """Candidates rejected before the objective was measured (a failed constraint spares the
    timing) have no y: they are drawn at their x in a strip of their own under the plot, named
    for what rejected them, never at a made-up time."""
    untimed = [c for c in rows if c.get("state") == "complete" and value_of(c, x) is not None and value_of(c, objective) is None]
    if not untimed or x == "#":
        return []
    failed = dict.fromkeys(v.split(" ")[0] for c in untimed for v in c.get("violations") or [])
    name = f"not timed (rejected on {', '.join(failed) or 'a constraint'})"
    texts = [f"{c['id']} {c['path']}: {why_of(c)}" for c in untimed]
    marker = {"symbol": "x", "size": 9, "color": "#d62728"}
    trace = _scatter(untimed, x, objective, name, marker, texts, "%{text}<br>" + f"{x}: %{{x}}<extra>not timed</extra>")
    return [{**trace, "y": [0] * len(untimed), "xaxis": "x2", "yaxis": "y2"}]


def _bounds(constraint: dict[str, Any], reference: dict[str, Any] | None) -> list[tuple[str, float]]:
    """The constraint's bounds as values of its metric (drops measured from the reference's value)."""
    bounds = [(f"≥ {constraint['min']:g}", constraint["min"])] if constraint.get("min") is not None else []
    if constraint.get("max") is not None:
        bounds.append((f"≤ {constraint['max']:g}", constraint["max"]))
    base = value_of(reference, constraint["metric"]) if reference else None
    if base is not None and constraint.get("max_drop") is not None:
        bounds.append((f"drop ≤ {constraint['max_drop']:g}", base - constraint["max_drop"]))
    if base is not None and constraint.get("max_drop_ratio") is not None:
        bounds.append((f"drop ≤ {constraint['max_drop_ratio']:.1%}", base * (1 - constraint["max_drop_ratio"])))
    return bounds


def why_of(candidate: dict[str, Any]) -> str:
    return "; ".join(candidate.get("violations") or []) or candidate.get("verdict") or candidate.get("reason") or ""
