"""Request strings PostgreSQL cannot store: a NUL character is refused as bad input.

PostgreSQL's text and jsonb types cannot hold U+0000; left to the database, such a value
would surface as a store error. Schemas mixing in `RefusesNul` answer a 422 naming the
field instead, before anything is stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import marshmallow as ma

NUL_MESSAGE = "Must not contain a NUL character (U+0000)."


def holds_nul(value: Any) -> bool:
    """Whether a string anywhere in `value` (keys of objects included) holds U+0000."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(holds_nul(k) or holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(holds_nul(item) for item in value)
    return False


class RefusesNul:
    """A schema mixin: every top-level field whose value holds a NUL is a field error."""

    @ma.pre_load
    def _refuse_nul(self, data: Any, **_kwargs) -> Any:
        if not isinstance(data, Mapping):
            return data
        errors = {
            str(name).replace("\x00", "\\u0000"): [NUL_MESSAGE]
            for name, value in data.items()
            if holds_nul(name) or holds_nul(value)
        }
        if errors:
            raise ma.ValidationError(errors)
        return data
