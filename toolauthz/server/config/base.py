"""What every settings model shares: unknown keys are refused, values never change."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    # A string literal under a field is its description: the one place a key is explained,
    # read by the configuration reference (reference.py) and the JSON Schema.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# A tenant a setting names, or `*` for every tenant.
TENANT_PATTERN = r"^(\*|[A-Za-z0-9][A-Za-z0-9._-]{0,127})$"
