"""A denoising run's state at a step boundary, and a run resumed from it.

What a diffusers call carries from one step to the next is small and all in three places:
the latents (what the step callback sees), the scheduler's own attributes (its step
index, the timesteps it set, a multistep solver's earlier model outputs, Heun's half
step) and each generator's RNG state (an ancestral scheduler draws noise every step).
Everything else the loop uses (prompt embeddings, an input image's latents, the mask) is
made before the loop from the job and its seed, and is made the same again.

So a resumed call runs the pipeline as usual with the same seeds, and skips the first
`step` steps: their denoiser calls give back the first one's output (the weights run once,
not `step` times), and at the boundary the saved latents, scheduler attributes and RNG
states replace whatever the skipped steps left. From there the call is the uninterrupted
one, bit for bit (tests/worker/test_resume.py, every scheduler family, images and video).

The state is written with `torch.save` and read back with `weights_only=True`: tensors,
numbers, strings, lists and dicts only (a NumPy array is carried as a tensor and its
dtype), so a checkpoint cannot run code when it is read.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

FORMAT = 1  # the layout below; a checkpoint of another is not resumed


class StateError(Exception):
    """The checkpoint cannot be resumed (the reason is the message): start afresh."""


@dataclass
class DenoiseState:
    """A single job's call after `step` of `total` steps."""

    step: int
    total: int
    latents: Any  # torch.Tensor, on the CPU
    scheduler: dict[str, Any]  # the scheduler's attributes, config left out
    generators: list[Any]  # each generator's RNG state (a CPU byte tensor)
    meta: dict[str, Any] = field(default_factory=dict)  # what it must match, its history


def capture(step: int, total: int, latents: Any, scheduler: Any, generators: list[Any]):
    """The state now (copies on the CPU: the call goes on changing its own)."""
    state = {k: _encode(v) for k, v in vars(scheduler).items() if k != "_internal_dict"}
    return DenoiseState(
        step=step,
        total=total,
        latents=latents.detach().to("cpu", copy=True),
        scheduler=state,
        generators=[g.get_state() for g in generators],
    )


def restore(state: DenoiseState, latents: Any, scheduler: Any, generators: list[Any]) -> Any:
    """Put the saved state into a running call; returns the latents to go on with."""
    import torch

    if tuple(state.latents.shape) != tuple(latents.shape) or state.latents.dtype != latents.dtype:
        raise StateError(
            f"latents {tuple(state.latents.shape)} {state.latents.dtype} do not fit the call's "
            f"{tuple(latents.shape)} {latents.dtype}"
        )
    if len(state.generators) != len(generators):
        raise StateError("the checkpoint has another number of generators")
    current = vars(scheduler)
    config = current.get("_internal_dict")
    devices = {k: v.device for k, v in current.items() if isinstance(v, torch.Tensor)}
    current.clear()
    if config is not None:
        current["_internal_dict"] = config
    for name, value in state.scheduler.items():
        current[name] = _decode(value, devices.get(name, latents.device))
    for generator, rng in zip(generators, state.generators, strict=True):
        generator.set_state(rng)
    return state.latents.to(latents.device)


def dumps(state: DenoiseState) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(
        {
            "format": FORMAT,
            "meta": state.meta,
            "step": state.step,
            "total": state.total,
            "latents": state.latents,
            "scheduler": state.scheduler,
            "generators": state.generators,
        },
        buffer,
    )
    return buffer.getvalue()


def loads(blob: bytes) -> DenoiseState:
    """The state in a checkpoint's bytes; StateError for anything else (truncated, another
    layout, not a checkpoint)."""
    import torch

    try:
        data = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise StateError(f"unreadable ({type(exc).__name__})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StateError(f"layout {data.get('format') if isinstance(data, dict) else '?'}")
    try:
        return DenoiseState(
            step=int(data["step"]),
            total=int(data["total"]),
            latents=data["latents"],
            scheduler=dict(data["scheduler"]),
            generators=list(data["generators"]),
            meta=dict(data["meta"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"incomplete ({exc})") from exc


# A NumPy value is carried as {_NUMPY: tensor, "dtype": name, "scalar": bool}.
_NUMPY = "__numpy__"


def _encode(value: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
        if array.dtype == object:
            raise StateError("a scheduler attribute holds Python objects")
        scalar = isinstance(value, np.generic)
        return {_NUMPY: torch.from_numpy(array.copy()), "dtype": str(array.dtype), "scalar": scalar}
    if isinstance(value, list | tuple):
        items = [_encode(v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise StateError(f"a scheduler attribute holds a {type(value).__name__}")


def _decode(value: Any, device: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict) and _NUMPY in value:
        array = value[_NUMPY].numpy().astype(value["dtype"])
        return array[()] if value["scalar"] else array
    if isinstance(value, list):
        return [_decode(v, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_decode(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _decode(v, device) for k, v in value.items()}
    return value


class SkippedDenoiser:
    """Stands in the pipeline for its denoiser while a resumed call skips the steps the
    checkpoint holds: the first call runs the real one (its output has the shape the loop
    needs), the rest give that output back. The skipped steps' results are all replaced
    at the boundary (`restore`)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self._output: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._output is None:
            self._output = self._real(*args, **kwargs)
        return self._output

    def __getattr__(self, name: str) -> Any:  # config, dtype, device: the real one's
        return getattr(self._real, name)
