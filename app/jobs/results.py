"""What a finished job's `result` holds: lists of stored files (`images`; a video job's
poster in `images` and its MP4 in `videos`), each entry with its store `key`."""

from __future__ import annotations

from typing import Any

RESULT_FILES = ("images", "videos")


def result_keys(result: dict[str, Any] | None) -> list[str]:
    """Every store key of a job's result: its images, a clip and its poster."""
    return [entry["key"] for name in RESULT_FILES for entry in (result or {}).get(name, [])]
