"""The refusal a checked request part raises: what the API answers with a status and a
message under the field it names."""

from __future__ import annotations


class FieldRefused(ValueError):
    """A part of a request no job could run with: `field` names it, `status` is the
    answer (422 unless a size or a type says otherwise)."""

    def __init__(self, field: str, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.field, self.message, self.status = field, message, status
