"""LoRA adapters, one add-on of app/addons: low-rank weights a job names in `loras` (a
tenant's upload by id, or a shared one of the catalog's `[adapters.NAME]` by name),
applied to every layer they adapt at the job's scale.

- item.py: `Lora`, what a job keeps (the file's digest, its scale, a shared one's name);
- checks.py: the upload's check from the safetensors header alone (no torch, nothing
  unpickled), against the model's add-on family;
- store.py: a tenant's adapters, stored by digest under its prefix, and their rows;
- worker.py: the worker's two caches (CPU tensors bounded in bytes; the slots loaded in
  each model's pipeline).

Its HTTP routes are app/web/resources/adapters/ and its table `adapters` is
app/db/models/inputs.py: the web and persistence layers hold every feature's
(docs/architecture.md, "Layers").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.addons.base import Addon, DeclarationError, Lookup, Resolved, declared_table
from app.addons.lora import store
from app.addons.lora.item import Lora
from app.families import ADDON_FAMILIES

if TYPE_CHECKING:
    from app.catalog import ModelSpec
    from app.kinds.base import JobKind

__all__ = ["LORA", "AdapterSpec", "Lora"]


@dataclass(frozen=True)
class AdapterSpec:
    """A shared LoRA adapter (`[adapters.NAME]`): every tenant's jobs may name it. Its
    file is read by the workers; `sha256` (computed when the file is readable where the
    catalog loads, else given) goes into cache keys and manifests."""

    name: str
    path: Path
    family: str
    sha256: str


class LoraAddon(Addon):
    field = "loras"
    noun = "adapters"
    table = "adapters"
    item = Lora
    # Its low-rank products on every adapted layer, unfused: a tenth per adapter.
    work = 0.1
    batch_field = "adapter_set"  # a column: the warm routing reads it too
    column = True
    worker = "app.addons.lora.worker:LORA_WORKER"

    def canonical(self, items: Any) -> Any:
        # What `adapter_set` has always hashed (a column: app/db/models/jobs.py).
        return [[lora.sha256, lora.scale] for lora in items]

    def limit(self, spec: ModelSpec, kind: JobKind) -> int:
        return spec.lora_limit

    def found(self, spec: ModelSpec, values: Any, lookup: Lookup) -> Resolved:
        """Each `{"id"|"name", "scale"}`: the tenant's upload by id (another tenant's, a
        deleted one and one that never was are refused alike) or a shared one by name,
        of the model's family; the same adapter twice is refused."""
        done = Resolved()
        found: list[Lora] = []
        for index, value in enumerate(values):
            scale = float(value.get("scale", 1.0))
            if value.get("name") is not None:
                what, row = "name", lookup.catalog.adapters.get(value["name"])
                missing = "No such shared adapter in the catalog."
            else:
                what, row = "id", store.find(lookup.session, lookup.tenant_id, value["id"])
                missing = "No such adapter: POST /v1/adapters."
            if row is None:
                done.errors[index] = {what: [missing]}
            elif row.family != spec.lora_family:
                message = f"A {row.family} adapter: model '{spec.name}' is {spec.lora_family}."
                done.errors[index] = {what: [message]}
            else:
                found.append(Lora(row.sha256, scale, row.name if what == "name" else None))
        digests = [lora.sha256 for lora in found]
        if not done.errors and len(set(digests)) != len(digests):
            message = "The same adapter twice: give it once, with one scale."
            done.errors[len(values) - 1] = {"id": [message]}
        done.items = tuple(found)
        return done

    def placeholders(self, count: int) -> tuple:
        return tuple(Lora(str(index)) for index in range(count))

    def declared(self, name: str, table: dict, base_dir: Path) -> AdapterSpec:
        lora_families = [n for n, a in ADDON_FAMILIES.items() if a.loras]
        path, family = declared_table("adapter", name, table, base_dir, lora_families, "sha256")
        sha256 = table.get("sha256")
        if path.is_file():
            sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        if not sha256:
            raise DeclarationError(
                f"adapter {name!r}: {path} is not readable here; give its sha256"
            )
        return AdapterSpec(name, path, family, sha256)


LORA = LoraAddon()
