"""Request strings PostgreSQL cannot store: a NUL character or a lone surrogate is
refused as bad input.

PostgreSQL's text and jsonb types cannot hold U+0000, nor a UTF-16 surrogate that JSON's
`\\ud800` escape can spell without its pair (no UTF-8 encodes it); left to the database,
such a value would surface as a store error that names no field. Schemas mixing in
`RefusesNul` answer a 422 naming the field instead, before anything is stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import marshmallow as ma

NUL_MESSAGE = "Must not contain a NUL character (U+0000)."
SURROGATE_MESSAGE = (
    "Must be valid Unicode: a lone surrogate (\\ud800 to \\udfff without its pair) "
    "cannot be stored."
)


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return NUL_MESSAGE
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return SURROGATE_MESSAGE
    return None


def unstorable(value: Any) -> str | None:
    """Why a string anywhere in `value` (keys of objects included) cannot be stored, or
    None when every one can."""
    if isinstance(value, str):
        return _string_problem(value)
    if isinstance(value, Mapping):
        for key, item in value.items():
            problem = unstorable(key) or unstorable(item)
            if problem:
                return problem
    elif isinstance(value, list | tuple):
        for item in value:
            problem = unstorable(item)
            if problem:
                return problem
    return None


def _shown(name: Any) -> str:
    """A field name as an error may show it (JSON's escapes for what it cannot hold)."""
    text = str(name).replace("\x00", "\\u0000")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class RefusesNul:
    """A schema mixin: every top-level field whose value (or name) holds a NUL or a lone
    surrogate is a field error.

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
        errors = {}
        for name, value in items:
            problem = unstorable(name) or unstorable(value)
            if problem:
                errors[_shown(name)] = [problem]
        if errors:
            raise ma.ValidationError(errors)
        return data
