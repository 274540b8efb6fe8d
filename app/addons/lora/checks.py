"""LoRA adapters: checked once, at upload, from the safetensors header alone (no torch,
nothing unpickled), stored under the tenant's prefix by digest, named by jobs.

An adapter must be a safetensors file: an 8-byte little-endian header length, a JSON
header naming each tensor's dtype, shape and byte range, then the bytes. Anything else
(a pickle, a `.bin`/`.ckpt` checkpoint, a zip) is refused before any of it is
interpreted; a file whose tensors run past its end is truncated. Its keys must be LoRA
pairs (the diffusers/PEFT `lora_A`/`lora_B` form or kohya's `lora_down`/`lora_up`), each
pair of one rank, at most `MAX_RANK`, and they must fit the base model's family
(`FAMILIES`): its denoiser (a UNet's keys for Stable Diffusion, a transformer's for FLUX,
in the diffusers form), a UNet's cross-attention projection's input the family's text
embedding width (768 for SD 1.5, 2048 for SDXL), a FLUX attention projection's the
transformer's width (3072), a text encoder's its hidden size, and a second text encoder
only where the family has one. So an SDXL LoRA for an SD 1.5 model, or an SD one for a
FLUX model, is refused at upload, naming the mismatch, never found out by a worker.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from dataclasses import dataclass
from typing import Any

from app.refused import FieldRefused

# The largest rank an adapter may have (r of A: r x in, B: out x r).
MAX_RANK = 256
# A request's adapter scale: -SCALE_LIMIT..SCALE_LIMIT.
SCALE_LIMIT = 2.0
# A header longer than this is not a LoRA's (SDXL LoRAs' headers are ~200 kB).
MAX_HEADER_BYTES = 16 * 1024 * 1024
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


@dataclass(frozen=True)
class Family:
    """What a base model family's LoRAs must fit: its cross-attention input width (the
    text embedding; a FLUX transformer's joint attention reads the T5's), its text
    encoders' hidden sizes (one or two), and its denoiser: a UNet, or a transformer whose
    attention projections take `inner_dim` features."""

    name: str
    cross_attention_dim: int
    text_hidden: tuple[int, ...]
    denoiser: str = "unet"
    inner_dim: int = 0


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("sd15", 768, (768,)),
        Family("sd2", 1024, (1024,)),
        Family("sdxl", 2048, (768, 1280)),
        Family("tiny", 32, (32,)),  # workers/tiny.py
        Family("flux", 4096, (768,), "transformer", 3072),
        Family("tiny-flux", 32, (32,), "transformer", 32),  # workers/tiny_flow.py
    )
}


class AdapterRefused(FieldRefused):
    """An adapter no job could run with; `field` names the request's field."""


@dataclass(frozen=True)
class CheckedAdapter:
    data: bytes
    sha256: str
    rank: int
    pairs: int  # adapted layers
    family: str


def read_header(data: bytes, *, field: str) -> dict[str, Any]:
    """The safetensors header of `data` (tensors by name: dtype, shape, data_offsets),
    checked against the file: every range inside the data, of the size its shape says."""
    not_safetensors = AdapterRefused(
        field,
        "Not a safetensors file: send the adapter as .safetensors "
        "(pickled .bin, .pt or .ckpt checkpoints are refused).",
    )
    if len(data) < 8:
        raise AdapterRefused(field, "Truncated: shorter than a safetensors header.")
    (length,) = struct.unpack("<Q", data[:8])
    if length < 2 or length > MAX_HEADER_BYTES or data[8:9] != b"{":
        raise not_safetensors
    if 8 + length > len(data):
        raise AdapterRefused(field, "Truncated: the file ends inside its safetensors header.")
    try:
        header = json.loads(data[8 : 8 + length])
    except (UnicodeDecodeError, ValueError) as exc:
        raise not_safetensors from exc
    if not isinstance(header, dict):
        raise not_safetensors
    body = len(data) - 8 - length
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = 0
    for name, entry in tensors.items():
        try:
            dtype, shape, (start, stop) = entry["dtype"], entry["shape"], entry["data_offsets"]
            size = DTYPE_BYTES[dtype] * math.prod(int(s) for s in shape)
        except (KeyError, TypeError, ValueError) as exc:
            raise AdapterRefused(field, f"Tensor {name!r}: a malformed header entry.") from exc
        if stop > body:
            raise AdapterRefused(field, "Truncated: its tensors run past the end of the file.")
        if not 0 <= start <= stop or stop - start != size:
            raise AdapterRefused(field, f"Tensor {name!r}: its byte range does not fit its shape.")
        end = max(end, stop)
    if not tensors:
        raise AdapterRefused(field, "No tensors: an empty adapter.")
    return tensors


# diffusers / PEFT: unet.<module>.lora_A.weight (also .lora.down.weight), transformer.<…>
# (FLUX), text_encoder[_2].
_PEFT = re.compile(
    r"^(?P<component>unet|transformer|text_encoder|text_encoder_2)\.(?P<module>.+?)"
    r"\.(?:(?P<peft>lora_[AB])\.weight|lora\.(?P<old>down|up)\.weight|(?P<alpha>alpha))$"
)
# kohya: lora_unet_<module>.lora_down.weight, lora_te[1|2]_<module>…, <prefix>.alpha
_KOHYA = re.compile(
    r"^lora_(?P<component>unet|te|te1|te2)_(?P<module>[^.]+)"
    r"\.(?:lora_(?P<part>down|up)\.weight|(?P<alpha>alpha))$"
)
_COMPONENTS = {"unet": "unet", "transformer": "transformer"}
_COMPONENTS |= {"text_encoder": "te1", "te": "te1", "te1": "te1"}
_COMPONENTS |= {"text_encoder_2": "te2", "te2": "te2"}


def _parse_key(key: str) -> tuple[str, str, str] | None:
    """(component: unet/transformer/te1/te2, module with dots as underscores, part:
    down/up/alpha)."""
    match = _PEFT.match(key)
    if match:
        part = (
            "alpha"
            if match["alpha"]
            else {"lora_A": "down", "lora_B": "up"}.get(match["peft"] or "", match["old"])
        )
        module = match["module"].replace(".", "_")
        return _COMPONENTS[match["component"]], module, part
    match = _KOHYA.match(key)
    if match:
        part = "alpha" if match["alpha"] else match["part"]
        return _COMPONENTS[match["component"]], match["module"], part
    return None


def check_lora(tensors: dict[str, Any], family: Family, *, field: str) -> tuple[int, int]:
    """(rank, adapted layers) of a LoRA that fits `family`; refused otherwise, naming
    the first key that does not."""
    layers: dict[tuple[str, str], dict[str, list[int]]] = {}
    for key, entry in tensors.items():
        parsed = _parse_key(key)
        if parsed is None:
            raise AdapterRefused(
                field,
                f"Not a LoRA key: {key!r} (expected diffusers/PEFT lora_A/lora_B or "
                "kohya lora_down/lora_up keys).",
            )
        component, module, part = parsed
        layers.setdefault((component, module), {})[part] = list(entry["shape"])
    rank = 0
    for (component, module), parts in layers.items():
        where = f"{component} {module}"
        if "down" not in parts or "up" not in parts:
            raise AdapterRefused(field, f"{where}: a LoRA layer needs both its down and up.")
        down, up = parts["down"], parts["up"]
        if len(down) not in (2, 4) or len(up) != len(down):
            raise AdapterRefused(field, f"{where}: down {down} and up {up} are not LoRA weights.")
        if down[0] != up[1]:
            raise AdapterRefused(
                field, f"Rank mismatch at {where}: down has rank {down[0]}, up {up[1]}."
            )
        if not 1 <= down[0] <= MAX_RANK:
            raise AdapterRefused(field, f"Rank {down[0]} at {where}: at most {MAX_RANK}.")
        rank = max(rank, down[0])
        width = down[1]
        if component == "unet" and re.match(r"(double|single)_blocks_", module):
            raise AdapterRefused(
                field,
                f"{where}: kohya's FLUX form is not taken; save it in the diffusers form "
                "(transformer.<module>.lora_A.weight), as diffusers' converters do.",
            )
        if component in ("unet", "transformer") and component != family.denoiser:
            raise AdapterRefused(
                field,
                f"Not for the {family.name} family: made for a {component} "
                f"({'FLUX' if component == 'transformer' else 'Stable Diffusion'}), "
                f"{family.name} models have a {family.denoiser}.",
            )
        projection = re.search(r"attn_(to_[qkv]|add_[qkv]_proj)$", module)
        if component == "transformer" and projection and width != family.inner_dim:
            raise AdapterRefused(
                field,
                f"Not for the {family.name} family: {where} takes {width} features, "
                f"{family.name} models' attention takes {family.inner_dim}.",
            )
        if component == "te2" and len(family.text_hidden) < 2:
            raise AdapterRefused(
                field,
                f"Made for a model with two text encoders (SDXL): {family.name} models have one.",
            )
        cross = component == "unet" and re.search(r"attn2_to_[kv]$", module)
        if cross and width != family.cross_attention_dim:
            raise AdapterRefused(
                field,
                f"Not for the {family.name} family: {where} takes {width} features, "
                f"{family.name} models' cross-attention takes {family.cross_attention_dim}.",
            )
        if component in ("te1", "te2") and re.search(r"(q|k|v)_proj$", module):
            hidden = family.text_hidden[0 if component == "te1" else -1]
            if width != hidden:
                raise AdapterRefused(
                    field,
                    f"Not for the {family.name} family: {where} takes {width} features, "
                    f"its text encoder has {hidden}.",
                )
    return rank, len(layers)


def check(data: bytes, family: Family, *, field: str, max_bytes: int) -> CheckedAdapter:
    """A LoRA checked for `family` (raises AdapterRefused naming `field`)."""
    if len(data) > max_bytes:
        raise AdapterRefused(
            field, f"{len(data)} bytes: at most {max_bytes} (DIFFQ_ADAPTER_MAX_BYTES).", 413
        )
    if not data:
        raise AdapterRefused(field, "Empty: send a .safetensors LoRA.")
    tensors = read_header(data, field=field)
    rank, pairs = check_lora(tensors, family, field=field)
    return CheckedAdapter(data, hashlib.sha256(data).hexdigest(), rank, pairs, family.name)
