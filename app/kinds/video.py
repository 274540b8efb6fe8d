"""Video: a prompt (`txt2vid`), or a prompt and a first frame (`img2vid`), becomes one clip
of `num_frames` frames at `width` x `height`, played at `fps`, delivered as an MP4 (H.264)
with a poster frame (workers/video.py).

A video model's family (app/families.py `wan`, `ltx`) sets the rules: a clip has k x step
+ 1 frames (its VAE compresses time by `frame_step`: 4 for Wan, 8 for LTX-Video), sizes are
multiples of the family's, and which diffusers pipeline each kind runs on. A job makes one
clip (`num_images` is 1) and runs alone (a clip fills the GPU: max_batch is 1).

An `img2vid` input image of another shape than the clip is cropped to the clip's shape
around its centre, then resized (never stretched): the first frame is the image as framed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.kinds.base import JobKind, JobRequest
from app.kinds.images import InputRef, image_field

if TYPE_CHECKING:
    from app.catalog import ModelSpec

IMAGE_KINDS = "img2img, inpaint, img2vid"


def frames_for_seconds(spec: ModelSpec, seconds: float, fps: int | None = None) -> int:
    """The frame count nearest `seconds` at `fps` (the model's by default) under the model's
    k x step + 1 rule (at least one step)."""
    step = spec.frame_step
    wanted = seconds * (fps or spec.fps)
    return max(1, round((wanted - 1) / step)) * step + 1


def allowed_frames(spec: ModelSpec) -> str:
    step = spec.frame_step
    return f"{step + 1}, {2 * step + 1}, ... {spec.max_frames} (k x {step} + 1)"


@dataclass(frozen=True, slots=True, kw_only=True)
class VideoRequest(JobRequest):
    kind: str = "txt2vid"
    num_frames: int
    fps: int

    @property
    def pixels(self) -> int:
        return self.width * self.height * self.num_frames

    @property
    def work_units(self) -> int:
        """Steps x frames: a frame weighs as an image in the queue's ETA, fair share and
        backlog; each model's measured seconds per unit (app/jobs/estimate.py) calibrate
        what a frame of that model really costs."""
        return max(1, self.denoise_steps) * self.num_frames

    @property
    def seconds(self) -> float:
        return self.num_frames / self.fps


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageToVideoRequest(VideoRequest):
    kind: str = "img2vid"
    image: str  # the first frame's SHA-256 (app/uploads.py)


def _video_fields() -> dict[str, Any]:
    import marshmallow as ma

    return {
        "num_frames": ma.fields.Integer(
            strict=True,
            load_default=None,
            metadata={
                "description": "Frames in the clip: k x the family's step + 1 (Wan: 4k + 1, "
                "LTX-Video: 8k + 1), up to the model's `max_frames`; default its "
                "`default_frames`. Kinds: txt2vid, img2vid.",
                "example": 33,
            },
        ),
        "fps": ma.fields.Integer(
            strict=True,
            load_default=None,
            metadata={
                "description": "Frames per second the clip plays at, 1..the model's `max_fps`; "
                "default the model's own (Wan 16, LTX-Video 24). The model makes the same "
                "frames at any fps. Kinds: txt2vid, img2vid.",
                "example": 16,
            },
        ),
    }


class TextToVideo(JobKind):
    name = "txt2vid"
    request_type = VideoRequest
    summary = "Text to video: a clip drawn from the prompt (a video model: family wan or ltx)."
    pipeline = "WanPipeline"  # the family's (app/families.py `pipelines`) decides
    video = True
    # A clip runs alone; these still key the result cache and the estimate's history.
    batch_fields = (*JobKind.batch_fields, "num_frames")

    def api_fields(self) -> dict[str, Any]:
        return _video_fields()

    def limit_errors(self, spec: ModelSpec, data: Mapping[str, Any]) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = {}
        frames = data.get("num_frames")
        if frames is not None and not (
            spec.frame_step + 1 <= frames <= spec.max_frames and (frames - 1) % spec.frame_step == 0
        ):
            errors["num_frames"] = [
                f"Must be one of {allowed_frames(spec)} for model '{spec.name}'."
            ]
        fps = data.get("fps")
        if fps is not None and not 1 <= fps <= spec.max_fps:
            errors["fps"] = [f"Must be between 1 and {spec.max_fps} for model '{spec.name}'."]
        if data.get("num_images", 1) != 1:
            errors["num_images"] = ["A video job makes one clip: leave num_images out or 1."]
        return errors

    def own_fields(self, spec: ModelSpec, data: Mapping[str, Any]) -> dict[str, Any]:
        frames, fps = data.get("num_frames"), data.get("fps")
        return {
            "num_frames": spec.default_frames if frames is None else frames,
            "fps": spec.fps if fps is None else fps,
        }

    def warm_up(self, spec: ModelSpec) -> tuple[JobRequest, dict[str, Any]]:
        side = spec.min_size
        steps = spec.min_steps
        data = {"prompt": "warm-up", "width": side, "height": side, "steps": steps, "seed": 0}
        return self.normalize(spec, {**data, "num_frames": spec.frame_step + 1}), {}

    def call_arguments(
        self, jobs: Sequence[JobRequest], inputs: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        (job,) = jobs  # a clip runs alone
        assert isinstance(job, VideoRequest)
        return {
            "prompt": job.prompt,
            "negative_prompt": job.negative_prompt or None,
            "width": job.width,
            "height": job.height,
            "num_frames": job.num_frames,
            "num_inference_steps": job.steps,
            "guidance_scale": job.guidance_scale,
            "num_videos_per_prompt": 1,
            # Frames as float arrays, encoded one at a time (workers/video.py): no PIL list.
            "output_type": "np",
            # LTX-Video's rotary embeddings scale time by it (dropped where not taken).
            "frame_rate": job.fps,
        }

    def outputs(self, output: Any) -> list[Any]:
        """The pipeline's clips, one per row: each an array of frames (F, H, W, 3)."""
        return list(output.frames)


class ImageToVideo(TextToVideo):
    name = "img2vid"
    request_type = ImageToVideoRequest
    summary = (
        "Image to video: a clip whose first frame is the input `image` (cropped to the "
        "clip's shape and resized), moved by the prompt (family ltx, or a Wan "
        "image-to-video model)."
    )
    pipeline = "WanImageToVideoPipeline"
    image_fields = ("image",)

    def api_fields(self) -> dict[str, Any]:
        return {
            "image": image_field(IMAGE_KINDS, "The input image (img2vid: the first frame)."),
            **_video_fields(),
        }

    def limit_errors(self, spec: ModelSpec, data: Mapping[str, Any]) -> dict[str, list[str]]:
        errors = super().limit_errors(spec, data)
        if data.get("image") is None:
            errors["image"] = [f"Required for kind '{self.name}'."]
        return errors

    def own_fields(self, spec: ModelSpec, data: Mapping[str, Any]) -> dict[str, Any]:
        return {**super().own_fields(spec, data), "image": data["image"].sha256}

    def prepare(self, job: JobRequest, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"image": cropped_to(inputs["image"].convert("RGB"), job.width, job.height)}

    def call_arguments(
        self, jobs: Sequence[JobRequest], inputs: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        return {**super().call_arguments(jobs, inputs), "image": inputs[0]["image"]}

    def warm_up(self, spec: ModelSpec) -> tuple[JobRequest, dict[str, Any]]:
        from PIL import Image

        side = spec.min_size
        gray = Image.new("RGB", (side, side), (128, 128, 128))
        data = {"prompt": "warm-up", "steps": spec.min_steps, "seed": 0}
        data["num_frames"] = spec.frame_step + 1
        request = self.normalize(spec, {**data, "image": InputRef("warm-up", side, side, "RGB")})
        return request, {"image": gray}


def cropped_to(image: Any, width: int, height: int) -> Any:
    """`image` cropped around its centre to the shape width:height, then resized to it."""
    from PIL import ImageOps

    if image.size == (width, height):
        return image
    return ImageOps.fit(image, (width, height), centering=(0.5, 0.5))


TXT2VID = TextToVideo()
IMG2VID = ImageToVideo()
