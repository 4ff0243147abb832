"""The base of every part of the workflow file: unknown keys refused, frozen, booleans strict."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from engine.core.config import strict_booleans

MAX_SECONDS = 30 * 24 * 3600  # a time limit past 30 days is a typo


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        strict_booleans(cls)  # a boolean is true or false, never "yes" or 1
