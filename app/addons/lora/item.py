"""The LoRA adapter a job runs with, as the job keeps it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Lora:
    """An adapter a job runs with (checks.py): its safetensors file's SHA-256, its scale,
    and where the worker finds it: `name`, a catalog adapter's, or None, the tenant's
    upload (stored by digest under its prefix: store.py)."""

    sha256: str
    scale: float = 1.0
    name: str | None = None

    def stored(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"sha256": self.sha256, "scale": self.scale}
        if self.name is not None:
            shown["name"] = self.name
        return shown

    @classmethod
    def of(cls, value: Any) -> Lora:
        if isinstance(value, Lora):
            return value
        return cls(str(value["sha256"]), float(value.get("scale", 1.0)), value.get("name"))
