"""Fixtures of the target tests."""

from __future__ import annotations

import pytest
from genai_models import TinyGenai, build


@pytest.fixture(scope="session")
def tiny_genai(tmp_path_factory: pytest.TempPathFactory) -> TinyGenai:
    """Tiny llama decoders exported by the GenAI model builder (fp32, int4, fp32 without a shared
    past/present buffer), built once per test session."""
    return build(tmp_path_factory.mktemp("genai"))
