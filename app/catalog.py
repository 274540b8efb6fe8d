"""The operator's model catalog: where each model lives, its limits and its queue."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from app.addons import ADDONS
from app.addons.base import DeclarationError
from app.addons.controlnet import ControlNetSpec
from app.addons.lora import AdapterSpec
from app.config import Settings
from app.families import ADDON_FAMILIES, DEFAULT_FAMILY, FAMILIES
from app.presets import PRESETS
from app.quality import DEFAULT_TIER, Tier, TierError, model_tiers
from app.rules import MAX_STEPS, SCHEDULER_NAMES, schedulers_for
from app.rules import SCHEDULERS as SCHEDULER_TABLE

# RabbitMQ closes the channel of a delivery left unacked for consumer_timeout (30 min by
# default) and requeues it. The broker's value is DIFFQ_BROKER_CONSUMER_TIMEOUT (deploy/
# raises it for video models). A model whose jobs cannot span deliveries must end its
# hard time limit well before it; one whose jobs checkpoint and run alone
# (`spans_deliveries`) hands a long job back before it instead (`hand_back_margin`), and
# its time limits are a budget across deliveries (docs/reliability.md).
CONSUMER_TIMEOUT_SECONDS = 1800
TIME_LIMIT_HEADROOM_SECONDS = 300


def hand_back_margin(consumer_timeout: float) -> float:
    """Seconds before the broker's consumer_timeout at which a delivery of a model whose
    jobs span deliveries hands its job back (workers/checkpoints.py): room for a step
    that runs later than its pace said, the checkpoint's upload, the hand-back's write
    and the requeue. The larger of 60 s and a tenth of the timeout (180 s of RabbitMQ's
    default 30 min, 720 s of 2 h), but at most half of it, so that a broker set to a few
    seconds (the fault suite's) still leaves a delivery half its time."""
    return min(max(60.0, consumer_timeout / 10), consumer_timeout / 2)


DTYPES = ("float32", "float16", "bfloat16")
QUANTIZATIONS = ("", "int8", "fp8")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
# What of a denoiser torch.compile compiles (workers/compiled.py): all of it, its repeated
# blocks (regional compilation), or "auto": the blocks of a transformer that names them.
COMPILE_SCOPES = ("auto", "model", "blocks")
# diffusers' attention backends a model may name (workers/attention.py), or "auto":
# FlashAttention 3 on a GPU where its package is installed, else PyTorch's SDPA ("native").
# The `_hub` backends are left out: they fetch kernels from the Hugging Face Hub.
ATTENTION_BACKENDS = (
    "auto",
    "native",
    "flash",
    "_flash_3",
    "sage",
    "flex",
    "_native_cudnn",
    "_native_efficient",
    "_native_flash",
    "_native_math",
)
# Every scheduler a model may offer: app/rules.py's table (a test runs each on the worker).
SCHEDULERS = SCHEDULER_NAMES


class CatalogError(ValueError):
    """The models file is missing, malformed or asks for something unsafe."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: Path
    queue: str
    dtype: str = "float16"
    min_size: int = 64
    max_width: int = 1024
    max_height: int = 1024
    max_pixels: int = 1024 * 1024
    size_multiple: int = 8
    default_width: int = 512
    default_height: int = 512
    max_steps: int = 100
    default_steps: int = 30
    max_guidance: float = 30.0
    default_guidance: float = 7.5
    max_num_images: int = 4
    max_prompt_chars: int = 2000
    soft_time_limit: int = 600
    time_limit: int = 660
    # The model's architecture (app/families.py: sd, sd3, flux): which schedulers fit it
    # and the size multiple it needs; the worker checks it against the model's files.
    family: str = DEFAULT_FAMILY
    # A few-step preset (app/presets.py: lcm, turbo, lightning, schnell): the defaults and
    # limits a distilled model runs well with, filled in where the table sets none.
    preset: str | None = None
    # The schedulers it offers; None (the default): every one that fits its family.
    schedulers: tuple[str, ...] | None = None
    # The job kinds it offers (app/kinds); a model with a dedicated inpainting UNet
    # offers only "inpaint". The first is the one its workers warm up with. None (the
    # default): its family's (app/families.py: images for sd, sd3, flux; txt2vid for wan,
    # txt2vid and img2vid for ltx).
    kinds: tuple[str, ...] | None = None
    # Video (a family with `video`): frames per second (None: the family's, 16 for Wan,
    # 24 for LTX), the fps a request may ask for (played faster or slower: the model makes
    # the same frames), and the frame counts (the family's k x step + 1 rule).
    fps: int | None = None
    max_fps: int = 60
    default_frames: int = 33
    max_frames: int = 81
    # Where `high` priority jobs go instead of `queue` (e.g. a pool on on-demand nodes
    # while `queue` is served by spot nodes); empty: the same queue.
    high_priority_queue: str = ""
    # What one job may ask of the GPU's memory: width x height x num_images (None: only
    # the limits above). A request over it is a 422 at submit, never an OOM on the GPU.
    max_pixels_per_job: int | None = None
    # Loading (workers/pipelines.py): the weights' file variant ("fp16" reads
    # *.fp16.safetensors), a VAE folder to use instead of the model's own (e.g. the
    # fp16-fix SDXL VAE), and the safety checker, off unless asked for.
    variant: str | None = None
    vae_path: Path | None = None
    safety_checker: bool = False
    # Dynamic batching (docs/batching.md): up to `max_batch` compatible jobs (same size,
    # steps, guidance, scheduler) run as one pipeline call, waiting at most `max_wait_ms`
    # for the batch to fill. `sizes` ("WIDTHxHEIGHT") are the tiers that batch; with
    # `sizes_required` a request of another size is a 422, without it it runs alone.
    max_batch: int = 1
    max_wait_ms: int = 0
    sizes: tuple[str, ...] = ()
    sizes_required: bool = False
    # Add-on weights: the add-on family they must be of, by their layers' widths (one of
    # app/families.py ADDON_FAMILIES of the model's family: sd15, sd2, sdxl, tiny for
    # `sd`, flux and tiny-flux for `flux`; empty: the model takes none). LoRA adapters
    # (app/addons/lora/), where the add-on family has them: how many one job may name.
    lora_family: str = ""
    max_loras: int = 4
    # A compiled model's adapters are hot-swapped into slots padded to this rank, so a new
    # adapter or scale does not recompile (app/addons/lora/worker.py); one of a higher rank
    # loads anew, and recompiles.
    lora_rank: int = 64
    # ControlNet conditioning (app/addons/controlnet/): how many controls one job may carry; a
    # model takes the catalog's ControlNets of its lora_family (none without one).
    max_controls: int = 2
    # torch.compile (workers/compiled.py): the "WIDTHxHEIGHT" tiers whose jobs run on a
    # compiled denoiser, each compiled and warmed when the worker starts; other sizes run
    # eager. Empty: nothing compiled.
    compile_sizes: tuple[str, ...] = ()
    # torch.compile's backend: inductor (generated kernels); aot_eager and eager trace
    # without generating code (seconds instead of minutes: the CPU tests use them).
    compile_backend: str = "inductor"
    # What is compiled: "model", the whole denoiser; "blocks", only its repeated blocks
    # (diffusers' compile_repeated_blocks: each block class compiled once and reused by
    # every block, in a fraction of the time); "auto": blocks for a transformer that names
    # its repeated blocks (FLUX, Wan, LTX-Video), the whole model otherwise (a UNet).
    compile_scope: str = "auto"
    # The attention kernels of a transformer whose attention goes through diffusers'
    # dispatcher (FLUX, Wan, LTX-Video): one of ATTENTION_BACKENDS; "auto" picks
    # FlashAttention 3 where it is installed on a GPU, else PyTorch's SDPA.
    attention_backend: str = "auto"
    # Quantized weights (workers/quantized.py): the denoiser's weights stored in 8 bits,
    # "int8" (any device) or "fp8" (a GPU of compute capability 8.9 or later); empty: the
    # model's dtype. In the model's digest and every job's manifest.
    quantize: str = ""
    # Checkpoints (workers/checkpoints.py): a running job's denoising state is stored
    # every this many seconds, and when it is handed back (a shutdown, a spot notice), so
    # a job that dies resumes there; 0: never.
    checkpoint_seconds: float = 60.0
    # Quality tiers (app/quality.py): the ones a request may ask for (`quality`; None:
    # exact and every tier its family has defaults for), the one a request without it
    # gets, and each tier's settings (`[models.NAME.tiers.TIER]` over the family's).
    quality: tuple[str, ...] | None = None
    default_quality: str = DEFAULT_TIER
    tiers: tuple[Tier, ...] | None = None

    def __post_init__(self) -> None:
        family = FAMILIES.get(self.family)
        if self.tiers is None:
            try:
                tiers = model_tiers(self.family, self.quality, None)
            except TierError as exc:
                raise CatalogError(f"model {self.name!r}: {exc}") from exc
            object.__setattr__(self, "tiers", tiers)
        object.__setattr__(self, "quality", tuple(t.name for t in self.tiers))
        if self.schedulers is None and family is not None:
            object.__setattr__(self, "schedulers", schedulers_for(self.family))
        if self.kinds is None:
            object.__setattr__(self, "kinds", family.kinds if family else ("txt2img",))
        if self.fps is None:
            object.__setattr__(self, "fps", family.default_fps if family else 24)

    @property
    def lora_limit(self) -> int:
        """The LoRA adapters one job may name: 0 without an add-on family that has them."""
        addon = ADDON_FAMILIES.get(self.lora_family)
        return self.max_loras if addon is not None and addon.loras else 0

    @property
    def control_limit(self) -> int:
        """The controls one job may carry: 0 without an add-on family, or for video."""
        return self.max_controls if self.lora_family and not self.video else 0

    @property
    def video(self) -> bool:
        """A video model: its jobs make clips (app/kinds/video.py)."""
        family = FAMILIES.get(self.family)
        return bool(family and family.video)

    @property
    def spans_deliveries(self) -> bool:
        """Whether one job may run over several deliveries of its message: every job
        checkpoints (checkpoint_seconds > 0) and runs alone (max_batch = 1: a batched
        call's jobs store no checkpoint), so a delivery nearing the broker's
        consumer_timeout hands its job back and the next one resumes it. Its
        soft_time_limit is then a budget of running seconds summed over deliveries."""
        return self.checkpoint_seconds > 0 and self.max_batch == 1

    def delivery_limits(self, consumer_timeout: float) -> tuple[float, float]:
        """The (soft, hard) Celery time limits one delivery's message carries: the
        model's own, except that a model whose jobs span deliveries has them end inside
        the consumer_timeout, after its hand-back point: soft at a half and hard at a
        quarter of `hand_back_margin` before the timeout (1710 s and 1755 s of 1800 s).
        A delivery's soft limit that comes before the budget is spent hands the job back
        rather than failing it (workers/record.py `over_time`)."""
        if not self.spans_deliveries:
            return self.soft_time_limit, self.time_limit
        margin = hand_back_margin(consumer_timeout)
        return (
            min(self.soft_time_limit, consumer_timeout - margin / 2),
            min(self.time_limit, consumer_timeout - margin / 4),
        )

    def tier(self, name: str) -> Tier:
        """The settings of one of its tiers (KeyError for one it does not offer)."""
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise KeyError(name)

    @property
    def min_steps(self) -> int:
        family = FAMILIES.get(self.family)
        return family.min_steps if family else 1

    @property
    def frame_step(self) -> int:
        family = FAMILIES.get(self.family)
        return family.frame_step if family else 1

    @property
    def size_tiers(self) -> tuple[tuple[int, int], ...]:
        return tuple(_parse_size(s) for s in self.sizes)

    @property
    def compile_tiers(self) -> tuple[tuple[int, int], ...]:
        return tuple(_parse_size(s) for s in self.compile_sizes)

    def batches(self, width: int, height: int) -> bool:
        """Whether a job of this size may share a batch (max_batch > 1, size in the tiers)."""
        if self.max_batch <= 1:
            return False
        return not self.sizes or (width, height) in self.size_tiers

    def queue_for(self, priority: str) -> str:
        return (
            self.high_priority_queue
            if priority == "high" and self.high_priority_queue
            else self.queue
        )

    @property
    def all_queues(self) -> tuple[str, ...]:
        return (self.queue, self.high_priority_queue) if self.high_priority_queue else (self.queue,)

    def check(self, consumer_timeout: int = CONSUMER_TIMEOUT_SECONDS) -> None:
        """Every rule of an entry, in this order; the first broken raises `CatalogError`
        naming the model and the setting."""
        self._check_identity()
        self._check_default_size()
        self._check_steps_and_time(consumer_timeout)
        self._check_batching()
        self._check_size_list()
        self._check_schedulers()
        self._check_add_ons()
        self._check_kinds()
        self._check_quality()

    def _check_identity(self) -> None:
        """The family, preset, dtype and queue it names exist and fit each other."""
        if self.family not in FAMILIES:
            raise CatalogError(f"model {self.name!r}: family must be one of {sorted(FAMILIES)}")
        if self.preset is not None and self.preset not in PRESETS:
            raise CatalogError(f"model {self.name!r}: preset must be one of {sorted(PRESETS)}")
        multiple = FAMILIES[self.family].size_multiple
        if self.size_multiple % multiple:
            raise CatalogError(
                f"model {self.name!r}: size_multiple must be a multiple of {multiple} for "
                f"family {self.family!r}"
            )
        if self.dtype not in DTYPES:
            raise CatalogError(f"model {self.name!r}: dtype must be one of {DTYPES}")
        if not (isinstance(self.checkpoint_seconds, int | float) and self.checkpoint_seconds >= 0):
            raise CatalogError(f"model {self.name!r}: checkpoint_seconds must be 0 or more")
        if not self.queue:
            raise CatalogError(f"model {self.name!r}: queue is required")

    def _check_default_size(self) -> None:
        """The default size within the model's own limits."""
        if self.size_multiple <= 0 or self.min_size % self.size_multiple:
            raise CatalogError(f"model {self.name!r}: min_size must be a multiple of size_multiple")
        for dim, most in (("default_width", self.max_width), ("default_height", self.max_height)):
            value = getattr(self, dim)
            if value % self.size_multiple or not self.min_size <= value <= most:
                raise CatalogError(f"model {self.name!r}: {dim} breaks the model's own limits")
        if self.default_width * self.default_height > self.max_pixels:
            raise CatalogError(f"model {self.name!r}: default size exceeds max_pixels")

    def _check_steps_and_time(self, consumer_timeout: int) -> None:
        """Steps, and time limits the broker's `consumer_timeout` allows."""
        if not self.min_steps <= self.default_steps <= self.max_steps:
            raise CatalogError(
                f"model {self.name!r}: default_steps must be in {self.min_steps}..max_steps"
            )
        if self.max_steps > MAX_STEPS:
            raise CatalogError(
                f"model {self.name!r}: max_steps must be at most {MAX_STEPS} (the schedulers "
                "were trained over 1000 timesteps)"
            )
        if not 0 < self.soft_time_limit < self.time_limit:
            raise CatalogError(f"model {self.name!r}: need 0 < soft_time_limit < time_limit")
        if (
            not self.spans_deliveries
            and self.time_limit > consumer_timeout - TIME_LIMIT_HEADROOM_SECONDS
        ):
            raise CatalogError(
                f"model {self.name!r}: time_limit {self.time_limit}s must stay below RabbitMQ's "
                f"consumer_timeout ({consumer_timeout}s, DIFFQ_BROKER_CONSUMER_TIMEOUT) minus "
                f"{TIME_LIMIT_HEADROOM_SECONDS}s: raise the broker's consumer_timeout and the "
                "setting together, or lower time_limit (a model whose jobs checkpoint and run "
                "alone, checkpoint_seconds > 0 and max_batch = 1, hands long jobs back instead)"
            )
        if self.high_priority_queue == self.queue:
            raise CatalogError(f"model {self.name!r}: high_priority_queue must differ from queue")

    def _check_batching(self) -> None:
        """A batch's bounds and the compile backend."""
        if self.max_pixels_per_job is not None and (
            self.max_pixels_per_job < self.default_width * self.default_height
        ):
            raise CatalogError(
                f"model {self.name!r}: max_pixels_per_job is below one default-size image"
            )
        if self.max_batch < 1:
            raise CatalogError(f"model {self.name!r}: max_batch must be at least 1")
        if not 0 <= self.max_wait_ms <= 10_000:
            raise CatalogError(f"model {self.name!r}: max_wait_ms must be in 0..10000")
        if self.compile_backend not in COMPILE_BACKENDS:
            raise CatalogError(
                f"model {self.name!r}: compile_backend must be one of {COMPILE_BACKENDS}"
            )
        if self.compile_scope not in COMPILE_SCOPES:
            raise CatalogError(
                f"model {self.name!r}: compile_scope must be one of {COMPILE_SCOPES}"
            )
        if self.quantize not in QUANTIZATIONS:
            raise CatalogError(
                f"model {self.name!r}: quantize must be one of "
                f"{', '.join(repr(q) for q in QUANTIZATIONS)} (empty: not quantized)"
            )
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise CatalogError(
                f"model {self.name!r}: attention_backend must be one of {ATTENTION_BACKENDS} "
                "(the Hub's kernel backends are not fetched)"
            )
        family = FAMILIES.get(self.family)
        if self.attention_backend not in ("auto", "native") and not (
            family and family.attention_dispatch
        ):
            raise CatalogError(
                f"model {self.name!r}: attention_backend {self.attention_backend!r} needs a "
                "transformer whose attention diffusers dispatches (FLUX, Wan, LTX-Video); a "
                f"{self.family} model runs PyTorch's SDPA"
            )

    def _check_size_list(self) -> None:
        """`sizes` and `compile_sizes` within the limits; the default among them if required."""
        for size in (*self.sizes, *self.compile_sizes):
            try:
                width, height = _parse_size(size)
            except ValueError as exc:
                raise CatalogError(f"model {self.name!r}: sizes: {exc}") from exc
            if (
                width % self.size_multiple
                or height % self.size_multiple
                or not self.min_size <= width <= self.max_width
                or not self.min_size <= height <= self.max_height
                or width * height > self.max_pixels
            ):
                raise CatalogError(f"model {self.name!r}: size {size} breaks the model's limits")
        if self.sizes_required and not self.sizes:
            raise CatalogError(f"model {self.name!r}: sizes_required needs sizes")
        if self.sizes_required and (
            f"{self.default_width}x{self.default_height}" not in self.sizes
        ):
            raise CatalogError(
                f"model {self.name!r}: the default size must be one of sizes when required"
            )

    def _check_schedulers(self) -> None:
        """Schedulers that exist and fit the family."""
        unknown = set(self.schedulers) - set(SCHEDULERS)
        if unknown:
            raise CatalogError(f"model {self.name!r}: unknown schedulers {sorted(unknown)}")
        unfit = [s for s in self.schedulers if self.family not in SCHEDULER_TABLE[s].families]
        if unfit:
            raise CatalogError(
                f"model {self.name!r}: schedulers {unfit} do not fit family {self.family!r} "
                f"(it takes {list(schedulers_for(self.family))})"
            )

    def _check_add_ons(self) -> None:
        """The add-on weights it takes: those of one add-on family of its own model family
        (app/families.py ADDON_FAMILIES), LoRA adapters where that family has them, at
        most so many, and controls."""
        addon = ADDON_FAMILIES.get(self.lora_family)
        if self.lora_family and addon is None:
            raise CatalogError(
                f"model {self.name!r}: lora_family must be one of {sorted(ADDON_FAMILIES)}, "
                f"got {self.lora_family!r}"
            )
        if addon is not None and addon.model_family != self.family:
            fitting = sorted(n for n, a in ADDON_FAMILIES.items() if a.model_family == self.family)
            raise CatalogError(
                f"model {self.name!r}: lora_family {self.lora_family!r} is for "
                f"{addon.model_family} models; a {self.family} model takes "
                f"{', '.join(fitting) or 'no add-ons'} (or leave lora_family out)"
            )
        if not 0 <= self.max_loras <= 16:
            raise CatalogError(f"model {self.name!r}: max_loras must be in 0..16")
        if not 1 <= self.lora_rank <= 256:
            raise CatalogError(f"model {self.name!r}: lora_rank must be in 1..256")
        if not 0 <= self.max_controls <= 4:
            raise CatalogError(f"model {self.name!r}: max_controls must be in 0..4")

    def _check_kinds(self) -> None:
        """The kinds it offers: known, and of what it makes (images or video)."""
        from app.kinds import KINDS

        if not self.kinds or set(self.kinds) - set(KINDS):
            raise CatalogError(
                f"model {self.name!r}: kinds must be some of {sorted(KINDS)}, "
                f"got {list(self.kinds)}"
            )
        wrong = [k for k in self.kinds if KINDS[k].video != self.video]
        if wrong:
            what = "video" if self.video else "image"
            raise CatalogError(
                f"model {self.name!r}: a {self.family} model makes {what}s; it cannot offer "
                f"the kinds {wrong}"
            )
        if self.video:
            self._check_video()

    def _check_quality(self) -> None:
        """Its tiers fit its family, and its default is one of them."""
        if self.default_quality not in self.quality:
            raise CatalogError(
                f"model {self.name!r}: default_quality must be one of its tiers {self.quality}"
            )
        for tier in self.tiers:
            try:
                tier.check(FAMILIES[self.family])
            except TierError as exc:
                raise CatalogError(f"model {self.name!r}: tiers.{exc}") from exc

    def _check_video(self) -> None:
        step = self.frame_step
        for name in ("default_frames", "max_frames"):
            value = getattr(self, name)
            if value < step + 1 or (value - 1) % step:
                raise CatalogError(
                    f"model {self.name!r}: {name} must be k x {step} + 1 frames (k >= 1) for "
                    f"family {self.family!r}, got {value}"
                )
        if self.default_frames > self.max_frames:
            raise CatalogError(f"model {self.name!r}: default_frames exceeds max_frames")
        if not 1 <= self.fps <= self.max_fps <= 120:
            raise CatalogError(f"model {self.name!r}: need 1 <= fps <= max_fps <= 120")
        if self.max_batch != 1:
            raise CatalogError(
                f"model {self.name!r}: video jobs run one per call (max_batch = 1): a clip "
                "already fills the GPU"
            )


@dataclass(frozen=True)
class Catalog:
    models: dict[str, ModelSpec]
    default_model: str
    adapters: dict[str, AdapterSpec] = field(default_factory=dict)
    controlnets: dict[str, ControlNetSpec] = field(default_factory=dict)

    def get(self, name: str | None) -> ModelSpec | None:
        return self.models.get(name or self.default_model)

    @property
    def queues(self) -> list[str]:
        return sorted({q for m in self.models.values() for q in m.all_queues})

    def models_for_queues(self, queues: list[str]) -> list[ModelSpec]:
        return [m for m in self.models.values() if set(m.all_queues) & set(queues)]


# What the tiny random-weight models share: CPU-friendly sizes, steps and time limits.
TINY_LIMITS = {
    "dtype": "float32",
    "default_width": 64,
    "default_height": 64,
    "max_steps": 50,
    "soft_time_limit": 120,
    "time_limit": 180,
}


def tiny_spec(path: Path, name: str = "tiny", queue: str = "gpu.tiny") -> ModelSpec:
    """The limits that suit the tiny random-weight model (CPU-friendly sizes)."""
    return ModelSpec(
        name=name,
        path=path,
        queue=queue,
        max_width=512,
        max_height=512,
        max_pixels=512 * 512,
        default_steps=8,
        lora_family="tiny",
        **TINY_LIMITS,
    )


def tiny_video_spec(
    path: Path, name: str = "tiny-video", queue: str = "gpu.tiny-video"
) -> ModelSpec:
    """The limits that suit the tiny random-weight LTX-Video model (workers/tiny_video.py):
    clips of a few frames at CPU-friendly sizes, text to video and image to video."""
    return ModelSpec(
        name=name,
        path=path,
        queue=queue,
        family="ltx",
        size_multiple=32,
        min_size=32,
        max_width=256,
        max_height=256,
        max_pixels=256 * 256,
        default_steps=4,
        default_frames=9,
        max_frames=49,
        **TINY_LIMITS,
    )


def _parse_size(size: str) -> tuple[int, int]:
    """ "512x768" -> (512, 768)."""
    width, sep, height = str(size).lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit():
        raise ValueError(f"{size!r} is not WIDTHxHEIGHT")
    return int(width), int(height)


_SPEC_FIELDS = {f.name for f in fields(ModelSpec)}


def _spec_from_table(
    name: str, table: dict, base_dir: Path, consumer_timeout: int = CONSUMER_TIMEOUT_SECONDS
) -> ModelSpec:
    unknown = set(table) - _SPEC_FIELDS
    if unknown:
        raise CatalogError(f"model {name!r}: unknown keys {sorted(unknown)}")
    if "path" not in table:
        raise CatalogError(f"model {name!r}: path is required")
    values = dict(table)
    preset = values.get("preset")
    if preset is not None and preset not in PRESETS:
        raise CatalogError(f"model {name!r}: preset must be one of {sorted(PRESETS)}")
    values = {**PRESETS.get(preset, {}), **values}  # the table's own keys win
    family = values.get("family", DEFAULT_FAMILY)
    if family in FAMILIES:  # check() names a family that is not
        values.setdefault("size_multiple", max(8, FAMILIES[family].size_multiple))
    path = Path(values.pop("path")).expanduser()
    values["path"] = path if path.is_absolute() else (base_dir / path)
    values.setdefault("queue", f"gpu.{name}")
    if values.get("vae_path") is not None:
        vae = Path(values["vae_path"]).expanduser()
        values["vae_path"] = vae if vae.is_absolute() else (base_dir / vae)
    if "schedulers" in values:
        values["schedulers"] = tuple(values["schedulers"])
    for key in ("sizes", "compile_sizes"):
        if key in values:
            values[key] = tuple(values[key])
    if "kinds" in values:
        values["kinds"] = tuple(values["kinds"])
    if "tiers" in values and not isinstance(values["tiers"], dict):
        raise CatalogError(f"model {name!r}: tiers must be a table of tier tables")
    try:
        values["tiers"] = model_tiers(family, values.get("quality"), values.get("tiers"))
    except TierError as exc:
        raise CatalogError(f"model {name!r}: {exc}") from exc
    try:
        spec = ModelSpec(name=name, **values)
    except TypeError as exc:
        raise CatalogError(f"model {name!r}: {exc}") from exc
    spec.check(consumer_timeout)
    return spec


def load_catalog(settings: Settings) -> Catalog:
    """The models file named by DIFFQ_MODELS_FILE, or the tiny model alone."""
    if settings.models_file is None:
        spec = tiny_spec(settings.tiny_model_dir)
        video = tiny_video_spec(settings.tiny_video_model_dir)
        canny = ControlNetSpec("tiny-canny", settings.tiny_controlnet_dir, "tiny")
        return Catalog(
            models={spec.name: spec, video.name: video},
            default_model=spec.name,
            controlnets={canny.name: canny},
        )
    try:
        data = tomllib.loads(settings.models_file.read_text())
    except FileNotFoundError as exc:
        raise CatalogError(f"models file {settings.models_file} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"models file {settings.models_file}: {exc}") from exc
    tables = data.get("models") or {}
    if not tables:
        raise CatalogError(f"models file {settings.models_file} defines no [models.NAME] table")
    base_dir = settings.models_file.parent
    timeout = settings.broker_consumer_timeout
    models = {name: _spec_from_table(name, t, base_dir, timeout) for name, t in tables.items()}
    default = data.get("default_model") or next(iter(models))
    if default not in models:
        raise CatalogError(f"default_model {default!r} is not defined")
    try:  # each add-on's shared ones, in its table (app/addons: `[adapters.NAME]`, …)
        shared = {
            addon.table: {
                name: addon.declared(name, table, base_dir)
                for name, table in (data.get(addon.table) or {}).items()
            }
            for addon in ADDONS.values()
        }
    except DeclarationError as exc:
        raise CatalogError(str(exc)) from exc
    return Catalog(models=models, default_model=default, **shared)
