"""report.html: one tiny run per module; its page is parsed (chosen candidate, figure data,
lineage, environment, settings), written again from the records alone, and rendered once in
headless Chromium when it is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_helpers import engine_cmd, make_tiny_encoder, tiny_workflow, write_workflow

from engine.core.errors import KilnError
from engine.report.report_html import REPORT_NAME, write_report


class _Page(HTMLParser):
    """The elements of the page the tests look at: figures (their JSON), candidate rows,
    lineage steps, environment rows, and all the text."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: list[dict[str, Any]] = []
        self.rows: list[dict[str, str]] = []
        self.steps: list[dict[str, str]] = []
        self.lineages: list[dict[str, str]] = []
        self.text: list[str] = []
        self.fetched: list[str] = []  # what opening the page would fetch: script src, link href, img src
        self._figure: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if (tag in ("script", "img", "iframe") and "src" in a) or (tag == "link" and "href" in a):
            self.fetched.append(a.get("src") or a["href"])
        if tag == "script" and a.get("class") == "kiln-figure":
            self._figure = {**a, "json": ""}
        elif tag == "tr" and "data-candidate" in a:
            self.rows.append(a)
        elif tag == "li" and a.get("class") == "step":
            self.steps.append(a)
        elif tag == "details" and a.get("class") == "lineage":
            self.lineages.append(a)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._figure is not None:
            self._figure["figure"] = json.loads(self._figure.pop("json"))
            self.figures.append(self._figure)
            self._figure = None

    def handle_data(self, data: str) -> None:
        if self._figure is not None:
            self._figure["json"] += data
        elif len(data) < 100_000:  # not plotly.js itself
            self.text.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def run_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    workflow = tiny_workflow(make_tiny_encoder(root / "tiny.onnx"))
    workflow["evaluate"][1]["config"].update(runs=3, warmup=1, quiet_wait_s=0)
    out = root / "out"
    done = subprocess.run(
        [*engine_cmd(), "run", str(write_workflow(root, workflow)), "-o", str(out), "--store", str(root / "store"), "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def page(run_output: Path) -> _Page:
    return _parse(run_output / REPORT_NAME)


def test_every_run_writes_a_self_contained_report(run_output: Path, page: _Page) -> None:
    text = (run_output / REPORT_NAME).read_text(encoding="utf-8")
    assert "Plotly.newPlot" in text and "plotly.js v" in text  # plotly.js inline
    assert page.fetched == []
    assert not [p for p in run_output.iterdir() if p.name.endswith(".tmp")]


def test_the_report_names_the_chosen_candidate_as_the_records_do(run_output: Path, page: _Page) -> None:
    candidates = json.loads((run_output / "candidates.json").read_text())["candidates"]
    chosen = next(c for c in candidates if c["chosen"])
    assert [r["data-candidate"] for r in page.rows] == [c["id"] for c in candidates]
    assert [r["data-candidate"] for r in page.rows if r["class"] == "chosen"] == [chosen["id"]]
    assert "chosen for " in "".join(page.text) and chosen["path"] in "".join(page.text)


def test_the_plot_holds_every_complete_candidate_the_chosen_point_and_the_constraint(run_output: Path, page: _Page) -> None:
    candidates = json.loads((run_output / "candidates.json").read_text())["candidates"]
    [figure] = page.figures
    assert (figure["data-target"], figure["data-x"], figure["data-y"]) == ("cpu", "fidelity.cosine_mean", "latency.p50_ms")
    traces = {trace["name"]: trace for trace in figure["figure"]["data"]}
    plotted = {i for trace in traces.values() for i in trace["customdata"]}
    assert plotted == {c["id"] for c in candidates if c["state"] == "complete"}
    by_id = {c["id"]: c for c in candidates}
    for name, trace in traces.items():  # a candidate rejected before timing sits in a strip of its own, at its x
        timed = [("latency.p50_ms" in by_id[i]["metrics"]) for i in trace["customdata"]]
        assert all(not t for t in timed) if name.startswith("not timed") else all(timed)
    chosen = next(c for c in candidates if c["chosen"])
    assert traces["chosen"]["customdata"] == [chosen["id"]]
    assert traces["chosen"]["y"] == [chosen["metrics"]["latency.p50_ms"]]
    assert traces["chosen"]["x"] == [chosen["metrics"]["fidelity.cosine_mean"]]
    error_bars = [trace["error_y"] for trace in traces.values() if trace.get("error_y")]
    assert error_bars and all(len(e["array"]) == len(e["arrayminus"]) for e in error_bars)
    lines = [s for s in figure["figure"]["layout"]["shapes"] if s["x0"] == s["x1"] == 0.9]
    assert lines, "the constraint fidelity.cosine_mean >= 0.9 is drawn"
    import plotly.graph_objects as go

    go.Figure(figure["figure"])  # the figure JSON, written as dicts, is one plotly's own schema accepts (raises if not)


def test_the_lineage_lists_each_candidates_passes_with_digest_and_cache_status(run_output: Path, page: _Page) -> None:
    candidates = json.loads((run_output / "candidates.json").read_text())["candidates"]
    assert [d["data-candidate"] for d in page.lineages] == [c["id"] for c in candidates]
    steps = [s for c in candidates for s in c["steps"]]
    assert [(s["data-step"], s["data-status"]) for s in page.steps] == [(s["step"], s["status"]) for s in steps]
    text = "".join(page.text)
    assert all(s["digest"][:16] in text for s in steps) and "cache miss: ran" in text
    assert all(isinstance(s["seconds"], float) for s in steps)


def test_the_environment_and_the_settings_to_deploy_with_are_shown(run_output: Path, page: _Page) -> None:
    lock = json.loads((run_output / "workflow.lock.json").read_text())
    settings = json.loads((run_output / "cpu" / "inference_settings.json").read_text())
    text = "".join(page.text)
    assert lock["host"]["cpu"] in text and ", ".join(lock["host"]["isa"]) in text
    assert all(f"library {name}" in text for name in lock["libraries"])
    assert json.dumps(settings, indent=2) in text


def test_the_report_is_written_again_from_the_records_alone(run_output: Path, page: _Page, tmp_path: Path) -> None:
    copy = tmp_path / "past"
    shutil.copytree(run_output, copy, ignore=shutil.ignore_patterns(REPORT_NAME, "model"))
    again = _parse(write_report(copy))
    assert [f["figure"] for f in again.figures] == [f["figure"] for f in page.figures]
    assert again.rows == page.rows and again.steps == page.steps
    with pytest.raises(KilnError, match=r"no candidates\.json"):
        write_report(tmp_path)


def test_failures_are_listed_with_their_reasons(run_output: Path, tmp_path: Path) -> None:
    copy = tmp_path / "failed"
    shutil.copytree(run_output, copy, ignore=shutil.ignore_patterns(REPORT_NAME, "model"))
    document = json.loads((copy / "candidates.json").read_text())
    document["candidates"][1].update(state="failed", reason="int8: the quantizer ran out of memory", chosen=False)
    document["candidates"][2]["steps"][0]["error"] = "ort_quantize: no MatMul to quantize"
    (copy / "candidates.json").write_text(json.dumps(document))
    text = "".join(_parse(write_report(copy)).text)
    failures = text.split("failures", 1)[1]
    assert "int8: the quantizer ran out of memory" in failures and "ort_quantize: no MatMul to quantize" in failures


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_the_report_renders_in_headless_chromium(run_output: Path, tmp_path: Path) -> None:
    from PIL import Image

    shot = tmp_path / "report.png"
    done = subprocess.run(
        [
            str(_chromium()),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1000,900",
            "--virtual-time-budget=5000",
            "--enable-logging=stderr",
            "--v=0",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            (run_output / REPORT_NAME).as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert shot.is_file(), done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console  # chromium logs every console message (errors included) as INFO:CONSOLE
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(np.int16)
    star = np.all(pixels == (212, 160, 0), axis=-1)  # the chosen point's colour, drawn only by plotly
    assert star.sum() > 20, "the chosen point is not drawn: the plot did not render"
    row = int(np.nonzero(star.any(axis=1))[0].mean())
    area = pixels[max(0, row - 200) : row + 200]  # the plot around the chosen point: axes, grid, points, bounds
    assert area.std(axis=(0, 1)).max() > 5, "the plot area is blank"
    assert (area.min(axis=-1) < 200).mean() > 0.003, "the plot area is blank"


def test_bounds_on_the_objective_and_drops_from_the_reference_are_drawn(run_output: Path, tmp_path: Path) -> None:
    copy = tmp_path / "bounds"
    shutil.copytree(run_output, copy, ignore=shutil.ignore_patterns(REPORT_NAME, "model"))
    document = json.loads((copy / "candidates.json").read_text())
    reference = next(c for c in document["candidates"] if c["reference"])["metrics"]["fidelity.cosine_mean"]
    document["select"]["constraints"] = [
        {"metric": "latency.p50_ms", "max": 1.5},
        {"metric": "fidelity.cosine_mean", "max_drop_ratio": 0.01},
    ]
    (copy / "candidates.json").write_text(json.dumps(document))
    [figure] = _parse(write_report(copy)).figures
    shapes = figure["figure"]["layout"]["shapes"]
    assert any(s["y0"] == s["y1"] == 1.5 for s in shapes)  # the objective's own bound: a horizontal line
    assert any(s["x0"] == s["x1"] == pytest.approx(reference * 0.99) for s in shapes)
    document["select"]["constraints"] = []
    (copy / "candidates.json").write_text(json.dumps(document))
    [figure] = _parse(write_report(copy)).figures
    assert figure["data-x"] == "#" and sorted(x for t in figure["figure"]["data"] for x in t["x"]) == [0, 1, 2]


def _rewritten(run_output: Path, tmp_path: Path, change: Any) -> _Page:
    copy = tmp_path / "changed"
    shutil.copytree(run_output, copy, ignore=shutil.ignore_patterns(REPORT_NAME, "model"))
    document = json.loads((copy / "candidates.json").read_text())
    change(document)
    (copy / "candidates.json").write_text(json.dumps(document))
    return _parse(write_report(copy))


def test_plot_titles_are_on_the_page_above_the_figure_where_the_toolbar_is_not(run_output: Path, page: _Page) -> None:
    [figure] = page.figures
    assert "title" not in figure["figure"]["layout"]
    html = (run_output / REPORT_NAME).read_text()
    title = html.index('<h4 class="plot-title">latency.p50_ms (lower is better) against fidelity.cosine_mean</h4>')
    assert title < html.index('class="plot"', title)


def test_candidates_never_timed_are_drawn_apart_not_at_a_made_up_time(run_output: Path, tmp_path: Path) -> None:
    def untime(document: dict[str, Any]) -> None:
        last = document["candidates"][-1]
        last.update(chosen=False, feasible=False, violations=["fidelity.cosine_mean = 0.5 < min 0.9"])
        last["metrics"] = {"fidelity.cosine_mean": 0.5}

    [figure] = _rewritten(run_output, tmp_path, untime).figures
    traces = figure["figure"]["data"]
    [strip] = [t for t in traces if t["name"].startswith("not timed")]
    assert strip["name"] == "not timed (rejected on fidelity.cosine_mean)" and strip["yaxis"] == "y2"
    assert all(t.get("yaxis", "y") == "y" for t in traces if t is not strip)
    layout = figure["figure"]["layout"]
    assert layout["yaxis2"]["domain"][1] < layout["yaxis"]["domain"][0]  # below the plot, not on its axis


def test_a_target_with_one_candidate_shows_it_labelled_or_says_why_there_is_no_plot(run_output: Path, tmp_path: Path) -> None:
    def only_the_reference(document: dict[str, Any]) -> None:
        document["candidates"] = [c for c in document["candidates"] if c["reference"]]

    [figure] = _rewritten(run_output, tmp_path, only_the_reference).figures
    [trace] = figure["figure"]["data"]
    assert trace["mode"] == "markers+text" and trace["texttemplate"] == "%{customdata}"

    def nothing_timed(document: dict[str, Any]) -> None:
        for c in document["candidates"]:
            c["metrics"].pop("latency.p50_ms", None)

    page = _rewritten(run_output, tmp_path / "none", nothing_timed)
    assert not page.figures and "nothing to plot" in "".join(page.text)
