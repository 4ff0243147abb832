"""bench/adversarial.py in a tiny configuration: every part runs a few cases, the table has one row
per part with every column, and its counts add up. Whether Kiln has bugs is the campaign's to
report, not this test's to judge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import adversarial  # noqa: E402

PARTS = ["fuzz", "kill-resume", "damage", "concurrency", "bad models"]


def test_a_tiny_campaign_prints_and_writes_a_table_whose_counts_add_up(tmp_path):
    report = tmp_path / "report.json"
    args = ["--cases", "4", "--kills", "1", "--damage", "1", "--concurrent", "2", "--rounds", "1", "--bad-models", "2"]
    done = subprocess.run(
        [sys.executable, str(BENCH / "adversarial.py"), *args, "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    written = json.loads(report.read_text())
    rows = {row["part"]: row for row in written["parts"]}
    assert list(rows) == PARTS
    expected_cases = {"fuzz": 4, "kill-resume": 1, "damage": 1, "concurrency": 2, "bad models": 2}
    keys = [key for key, _ in adversarial.COLUMNS]
    for name, row in rows.items():
        assert set(row) == {"part", *keys}
        assert row["cases"] == expected_cases[name]
        assert row["ok"] + row["not_ok"] == row["cases"]
        for key in keys:
            if key in ("cases", "wall_s") or row[key] is None:
                continue
            assert 0 <= row[key] <= row["cases"], (name, key, row[key])  # each case counts once per column
        assert row["wall_s"] >= 0
        assert (row["not_ok"] == 0) or written["notes"][name], name  # every case that is not ok says why
    for name in ("kill-resume", "damage", "concurrency"):
        assert rows[name]["same_choice"] <= rows[name]["completed"] <= rows[name]["cases"]
    assert rows["damage"]["detected"] <= 1 and rows["damage"]["repaired"] <= 1
    header = done.stdout.splitlines()[0].split()
    assert header[:3] == ["part", "cases", "ok"] and header[-2:] == ["wall", "s"]
    for name in PARTS:
        assert any(line.startswith(name) for line in done.stdout.splitlines()), name


def test_the_hostile_kinds_each_make_a_file(tmp_path):
    import _adversarial_cases as cases

    model = cases.make_tiny_encoder(tmp_path / "model.onnx")
    base = cases.tiny_workflow(model)
    kinds = set()
    for index in range(2 * len(cases.HOSTILE)):
        kind, path = cases.make_case(index, 0, base, tmp_path / f"case{index}")
        assert path.exists() or path.is_symlink()
        kinds.add(kind)
    assert set(cases.HOSTILE) <= kinds
