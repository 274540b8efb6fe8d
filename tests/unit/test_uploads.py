"""Input images are checked at upload, never first in a worker: real PNG, JPEG or WebP
only, a pixel limit read from the header before decoding, decoded in full (a truncated or
lying file refused), EXIF orientation applied, transparency kept only where it hides
something; and the sizes and regions the image kinds derive from them."""

from __future__ import annotations

import base64
import io
import struct
import time
import zlib
from pathlib import Path

import pytest
from PIL import Image

from app.catalog import tiny_spec
from app.kinds.images import fit_size, masked_box
from app.uploads import InputRefused, decode, decode_data_uri

LIMIT = 4096 * 4096


def _encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height`, with almost no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 16)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_each_format_is_stored_as_png_with_its_digest(fmt):
    image = Image.new("RGB", (40, 30), (200, 10, 10))
    stored = decode(_encoded(image, fmt), field="file", max_pixels=LIMIT)
    assert (stored.width, stored.height, stored.mode) == (40, 30, "RGB")
    again = Image.open(io.BytesIO(stored.png))
    assert again.format == "PNG" and again.size == (40, 30)
    import hashlib

    assert stored.sha256 == hashlib.sha256(stored.png).hexdigest()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "Empty"),
        (b"%PDF-1.4 not an image at all", "Not an image"),
        (_encoded(Image.new("RGB", (8, 8)), "GIF"), "A GIF image"),
        (_encoded(Image.new("RGB", (64, 64)), "PNG")[:-40], "truncated or damaged"),
    ],
)
def test_what_is_not_a_usable_image_is_refused_naming_the_field(data, says):
    with pytest.raises(InputRefused) as refused:
        decode(data, field="image", max_pixels=LIMIT)
    assert refused.value.field == "image" and says in refused.value.message


def test_a_header_past_the_pixel_limit_is_refused_before_any_decoding():
    bomb = _png_header(30000, 30000)
    started = time.perf_counter()
    with pytest.raises(InputRefused, match=f"pixels: at most {LIMIT}"):
        decode(bomb, field="image", max_pixels=LIMIT)
    assert time.perf_counter() - started < 1.0  # nothing of 900 megapixels was decoded
    with pytest.raises(InputRefused, match="truncated or damaged"):  # within the limit: lies
        decode(_png_header(64, 64), field="image", max_pixels=LIMIT)


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (40, 20), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 10, 20))  # red on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    stored = decode(_encoded(image, "JPEG", exif=exif), field="image", max_pixels=LIMIT)
    upright = Image.open(io.BytesIO(stored.png))
    assert upright.size == (20, 40)
    red, _, blue = upright.getpixel((10, 2))
    assert red > 200 and blue < 60  # the red strip is now on top


def test_transparency_is_kept_only_where_it_hides_something():
    clear = Image.new("RGBA", (16, 16), (10, 20, 30, 255))
    clear.putpixel((3, 3), (0, 0, 0, 0))
    assert decode(_encoded(clear, "PNG"), field="image", max_pixels=LIMIT).mode == "RGBA"
    opaque = Image.new("RGBA", (16, 16), (10, 20, 30, 255))
    assert decode(_encoded(opaque, "PNG"), field="image", max_pixels=LIMIT).mode == "RGB"
    mask = decode(_encoded(clear, "PNG"), field="mask", max_pixels=LIMIT, mask=True)
    assert mask.mode == "L"


def test_data_uris_decode_within_their_limit():
    png = _encoded(Image.new("RGB", (8, 8)), "PNG")
    uri = "data:image/png;base64," + base64.b64encode(png).decode()
    assert decode_data_uri(uri, field="image", max_bytes=len(png)) == png
    with pytest.raises(InputRefused) as over:
        decode_data_uri(uri, field="image", max_bytes=len(png) - 1)
    assert over.value.status == 413 and "DIFFQ_DATA_URI_MAX_BYTES" in over.value.message
    with pytest.raises(InputRefused, match="base64"):
        decode_data_uri("data:image/png,not-base64", field="image", max_bytes=1000)
    with pytest.raises(InputRefused, match="does not decode"):
        decode_data_uri("data:image/png;base64,@@@@", field="image", max_bytes=1000)


def test_the_output_size_follows_the_input_within_the_models_limits():
    spec = tiny_spec(Path("/x"))  # 64..512 a side, 512² pixels, multiple of 8
    assert fit_size(spec, 300, 200) == (296, 200)
    assert fit_size(spec, 2000, 1000) == (512, 256)  # scaled down, shape kept
    assert fit_size(spec, 30, 30) == (64, 64)  # never below min_size
    from dataclasses import replace

    tiered = replace(spec, sizes=("64x64", "128x64", "64x128"), sizes_required=True)
    assert fit_size(tiered, 1000, 480) == (128, 64)  # the tier nearest in shape


def test_the_masked_region_is_the_masks_box_padded_and_grown_to_the_outputs_shape():
    mask = Image.new("L", (200, 100), 0)
    mask.paste(255, (90, 40, 110, 60))
    left, top, right, bottom = masked_box(mask, 10, 64, 64)
    assert (left, top, right, bottom) == (80, 30, 120, 70)  # 20 + 2 x 10 each way, square
    left, top, right, bottom = masked_box(mask, 10, 128, 64)
    assert (right - left) / (bottom - top) == 2 and left <= 80 and right >= 120
    assert masked_box(Image.new("L", (50, 40), 0), 10, 64, 64) == (0, 0, 50, 40)
