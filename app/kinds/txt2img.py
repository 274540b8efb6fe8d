"""Text to image: a prompt (and optionally a negative prompt) becomes `num_images` images
of `width` x `height`, each from its own seed (seed, seed + 1, ...).

Every field of this kind is one every kind shares (app/kinds/base.py), so the module is
short: it names the kind, its request type and its diffusers pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.kinds.base import JobKind, JobRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class Txt2ImgRequest(JobRequest):
    kind: str = "txt2img"


class Txt2Img(JobKind):
    name = "txt2img"
    request_type = Txt2ImgRequest
    summary = "Text to image: images drawn from the prompt alone."
    pipeline = "AutoPipelineForText2Image"


KIND = Txt2Img()
