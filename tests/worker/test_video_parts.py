"""The building blocks of video jobs: tiny random-weight Wan (text and image to video) and
LTX-Video pipelines (workers/tiny_video.py) saved, loaded back and run on the CPU, with the
per-step callback the worker's progress and cancel rely on; and MP4 encoding with PyAV
(workers/video.py) read back by PyAV."""

from __future__ import annotations

import numpy as np
import pytest

from workers.tiny import build_tiny_model
from workers.video import encode_video, poster, probe

SIZE = {"height": 64, "width": 96, "num_frames": 9}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    import torch

    # The tiny models gain nothing from more threads, and a shared machine loses a lot.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _load(path):
    from diffusers import DiffusionPipeline

    pipeline = DiffusionPipeline.from_pretrained(path)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _run(pipeline, **inputs):
    """Two steps at SIZE as numpy frames, recording what the step callback sees."""
    import torch

    seen = []

    def callback(pipe, step, timestep, tensors):
        seen.append((step, pipe.num_timesteps, tuple(tensors["latents"].shape)))
        return tensors

    frames = pipeline(
        prompt="a red fox in the snow",
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
        callback_on_step_end=callback,
        callback_on_step_end_tensor_inputs=["latents"],
        **SIZE,
        **inputs,
    ).frames
    assert isinstance(frames, np.ndarray)
    assert frames.shape == (1, 9, 64, 96, 3)
    assert frames.dtype == np.float32
    assert 0.0 <= frames.min() <= frames.max() <= 1.0
    assert [(step, total) for step, total, _ in seen] == [(0, 2), (1, 2)]
    return frames, seen


def _image():
    """A first frame of another size and shape than the clip's: the pipelines resize it."""
    from PIL import Image

    gradient = np.linspace(0, 255, 40 * 24 * 3).reshape(24, 40, 3).astype(np.uint8)
    return Image.fromarray(gradient)


def test_tiny_wan_text_to_video_saves_loads_and_runs(tmp_path):
    pipeline = _load(build_tiny_model(tmp_path / "wan", family="wan"))
    assert type(pipeline).__name__ == "WanPipeline"
    config = pipeline.scheduler.config
    assert type(pipeline.scheduler).__name__ == "UniPCMultistepScheduler"
    assert (config.prediction_type, config.use_flow_sigmas, config.flow_shift) == (
        "flow_prediction",
        True,
        3.0,
    )
    frames, seen = _run(pipeline)
    # 16 latent channels; 9 frames -> 3 latent frames; 64 x 96 -> 8 x 12.
    assert seen[0][2] == (1, 16, 3, 8, 12)
    video = encode_video(frames[0], fps=16)
    assert probe(video.data)["frames"] == 9


def test_tiny_wan_image_to_video_saves_loads_and_runs(tmp_path):
    path = build_tiny_model(tmp_path / "wan-i2v", family="wan", image_to_video=True)
    pipeline = _load(path)
    assert type(pipeline).__name__ == "WanImageToVideoPipeline"
    assert pipeline.transformer.config.in_channels == 36
    assert pipeline.transformer.config.image_dim == pipeline.image_encoder.config.hidden_size
    _run(pipeline, image=_image())


def test_tiny_ltx_serves_text_and_image_to_video(tmp_path):
    from diffusers import LTXImageToVideoPipeline

    pipeline = _load(build_tiny_model(tmp_path / "ltx", family="ltx"))
    assert type(pipeline).__name__ == "LTXPipeline"
    assert pipeline.vae_spatial_compression_ratio == 32
    assert pipeline.vae_temporal_compression_ratio == 8
    _, seen = _run(pipeline)
    # LTX packs its latents: 2 latent frames x 2 x 3 positions of 8 channels.
    assert seen[0][2] == (1, 12, 8)
    image_to_video = LTXImageToVideoPipeline.from_pipe(pipeline)
    assert image_to_video.transformer is pipeline.transformer
    _run(image_to_video, image=_image())


def test_a_raising_step_callback_stops_the_video_pipeline(tmp_path):
    """The worker's cancel: an exception from the callback leaves at once (no decode)."""
    import torch

    from workers.tiny_video import build_tiny_ltx

    pipeline = build_tiny_ltx(0)
    pipeline.set_progress_bar_config(disable=True)
    steps = []

    class Stop(Exception):
        pass

    def callback(pipe, step, timestep, tensors):
        steps.append(step)
        raise Stop

    with pytest.raises(Stop):
        pipeline(
            prompt="x",
            num_inference_steps=3,
            generator=torch.Generator().manual_seed(0),
            output_type="np",
            callback_on_step_end=callback,
            **SIZE,
        )
    assert steps == [0]


def test_same_seed_same_weights():
    from workers.tiny_video import build_tiny_ltx, build_tiny_wan

    def weights(pipeline):
        return [
            tensor
            for name in ("transformer", "vae", "text_encoder")
            for tensor in getattr(pipeline, name).state_dict().values()
        ]

    for build in (build_tiny_wan, build_tiny_ltx):
        first, again, other = weights(build(1)), weights(build(1)), weights(build(2))
        assert all(a.equal(b) for a, b in zip(first, again, strict=True))
        assert not all(a.equal(b) for a, b in zip(first, other, strict=True))


def test_tiny_video_families_refuse_what_they_lack(tmp_path):
    with pytest.raises(ValueError, match="image to video"):
        build_tiny_model(tmp_path / "sd", image_to_video=True)
    with pytest.raises(ValueError, match="image to video"):
        build_tiny_model(tmp_path / "ltx", family="ltx", image_to_video=True)
    with pytest.raises(ValueError, match="inpainting"):
        build_tiny_model(tmp_path / "wan", family="wan", inpainting=True)
    assert not list(tmp_path.iterdir())


def _clip(frames=12, height=48, width=64) -> np.ndarray:
    """A smooth moving gradient, float 0..1: what H.264 keeps well."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    clip = np.empty((frames, height, width, 3), np.float32)
    for t in range(frames):
        clip[t, ..., 0] = (x + 2 * t) / (width + 2 * frames)
        clip[t, ..., 1] = y / height
        clip[t, ..., 2] = 0.5
    return clip


def _first_frame(data: bytes) -> np.ndarray:
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        frame = next(container.decode(video=0))
        return frame.to_ndarray(format="rgb24")


def test_encode_video_writes_a_faststart_h264_mp4():
    video = encode_video(iter(_clip()), fps=8)
    assert (video.width, video.height, video.frames, video.fps) == (64, 48, 12, 8)
    assert (video.content_type, video.extension, video.codec) == ("video/mp4", "mp4", "h264")
    assert video.seconds == 1.5
    assert video.encoder.startswith("libx264 via PyAV ")
    assert video.data[4:8] == b"ftyp"
    info = probe(video.data)
    assert info["codec"] == "h264"
    assert info["pix_fmt"] == "yuv420p"
    assert (info["width"], info["height"], info["frames"]) == (64, 48, 12)
    assert info["fps"] == 8.0
    assert info["duration"] == pytest.approx(1.5)
    assert info["faststart"] is True
    assert info["boxes"].index("moov") < info["boxes"].index("mdat")


def test_float_and_uint8_frames_encode_alike():
    clip = _clip()
    as_uint8 = (clip * 255).round().astype(np.uint8)
    from_float = _first_frame(encode_video(clip, fps=8).data).astype(int)
    from_uint8 = _first_frame(encode_video(list(as_uint8), fps=8).data).astype(int)
    assert from_float.shape == (48, 64, 3)
    # Not byte for byte: libx264 here does not write the same bytes twice for the same
    # frames (a few levels apart decoded), whatever the input's type.
    assert np.abs(from_float - from_uint8).mean() < 2
    assert np.abs(from_float - from_uint8).max() <= 24
    # Lossy, but close to what went in.
    assert np.abs(from_float - as_uint8[0]).mean() < 4
    still = poster(clip[0])
    assert (still.mode, still.size) == ("RGB", (64, 48))
    assert np.array_equal(np.asarray(still), np.asarray(poster(as_uint8[0])))


def test_encode_video_refuses_what_it_cannot_write():
    with pytest.raises(ValueError, match="even"):
        encode_video(np.zeros((3, 47, 64, 3), np.uint8), fps=8)
    with pytest.raises(ValueError, match="even"):
        encode_video(np.zeros((3, 48, 63, 3), np.float32), fps=8)
    with pytest.raises(ValueError, match="no frames"):
        encode_video([], fps=8)
    with pytest.raises(ValueError, match="H x W x 3"):
        encode_video(np.zeros((3, 48, 64), np.uint8), fps=8)
    with pytest.raises(ValueError, match="frame 1"):
        encode_video([np.zeros((48, 64, 3), np.uint8), np.zeros((32, 64, 3), np.uint8)], fps=8)
    with pytest.raises(ValueError, match="fps"):
        encode_video(_clip(), fps=0)
    with pytest.raises(ValueError, match="crf"):
        encode_video(_clip(), fps=8, crf=0)
