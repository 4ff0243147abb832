"""Reading a tokenizer switches the Hub off only while transformers loads it: the process's
environment is given back as it was, so later work in the same process (an input model named by
its Hub id, checked online) is not silently taken offline."""

from __future__ import annotations

import os

import pytest
from hub_cache import minilm_folder

from evaluators.data._tokenize import load_tokenizer


@pytest.mark.parametrize("before", [None, "0"])
def test_loading_a_tokenizer_gives_the_offline_switches_back(monkeypatch: pytest.MonkeyPatch, before: str | None) -> None:
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if before is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, before)
    tokenizer = load_tokenizer("text_lines", minilm_folder())
    assert tokenizer("a short line")["input_ids"][0] == tokenizer.cls_token_id
    assert os.environ.get("HF_HUB_OFFLINE") == before
    assert os.environ.get("TRANSFORMERS_OFFLINE") == before
