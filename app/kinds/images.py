"""What the kinds that start from an image share: their API fields, the output size an
input gives, masks, and the "only masked" crop and its paste back (PIL only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.catalog import ModelSpec


@dataclass(frozen=True)
class InputRef:
    """What a request needs of a stored input image (app/uploads.py): its digest, size
    and mode. The request keeps the digest."""

    sha256: str
    width: int
    height: int
    mode: str


def image_field(kinds: str, description: str):
    import marshmallow as ma

    class InputField(ma.fields.String):
        """An upload's id or a `data:` URI; an image the API checked itself (an OpenAI
        edit's part: not a string, never from a JSON body) passes as it is."""

        def _deserialize(self, value, attr, data, **kwargs):
            if hasattr(value, "png") and hasattr(value, "sha256"):
                return value
            return super()._deserialize(value, attr, data, **kwargs)

    return InputField(
        load_default=None,
        metadata={
            "description": f"{description} An upload's id (`POST /v1/uploads`) or a `data:` "
            f"URI of a PNG, JPEG or WebP image (at most DIFFQ_DATA_URI_MAX_BYTES). Kinds: "
            f"{kinds}.",
            "example": "01a1f3c2-7b7e-7c4d-9a59-3f2f0d1c8e11",
        },
    )


def strength_field():
    import marshmallow as ma
    from marshmallow import validate

    return ma.fields.Float(
        load_default=None,
        allow_nan=False,
        validate=validate.Range(min=0.0, max=1.0),
        metadata={
            "description": "How much of the image is redrawn, 0..1: the denoising runs "
            "`int(steps x strength)` of its steps (what progress counts to). Default 0.75 "
            "for `img2img`, 1.0 for `inpaint`. Kinds: img2img, inpaint.",
            "example": 0.6,
        },
    )


def fit_size(spec: ModelSpec, width: int, height: int) -> tuple[int, int]:
    """The output size an input of `width` x `height` gives on this model: the same
    shape, rounded down to the model's multiple, scaled down (never up, unless below
    `min_size`) into its limits; on a model whose sizes are required, the tier nearest in
    shape."""
    if spec.sizes_required and spec.size_tiers:
        aspect = width / height
        return min(
            spec.size_tiers,
            key=lambda tier: (
                abs(tier[0] / tier[1] - aspect),
                abs(tier[0] * tier[1] - width * height),
            ),
        )
    scale = min(
        1.0,
        spec.max_width / width,
        spec.max_height / height,
        (spec.max_pixels / (width * height)) ** 0.5,
    )
    multiple = spec.size_multiple

    def side(value: float, most: int) -> int:
        rounded = int(value) // multiple * multiple
        return min(most // multiple * multiple, max(spec.min_size, rounded))

    return side(width * scale, spec.max_width), side(height * scale, spec.max_height)


def resized(image: Any, width: int, height: int) -> Any:
    """`image` at `width` x `height` (itself when it is that size already)."""
    from PIL import Image

    if image.size == (width, height):
        return image
    return image.resize((width, height), resample=Image.Resampling.LANCZOS)


def as_mask(image: Any) -> Any:
    """A mask from any stored image: its lightness (white = repaint, black = keep), a
    fully transparent pixel counting as black."""
    from PIL import Image

    if image.mode in ("RGBA", "LA"):
        black = Image.new("RGBA", image.size, (0, 0, 0, 255))
        image = Image.alpha_composite(black, image.convert("RGBA"))
    return image.convert("L")


def blurred(mask: Any, radius: int) -> Any:
    from PIL import ImageFilter

    return mask.filter(ImageFilter.GaussianBlur(radius)) if radius > 0 else mask


def masked_box(mask: Any, padding: int, width: int, height: int) -> tuple[int, int, int, int]:
    """The region an "only masked" inpainting redraws, as A1111 does: the mask's bounding
    box, `padding` pixels wider on each side, grown to the output's shape, inside the
    image. The whole image when nothing is masked."""
    box = mask.point(lambda v: 255 if v > 0 else 0).getbbox()
    image_w, image_h = mask.size
    if box is None:
        return 0, 0, image_w, image_h
    left, top, right, bottom = box
    left, top = max(0, left - padding), max(0, top - padding)
    right, bottom = min(image_w, right + padding), min(image_h, bottom + padding)
    # Grow the shorter side to the output's aspect ratio, centred, as far as the image allows.
    box_w, box_h = right - left, bottom - top
    aspect = width / height
    if box_w / box_h < aspect:
        grow = min(image_w, round(box_h * aspect)) - box_w
        left = max(0, min(left - grow // 2, image_w - (box_w + grow)))
        right = left + box_w + grow
    else:
        grow = min(image_h, round(box_w / aspect)) - box_h
        top = max(0, min(top - grow // 2, image_h - (box_h + grow)))
        bottom = top + box_h + grow
    return left, top, right, bottom
