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
    """A schema mixin: every top-level field whose value holds a NUL is a field error.

    A schema that excludes unknown fields (the headers' schemas) looks only at its own
    fields: the rest are dropped unread, and walking every header of every request cost
    a submit more than the rest of its header parsing."""

    @ma.pre_load
    def _refuse_nul(self, data: Any, **_kwargs) -> Any:
        if not isinstance(data, Mapping):
            return data
        if self.unknown == ma.EXCLUDE:
            names = [field.data_key or name for name, field in self.load_fields.items()]
            items = [(name, data[name]) for name in names if name in data]
        else:
            items = data.items()
        errors = {
            str(name).replace("\x00", "\\u0000"): [NUL_MESSAGE]
            for name, value in items
            if holds_nul(name) or holds_nul(value)
        }
        if errors:
            raise ma.ValidationError(errors)
        return data
