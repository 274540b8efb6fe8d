"""The contract of an add-on: weights a job brings beside its model's (LoRA adapters,
ControlNets), and the byte-bounded cache a worker keeps them in.

An `Addon` is declared once, in its feature's package (app/addons/lora/,
app/addons/controlnet/), and listed in app/addons/__init__.py `ADDONS`. Everything that
treats a job's add-ons alike reads them through it:

- the request: the field they come in (`field`), how many a model takes (`limit`), the
  stored item type (`of`), and the input images they carry (`inputs`);
- the cache key and the manifest: the items' `stored()` form, kept in the row's `input`
  only where there are some (so a job without add-ons keys and reads as before);
- the estimate: what one adds to a job's work (`work`);
- batch compatibility: the digest of a job's set (`set_key`); jobs share a pipeline call
  only with the same set;
- the catalog: the table operators declare shared ones in (`table`, `declared`);
- the worker: the module of its worker half (`worker`: `fetch` reads what a job names,
  `pipeline_key` and `derive` say what the kind's derived pipeline is built with, `ran`
  hears that a call ran), imported by the worker alone, never by the API.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

if TYPE_CHECKING:
    from app.catalog import ModelSpec
    from app.kinds.base import JobKind


class DeclarationError(ValueError):
    """A catalog table of add-ons that cannot be read (app.catalog makes it a
    CatalogError)."""


def declared_table(
    what: str, name: str, table: dict, base_dir: Path, families: Sequence[str], *extra: str
) -> tuple[Path, str]:
    """A shared add-on's table (`[adapters.NAME]`, `[controlnets.NAME]`): its `path`
    (relative to the models file) and its `family`, one of `families` (app/families.py
    ADDON_FAMILIES); `extra` keys are allowed too."""
    unknown = set(table) - {"path", "family", *extra}
    if unknown:
        raise DeclarationError(f"{what} {name!r}: unknown keys {sorted(unknown)}")
    if "path" not in table or table.get("family") not in families:
        raise DeclarationError(
            f"{what} {name!r}: path and family (one of {sorted(families)}) are required"
        )
    path = Path(table["path"]).expanduser()
    return (path if path.is_absolute() else base_dir / path), table["family"]


class AddonMissing(Exception):
    """What a job names that this worker cannot use: `code` is the job's error code
    (app/jobs/states.py ErrorCode's value)."""

    code: ClassVar[str] = "invalid_input"


@dataclass(frozen=True)
class Lookup:
    """What resolving a request's add-ons may read, given by the API: the catalog, the
    request's session and tenant (a tenant's stored add-ons), and `image`, which turns
    an input image's value (an upload's id or a `data:` URI) into its reference and what
    keeping it takes, or raises app.refused.FieldRefused naming the field."""

    catalog: Any
    session: Any
    tenant_id: Any
    image: Callable[[Any, str], tuple[Any, Any]]


@dataclass
class Resolved:
    """A request's add-ons of one kind as the job keeps them, the refusals by position
    (`{index: {field: [message]}}`) or for the whole list, and the input images to keep
    once the request is accepted."""

    items: tuple = ()
    errors: dict[Any, Any] | list[str] = field(default_factory=dict)
    keeps: list[Any] = field(default_factory=list)


class Addon:
    """One kind of add-on weight (see the module's text)."""

    # The request's field and the stored request's key ("loras", "controls").
    field: ClassVar[str]
    # What one is called in messages ("adapters", "controls").
    noun: ClassVar[str]
    # The catalog's table of shared ones ("adapters": `[adapters.NAME]`).
    table: ClassVar[str]
    # The item a job keeps: a frozen dataclass with `stored()` and a classmethod `of`.
    item: ClassVar[type]
    # What one adds to a job's work in the estimate (a fraction of the job's own).
    work: ClassVar[float]
    # The request's property that holds `set_key` (a batch field: app/kinds/base.py), and
    # whether the jobs table has a column of it (gathered by equality); without one, a
    # job with some runs in a call of its own (workers/gather.py).
    batch_field: ClassVar[str]
    column: ClassVar[bool] = False
    # The worker half: "module:attribute" (app/addons/<feature>/worker.py).
    worker: ClassVar[str]

    def of(self, values: Any) -> tuple:
        """The job's items from a request's or a stored row's values (None: none)."""
        item = self.item
        if isinstance(values, tuple) and all(isinstance(v, item) for v in values):
            return values
        return tuple(item.of(v) for v in values or ())

    def stored(self, items: Sequence[Any]) -> list[dict[str, Any]]:
        return [item.stored() for item in items]

    def canonical(self, items: Sequence[Any]) -> Any:
        """What identifies a set of items for `set_key` (every stored field, by default)."""
        return self.stored(items)

    def set_key(self, items: Sequence[Any]) -> str:
        """SHA-256 of the items ("" for none): jobs of one set may share a pipeline call."""
        if not items:
            return ""
        canonical = json.dumps(self.canonical(items), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def limit(self, spec: ModelSpec, kind: JobKind) -> int:
        """How many one job of `kind` on `spec`'s model may carry."""
        raise NotImplementedError

    def resolve(
        self, spec: ModelSpec, kind: JobKind, values: Sequence[Any], lookup: Lookup
    ) -> Resolved:
        """The request's `values` (its schema's, checked field by field) for `spec`'s
        model: at most `limit`, each one found and fitting the model's add-on family."""
        refused = self.too_many(spec, kind, len(values))
        if refused:
            return Resolved(errors=refused)
        return self.found(spec, values, lookup)

    def too_many(self, spec: ModelSpec, kind: JobKind, count: int) -> list[str]:
        """The refusal of `count` of them on a job of `kind` on `spec`'s model ([]: none)."""
        most = self.limit(spec, kind)
        if count <= most:
            return []
        return [f"At most {most} {self.noun} for model '{spec.name}' ({kind.name})."]

    def placeholders(self, count: int) -> tuple:
        """`count` items that stand for a job's in an estimate, where only their number
        counts (`work`)."""
        raise NotImplementedError

    def found(self, spec: ModelSpec, values: Sequence[Any], lookup: Lookup) -> Resolved:
        """`resolve`'s, past the count."""
        raise NotImplementedError

    def inputs(self, items: Sequence[Any]) -> dict[str, str]:
        """The input images the items carry, by field (their digests)."""
        return {}

    def prepare(self, job: Any, inputs: Mapping[str, Any], made: Mapping[str, Any]) -> dict:
        """What a call needs of the job's input images for these items (PIL, by a key of
        the add-on's), beside the kind's own `made`; made once per call."""
        return {}

    def call_keywords(self, kind: JobKind, job: Any, prepared: Mapping[str, Any]) -> dict:
        """The pipeline call's keywords for a call whose jobs share `job`'s items."""
        return {}

    def declared(self, name: str, table: dict, base_dir: Path) -> Any:
        """A shared one of the catalog, from its table (raises app.catalog.CatalogError)."""
        raise NotImplementedError

    def worker_half(self) -> Any:
        module, _, attribute = self.worker.partition(":")
        return getattr(importlib.import_module(module), attribute)


K = TypeVar("K")


class ByteCache(Generic[K]):
    """An LRU of values by key, bounded in bytes (each value's size, given when it is
    put) and optionally in count; what goes is handed to `on_evict`. At least one value
    is always kept, however large. Thread-safe."""

    def __init__(
        self,
        max_bytes: int,
        *,
        max_items: int = 0,
        on_evict: Callable[[K, Any], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_items = max_items
        self.on_evict = on_evict
        self._items: OrderedDict[K, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self.keys())

    @property
    def bytes(self) -> int:
        return self._bytes

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._items)

    def get(self, key: K) -> Any | None:
        """The value (now the most recent), or None."""
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: K, value: Any, size: int) -> None:
        """Keep `value` as the most recent; the least recent go while over a bound."""
        gone = []
        with self._lock:
            if key in self._items:
                self._bytes -= self._items.pop(key)[1]
            self._items[key] = (value, size)
            self._bytes += size
            while len(self._items) > 1 and self._over():
                old, (old_value, old_size) = self._items.popitem(last=False)
                self._bytes -= old_size
                gone.append((old, old_value))
        for old, old_value in gone:
            if self.on_evict is not None:
                self.on_evict(old, old_value)

    def _over(self) -> bool:
        if self.max_items and len(self._items) > self.max_items:
            return True
        return self._bytes > self.max_bytes

    def items(self) -> Mapping[K, Any]:
        with self._lock:
            return {key: value for key, (value, _) in self._items.items()}


class AddonWorker:
    """An add-on's worker half (app/addons/<feature>/worker.py): each step a no-op
    unless the feature needs it. `fetched` is what `fetch` returned for the jobs of the
    call (merged, by key)."""

    def fetch(self, rt: Any, model: Any, tenant_id: Any, items: Sequence[Any]) -> dict[str, Any]:
        """What the job's items need on this worker (read, parsed, loaded), by key;
        raises an AddonMissing for one that cannot be had."""
        return {}

    def before_call(self, model: Any, items: Sequence[Any], fetched: Mapping[str, Any]) -> None:
        """Made ready on the model's pipeline for a call with these items (under the
        model's lock)."""

    def pipeline_key(self, items: Sequence[Any]) -> tuple[str, ...]:
        """What the kind's derived pipeline is keyed by beside the kind (() : nothing)."""
        return ()

    def derive(self, items: Sequence[Any], fetched: Mapping[str, Any]) -> dict[str, Any]:
        """The keywords diffusers' `from_pipe` derives that pipeline with."""
        return {}

    def ran(self, rt: Any, items: Sequence[Any]) -> None:
        """A call with these items ran here."""
