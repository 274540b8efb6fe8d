"""ControlNets, one add-on of app/addons: a job's `controls`, each a ControlNet of the
catalog (`[controlnets.NAME]`) and a control image that steers the layout.

- control.py: `Control`, what a job keeps; `ControlNetSpec`, a catalog entry; the
  request's checks and the control image's preprocessing (`canny`);
- worker.py: the ControlNets kept beside each model on a worker (bounded in bytes) and
  the kind's pipeline derived with them.

A control's image is an input image like any other (app/uploads.py), stored by digest
under the tenant's prefix; its request schema is app/web/resources/jobs/schemas.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.addons.base import Addon, Lookup, Resolved, declared_table
from app.addons.controlnet.control import (
    Control,
    ControlNetSpec,
    control_images,
    control_keywords,
    input_field,
    refusals,
)
from app.families import ADDON_FAMILIES
from app.refused import FieldRefused

if TYPE_CHECKING:
    from app.catalog import ModelSpec
    from app.kinds.base import JobKind

__all__ = ["CONTROLNET", "Control", "ControlNetSpec"]


class ControlNetAddon(Addon):
    field = "controls"
    noun = "controls"
    table = "controlnets"
    item = Control
    # A ControlNet runs a copy of the UNet's encoder half beside it at every step (about
    # 0.4 of the UNet's cost).
    work = 0.4
    batch_field = "control_set"
    worker = "app.addons.controlnet.worker:CONTROLNET_WORKER"

    def limit(self, spec: ModelSpec, kind: JobKind) -> int:
        return 0 if kind.video else spec.control_limit

    def found(self, spec: ModelSpec, values: Any, lookup: Lookup) -> Resolved:
        """Each control's ControlNet of the catalog, of the model's add-on family, and
        its image (kept once the request is accepted), by the image's digest."""
        done = Resolved()
        found = []
        for index, value in enumerate(values):
            if not isinstance(value, dict) or not {"controlnet", "image"} <= set(value):
                continue  # its fields' own errors say why
            refused = refusals(lookup.catalog.controlnets, spec.name, spec.lora_family, value)
            try:
                ref, keep = lookup.image(value["image"], input_field(index))
            except FieldRefused as exc:
                refused["image"] = [exc.message]
            else:
                done.keeps.append(keep)
            if refused:
                done.errors[index] = refused
                continue
            found.append(Control(**{**value, "image": ref.sha256}))
        done.items = tuple(found)
        return done

    def inputs(self, items: Any) -> dict[str, str]:
        return {input_field(index): control.image for index, control in enumerate(items)}

    def placeholders(self, count: int) -> tuple:
        return tuple(Control("", str(index)) for index in range(count))

    def prepare(self, job: Any, inputs: Any, made: Any) -> dict:
        if not job.controls:
            return {}
        return {"controls": control_images(job, inputs, made.get("box"))}

    def call_keywords(self, kind: JobKind, job: Any, prepared: Any) -> dict:
        if not job.controls:
            return {}
        return control_keywords(job.controls, prepared["controls"], kind.control_keyword)

    def declared(self, name: str, table: dict, base_dir: Path) -> ControlNetSpec:
        return ControlNetSpec(
            name, *declared_table("controlnet", name, table, base_dir, list(ADDON_FAMILIES))
        )


CONTROLNET = ControlNetAddon()
