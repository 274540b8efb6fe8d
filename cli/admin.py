"""Administration: `diffq db upgrade`, `diffq keys create|list|revoke`, `diffq tenants
show|set`, `diffq webhook-secret`, `diffq model build-tiny|build-tiny-lora`."""

from __future__ import annotations

import click

from app.addons.lora.checks import MAX_RANK
from app.services import root


def _db():
    return root(db_pool_size=1).db


def _positive(_ctx, _param, value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise click.BadParameter(f"must be a positive number, got {value:g}")
    return value


def _tenant_options(command):
    command = click.option("--no-quota", is_flag=True, help="remove the daily quota")(command)
    command = click.option(
        "--daily-gpu-seconds",
        type=float,
        callback=_positive,
        help="quota: GPU-seconds a UTC day; submits past it answer 429 until midnight UTC",
    )(command)
    return click.option(
        "--weight",
        type=float,
        callback=_positive,
        help="fair-share weight: twice the weight, twice the GPU time when pools are busy "
        "(default 1)",
    )(command)


def _check_quota(daily_gpu_seconds, no_quota) -> None:
    if daily_gpu_seconds is not None and no_quota:
        raise click.UsageError("--daily-gpu-seconds and --no-quota exclude each other")


def _apply_tenant_options(tenant, weight, daily_gpu_seconds, no_quota) -> None:
    if weight is not None:
        tenant.weight = weight
    if daily_gpu_seconds is not None:
        tenant.daily_gpu_seconds = daily_gpu_seconds
    if no_quota:
        tenant.daily_gpu_seconds = None


def _tenant(session, name: str):
    from sqlalchemy import select

    from app.db.models.tenants import Tenant

    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise ValueError(f"no tenant named {name!r}")
    return tenant


@click.group("db")
def db() -> None:
    """Database schema."""


@db.command("upgrade")
def db_upgrade() -> int:
    """Apply migrations (alembic upgrade head)."""
    import logging

    from app.db.migrate import upgrade

    # Each migration it runs is said (alembic's INFO lines, quiet in other commands).
    logging.getLogger("alembic.runtime.migration").setLevel(logging.INFO)
    upgrade(root().settings.database_url)
    print("database schema is at head")
    return 0


@click.group("keys")
def keys() -> None:
    """API keys."""


@keys.command("create")
@click.option("--tenant", required=True, help="tenant name (created if new)")
@click.option("--label", help="a note to recognise the key by")
@click.option(
    "--operator",
    is_flag=True,
    help="an operator's key: it may also pause and resume models through the API",
)
@_tenant_options
def keys_create(tenant, label, operator, weight, daily_gpu_seconds, no_quota) -> int:
    """Create a key (printed once, stored hashed)."""
    from app.keys import create_key, get_or_create_tenant

    _check_quota(daily_gpu_seconds, no_quota)
    with _db().session() as session:
        row = get_or_create_tenant(session, tenant)
        _apply_tenant_options(row, weight, daily_gpu_seconds, no_quota)
        key = create_key(session, row, label, operator=operator)
    print(key)
    return 0


@keys.command("list")
@click.option("--tenant", required=True)
def keys_list(tenant) -> int:
    """Keys of a tenant (ids and labels, no secrets)."""
    with _db().session() as session:
        rows = sorted(_tenant(session, tenant).keys, key=lambda k: k.created_at)
        print(f"{'KEY ID':<14}  {'CREATED':<20}  {'LAST USED':<20}  {'STATE':<8}  LABEL")
        for key in rows:
            used = key.last_used_at.strftime("%Y-%m-%d %H:%M:%S") if key.last_used_at else "-"
            state = "revoked" if key.revoked_at else "operator" if key.operator else "active"
            created = key.created_at.strftime("%Y-%m-%d %H:%M:%S")
            print(f"{key.key_id:<14}  {created:<20}  {used:<20}  {state:<8}  {key.label or ''}")
    return 0


@keys.command("revoke")
@click.argument("key_id")
def keys_revoke(key_id) -> int:
    """Revoke a key (the id `keys list` shows, dq_<id>_…): it answers 401 at once."""
    from app.keys import revoke_key

    key_id = key_id.removeprefix("dq_").split("_", 1)[0]
    with _db().session() as session:
        revoked = revoke_key(session, key_id)
    if not revoked:
        raise ValueError(f"no active key {key_id!r}")
    print(f"key {key_id} revoked")
    return 0


@click.group("tenants")
def tenants() -> None:
    """Tenants' fair-share weight and GPU quota."""


@tenants.command("show")
@click.argument("tenant")
def tenants_show(tenant) -> int:
    """A tenant's weight, quota and use today."""
    from app import usage
    from app.db.types import utcnow

    with _db().session() as session:
        row = _tenant(session, tenant)
        used = usage.used_on(session, row.id, utcnow().date())
        quota = "none" if row.daily_gpu_seconds is None else f"{row.daily_gpu_seconds:g}"
        print(
            f"tenant {row.name}: weight {row.weight:g}; "
            f"daily GPU-second quota {quota}; used today (UTC) {used:.1f}"
        )
    return 0


@tenants.command("set")
@click.argument("tenant")
@_tenant_options
def tenants_set(tenant, weight, daily_gpu_seconds, no_quota) -> int:
    """Change a tenant's weight or quota."""
    _check_quota(daily_gpu_seconds, no_quota)
    with _db().session() as session:
        _apply_tenant_options(_tenant(session, tenant), weight, daily_gpu_seconds, no_quota)
    return tenants_show.callback(tenant)


@click.command("webhook-secret")
@click.option("--tenant", required=True)
@click.option(
    "--rotate",
    is_flag=True,
    help="make a new secret; the old one keeps signing too for --overlap seconds",
)
@click.option("--overlap", type=float, default=86400.0, show_default=True)
def webhook_secret(tenant, rotate, overlap) -> int:
    """A tenant's webhook signing secret."""
    from datetime import timedelta

    from app.db.models.tenants import new_webhook_secret
    from app.db.types import utcnow

    with _db().session() as session:
        row = _tenant(session, tenant)
        if row.webhook_secret is None:
            row.webhook_secret = new_webhook_secret()
        if rotate:
            row.webhook_secret_previous = row.webhook_secret
            row.webhook_secret_previous_until = utcnow() + timedelta(seconds=overlap)
            row.webhook_secret = new_webhook_secret()
        secret = row.webhook_secret
    print(secret)
    return 0


@click.group("model")
def model() -> None:
    """Model directories."""


@model.command("build-tiny")
@click.argument("dir")
@click.option("--seed", type=int, default=0, show_default=True, help="weights seed")
@click.option(
    "--inpainting",
    is_flag=True,
    help='a dedicated inpainting model (a 9-channel UNet): list it with kinds = ["inpaint"]',
)
@click.option(
    "--family",
    type=click.Choice(["sd", "sd3", "flux", "wan", "ltx"]),
    default="sd",
    show_default=True,
    help="the architecture: list an sd3, flux, wan or ltx model with family = "
    '"sd3" / "flux" / "wan" / "ltx" (wan and ltx make video; one ltx model serves '
    "text and image to video)",
)
@click.option(
    "--image-to-video",
    is_flag=True,
    help="with --family wan: Wan 2.1's image-to-video model (a CLIP image encoder beside "
    'the T5): list it with kinds = ["img2vid"]',
)
def model_build_tiny(dir, seed, inpainting, family, image_to_video) -> int:
    """Save a tiny random-weight Stable Diffusion (or SD3, FLUX, Wan, LTX-Video) pipeline
    to DIR."""
    from workers.tiny import build_tiny_model

    if image_to_video and family != "wan":
        raise click.UsageError("--image-to-video needs --family wan (an ltx model serves both)")
    if inpainting and family in ("wan", "ltx"):
        raise click.UsageError(f"--inpainting: no {family} inpainting model")
    path = build_tiny_model(
        dir, seed=seed, inpainting=inpainting, family=family, image_to_video=image_to_video
    )
    print(f"tiny model saved to {path}")
    return 0


@model.command("build-tiny-controlnet")
@click.argument("dir")
@click.option("--seed", type=int, default=0, show_default=True, help="weights seed")
@click.option(
    "--family",
    type=click.Choice(["sd", "flux"]),
    default="sd",
    show_default=True,
    help='the tiny model it is for: sd (list it with `family = "tiny"`) or flux '
    '(`family = "tiny-flux"`)',
)
def model_build_tiny_controlnet(dir, seed, family) -> int:
    """Save a random-weight ControlNet for the tiny model (or the tiny FLUX model) to DIR
    (list it in the models file as `[controlnets.NAME]` with its add-on family)."""
    from workers.tiny import build_tiny_controlnet

    print(f"tiny ControlNet saved to {build_tiny_controlnet(dir, seed=seed, family=family)}")
    return 0


@model.command("build-tiny-lora")
@click.argument("path")
@click.option("--seed", type=int, default=0, show_default=True, help="weights seed")
@click.option(
    "--rank",
    type=click.IntRange(1, MAX_RANK),
    default=4,
    show_default=True,
    help="the rank of every layer's pair",
)
@click.option("--text-encoder", is_flag=True, help="adapt the text encoder's attention too")
@click.option(
    "--family",
    type=click.Choice(["sd", "flux"]),
    default="sd",
    show_default=True,
    help='the tiny model it is for: sd (lora_family = "tiny") or flux '
    '(lora_family = "tiny-flux", its transformer adapted)',
)
@click.option("--overwrite", is_flag=True, help="replace PATH if it exists")
def model_build_tiny_lora(path, seed, rank, text_encoder, family, overwrite) -> int:
    """Save a random LoRA adapter (.safetensors) for the tiny model to PATH.

    It fits the tiny SD model that `diffq model build-tiny` and `scripts/up` build (a
    model with lora_family = "tiny"), or with --family flux the tiny FLUX model: upload
    it with POST /v1/adapters and name it in a job's loras. Its weights are noise, as
    the model's are."""
    from pathlib import Path

    if Path(path).exists() and not overwrite:  # said before seconds of importing torch
        raise click.ClickException(f"{path} already exists: name another file, or --overwrite")
    from workers.tiny import save_tiny_lora

    saved, checked = save_tiny_lora(
        path,
        seed=seed,
        rank=rank,
        text_encoder=text_encoder,
        family="tiny-flux" if family == "flux" else "tiny",
        overwrite=overwrite,
    )
    print(
        f"tiny LoRA adapter saved to {saved} (family {checked.family}, rank {checked.rank}, "
        f"{checked.pairs} layers, {len(checked.data)} bytes)"
    )
    return 0


COMMANDS = (db, keys, tenants, webhook_secret, model)
