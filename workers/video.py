"""A generated clip as an MP4 a browser plays: H.264 (libx264), yuv420p, the moov atom first
(`movflags=+faststart`, so playback starts before the last byte arrives).

Why PyAV: its wheel carries FFmpeg's libraries with libx264 built in, so nothing is
installed on the worker at run time and no binary is looked for on PATH; frames go from
memory to the encoder one at a time, in this process. (imageio-ffmpeg pipes raw frames to
an ffmpeg subprocess: a second process and a binary of its own to ship and find.) A clip is
never held as a list of PIL images or PNGs: each frame is converted to 8 bits and encoded
as it comes, so memory holds one frame beside the encoder's few reference frames.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

CONTENT_TYPE = "video/mp4"
EXTENSION = "mp4"


@dataclass(frozen=True)
class EncodedVideo:
    data: bytes
    content_type: str
    extension: str
    width: int
    height: int
    frames: int  # frames written
    fps: int
    codec: str  # "h264"
    encoder: str  # the encoder and the library versions that wrote it
    seconds: float  # frames / fps

    def __repr__(self) -> str:  # not the bytes
        return (
            f"EncodedVideo({self.width}x{self.height}, {self.frames} frames at {self.fps} fps, "
            f"{self.codec}, {len(self.data)} bytes)"
        )


def _uint8(frame) -> np.ndarray:
    """One H x W x 3 frame as uint8 RGB: uint8 as it is, floats 0..1 scaled, rounded and
    clipped (as diffusers' numpy_to_pil)."""
    array = np.asarray(frame)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"a frame is H x W x 3 (RGB), not {array.shape}")
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"a frame is uint8 or float 0..1, not {array.dtype}")
    return (np.clip(array, 0.0, 1.0) * 255.0).round().astype(np.uint8)


def poster(frame):
    """One frame (uint8, or float 0..1) as an RGB PIL image: a clip's still."""
    from PIL import Image

    return Image.fromarray(_uint8(frame)).convert("RGB")


def encoder_name() -> str:
    import av

    libavcodec = ".".join(str(part) for part in av.library_versions["libavcodec"])
    return f"libx264 via PyAV {av.__version__} (libavcodec {libavcodec})"


def encode_video(frames: Iterable, fps: int, *, crf: int = 23) -> EncodedVideo:
    """Encode `frames` (H x W x 3 arrays, uint8 or float 0..1, all one size; a 4-D array
    of them will do) at `fps` frames per second, one frame at a time. Width and height
    must be even (yuv420p halves the colour planes). `crf`: x264's constant rate factor,
    1 (best) to 51 (smallest); 23 is its default. Not 0: lossless H.264 is written in the
    High 4:4:4 Predictive profile, which browsers do not play."""
    import av

    if isinstance(fps, bool) or not isinstance(fps, int) or not 1 <= fps <= 240:
        raise ValueError(f"fps must be a whole number from 1 to 240, not {fps!r}")
    if isinstance(crf, bool) or not isinstance(crf, int) or not 1 <= crf <= 51:
        raise ValueError(f"crf must be a whole number from 1 to 51, not {crf!r}")
    iterator = iter(frames)
    try:
        first = _uint8(next(iterator))
    except StopIteration:
        raise ValueError("no frames to encode") from None
    height, width = first.shape[:2]
    if width % 2 or height % 2:
        raise ValueError(f"width and height must be even for yuv420p, not {width}x{height}")

    # The faststart pass rewrites the file to move the moov atom before the media: the
    # muxer needs a seekable file, not a pipe or a growing buffer.
    with tempfile.NamedTemporaryFile(suffix=f".{EXTENSION}") as tmp:
        container = av.open(tmp.name, mode="w", format="mp4", options={"movflags": "+faststart"})
        try:
            stream = container.add_stream("libx264", rate=Fraction(fps, 1))
            stream.width = width
            stream.height = height
            stream.pix_fmt = "yuv420p"
            stream.codec_context.time_base = Fraction(1, fps)
            stream.options = {"crf": str(crf)}
            count = 0
            frame = first
            while frame is not None:
                if frame.shape != first.shape:
                    raise ValueError(f"frame {count} is {frame.shape}, the first {first.shape}")
                video_frame = av.VideoFrame.from_ndarray(frame, format="rgb24")
                video_frame.pts = count
                container.mux(stream.encode(video_frame))
                count += 1
                following = next(iterator, None)
                frame = None if following is None else _uint8(following)
            container.mux(stream.encode(None))  # flush the encoder's delayed frames
        finally:
            container.close()
        tmp.seek(0, os.SEEK_SET)
        data = tmp.read()
    return EncodedVideo(
        data=data,
        content_type=CONTENT_TYPE,
        extension=EXTENSION,
        width=width,
        height=height,
        frames=count,
        fps=fps,
        codec="h264",
        encoder=encoder_name(),
        seconds=count / fps,
    )


def _top_level_boxes(data: bytes) -> list[str]:
    """The MP4's top-level box types in file order (ftyp, moov, mdat, ...)."""
    boxes = []
    offset = 0
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        kind = data[offset + 4 : offset + 8].decode("latin-1")
        if size == 1:  # a 64-bit size follows the type
            size = int.from_bytes(data[offset + 8 : offset + 16], "big")
        elif size == 0:  # to the end of the file
            size = len(data) - offset
        if size < 8:
            break
        boxes.append(kind)
        offset += size
    return boxes


def probe(data: bytes) -> dict:
    """Read an MP4 back: codec, pixel format, size, frames (decoded and counted), frame
    rate, duration in seconds, and whether the moov atom precedes mdat (faststart)."""
    import av

    boxes = _top_level_boxes(data)
    faststart = "moov" in boxes and "mdat" in boxes and boxes.index("moov") < boxes.index("mdat")
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        codec = stream.codec_context
        decoded = sum(1 for _ in container.decode(stream))
        rate = stream.average_rate or stream.guessed_rate
        duration = (
            float(stream.duration * stream.time_base)
            if stream.duration is not None
            else (container.duration or 0) / av.time_base
        )
        return {
            "codec": codec.name,
            "pix_fmt": codec.pix_fmt,
            "profile": codec.profile,
            "width": codec.width,
            "height": codec.height,
            "frames": decoded,
            "fps": float(rate) if rate else None,
            "duration": duration,
            "faststart": faststart,
            "boxes": boxes,
        }
