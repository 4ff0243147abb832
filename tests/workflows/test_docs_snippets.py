"""Every workflow snippet in README.md and docs/ is a valid workflow (data copied beside it)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from engine.workflow import load_workflow

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
SNIPPETS = [
    (path, index, text)
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for index, text in enumerate(BLOCK.findall(path.read_text()))
    if text.lstrip().startswith("version: 1")
]


def test_the_readme_has_a_workflow_snippet():
    assert any(path.name == "README.md" for path, _, _ in SNIPPETS)


@pytest.mark.parametrize(("path", "index", "text"), SNIPPETS, ids=lambda v: v.name if isinstance(v, Path) else str(v)[:0])
def test_workflow_snippet_is_valid(tmp_path, path, index, text):
    shutil.copytree(ROOT / "workflows" / "data", tmp_path / "data")
    file = tmp_path / "snippet.yaml"
    file.write_text(text)
    assert load_workflow(file).steps
