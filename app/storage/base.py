"""The storage interface and its errors."""

from __future__ import annotations

from typing import Protocol


class StorageError(Exception):
    """A store operation failed; `transient` says whether trying again may help."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


class StorageUnavailable(StorageError):
    """The store stayed unreachable through every retry."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class Storage(Protocol):
    def put(self, key: str, data: bytes, content_type: str) -> None:
        """Write an object whole (overwriting: keys are deterministic)."""

    def url(self, key: str, ttl: int) -> str:
        """A URL that downloads the object without an API key and expires after `ttl` s."""

    def check(self) -> None:
        """Raise StorageError if the store cannot be reached."""

    def delete(self, key: str) -> None:
        """Remove an object; removing one that is gone is not an error."""

    def get(self, key: str) -> bytes:
        """An object's bytes (for answers that inline images)."""
