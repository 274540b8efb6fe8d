"""Encode generated images to bytes in the requested format."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

# format -> (Pillow format, content type, file extension, save options)
FORMATS: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "png": ("PNG", "image/png", "png", {"compress_level": 6}),
    "jpeg": ("JPEG", "image/jpeg", "jpg", {"quality": 90}),
    "webp": ("WEBP", "image/webp", "webp", {"quality": 90}),
}


@dataclass(frozen=True)
class EncodedImage:
    data: bytes
    content_type: str
    extension: str
    width: int
    height: int


def encode_image(image: Any, output_format: str) -> EncodedImage:
    pil_format, content_type, extension, options = FORMATS[output_format]
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, pil_format, **options)
    return EncodedImage(buffer.getvalue(), content_type, extension, image.width, image.height)
