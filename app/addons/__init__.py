"""Add-on weights: what a job brings beside its model's weights, one package per kind
(app/addons/lora/, app/addons/controlnet/) on one contract (app/addons/base.py `Addon`).

`ADDONS` lists them by the request field they come in. A new kind of add-on is a package
here, a line below, and its field on app/kinds/base.py `JobRequest`; the request, the
stored row, the cache key, the estimate, batch compatibility, the manifest, the catalog
and the worker's call read every add-on through `ADDONS` (docs/addons.md).
"""

from __future__ import annotations

from app.addons.base import Addon
from app.addons.controlnet import CONTROLNET
from app.addons.lora import LORA

ADDONS: dict[str, Addon] = {addon.field: addon for addon in (LORA, CONTROLNET)}
# The same, by the batch field that holds each one's set (`Addon.batch_field`).
BY_BATCH_FIELD: dict[str, Addon] = {addon.batch_field: addon for addon in ADDONS.values()}

__all__ = ["ADDONS", "BY_BATCH_FIELD", "Addon"]
