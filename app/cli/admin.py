"""Administration: `diffq db upgrade`, `diffq keys create`, `diffq tenants set`,
`diffq model build-tiny`."""

from __future__ import annotations

import argparse

from app.config import load_settings


def register(commands) -> None:
    db = commands.add_parser("db", help="database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_commands.add_parser("upgrade", help="apply migrations (alembic upgrade head)")
    upgrade.set_defaults(handler=db_upgrade)

    keys = commands.add_parser("keys", help="API keys")
    key_commands = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = key_commands.add_parser("create", help="create a key (printed once, stored hashed)")
    create.add_argument("--tenant", required=True, help="tenant name (created if new)")
    create.add_argument("--label", help="a note to recognise the key by")
    _tenant_options(create)
    create.set_defaults(handler=keys_create)
    listing = key_commands.add_parser("list", help="keys of a tenant (ids and labels, no secrets)")
    listing.add_argument("--tenant", required=True)
    listing.set_defaults(handler=keys_list)
    revoke = key_commands.add_parser("revoke", help="revoke a key: it answers 401 at once")
    revoke.add_argument("key_id", help="the id `keys list` shows (dq_<id>_…)")
    revoke.set_defaults(handler=keys_revoke)

    tenants = commands.add_parser("tenants", help="tenants' fair-share weight and GPU quota")
    tenant_commands = tenants.add_subparsers(
        dest="tenants_command", required=True, metavar="ACTION"
    )
    show = tenant_commands.add_parser("show", help="a tenant's weight, quota and use today")
    show.add_argument("tenant")
    show.set_defaults(handler=tenants_show)
    update = tenant_commands.add_parser("set", help="change a tenant's weight or quota")
    update.add_argument("tenant")
    _tenant_options(update)
    update.set_defaults(handler=tenants_set)

    secret = commands.add_parser("webhook-secret", help="a tenant's webhook signing secret")
    secret.add_argument("--tenant", required=True)
    secret.add_argument(
        "--rotate",
        action="store_true",
        help="make a new secret; the old one keeps signing too for --overlap seconds",
    )
    secret.add_argument("--overlap", type=float, default=86400.0, help="default %(default)s")
    secret.set_defaults(handler=webhook_secret)

    model = commands.add_parser("model", help="model directories")
    model_commands = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    tiny = model_commands.add_parser(
        "build-tiny", help="save a tiny random-weight Stable Diffusion pipeline to DIR"
    )
    tiny.add_argument("dir")
    tiny.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    tiny.set_defaults(handler=model_build_tiny)


def _positive(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {raw}")
    return value


def _tenant_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--weight",
        type=_positive,
        help="fair-share weight: twice the weight, twice the GPU time when pools are busy "
        "(default 1)",
    )
    quota = parser.add_mutually_exclusive_group()
    quota.add_argument(
        "--daily-gpu-seconds",
        type=_positive,
        help="quota: GPU-seconds a UTC day; submits past it answer 429 until midnight UTC",
    )
    quota.add_argument("--no-quota", action="store_true", help="remove the daily quota")


def _apply_tenant_options(tenant, args: argparse.Namespace) -> None:
    if args.weight is not None:
        tenant.weight = args.weight
    if args.daily_gpu_seconds is not None:
        tenant.daily_gpu_seconds = args.daily_gpu_seconds
    if args.no_quota:
        tenant.daily_gpu_seconds = None


def tenants_set(args: argparse.Namespace) -> int:
    from app.db.session import Database

    db = Database(load_settings().database_url, pool_size=1)
    with db.session() as session:
        tenant = _tenant(session, args.tenant)
        _apply_tenant_options(tenant, args)
    db.dispose()
    return tenants_show(args)


def tenants_show(args: argparse.Namespace) -> int:
    from app import usage
    from app.db.session import Database
    from app.db.types import utcnow

    db = Database(load_settings().database_url, pool_size=1)
    with db.session() as session:
        tenant = _tenant(session, args.tenant)
        used = usage.used_on(session, tenant.id, utcnow().date())
        quota = "none" if tenant.daily_gpu_seconds is None else f"{tenant.daily_gpu_seconds:g}"
        print(
            f"tenant {tenant.name}: weight {tenant.weight:g}; "
            f"daily GPU-second quota {quota}; used today (UTC) {used:.1f}"
        )
    db.dispose()
    return 0


def db_upgrade(_args: argparse.Namespace) -> int:
    from app.db.migrate import upgrade

    settings = load_settings()
    upgrade(settings.database_url)
    print("database schema is at head")
    return 0


def keys_create(args: argparse.Namespace) -> int:
    from app.db.session import Database
    from app.keys import create_key, get_or_create_tenant

    db = Database(load_settings().database_url, pool_size=1)
    with db.session() as session:
        tenant = get_or_create_tenant(session, args.tenant)
        _apply_tenant_options(tenant, args)
        key = create_key(session, tenant, args.label)
    db.dispose()
    print(key)
    return 0


def _tenant(session, name: str):
    from sqlalchemy import select

    from app.db.models import Tenant

    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise ValueError(f"no tenant named {name!r}")
    return tenant


def keys_list(args: argparse.Namespace) -> int:
    from app.db.session import Database

    db = Database(load_settings().database_url, pool_size=1)
    with db.session() as session:
        keys = sorted(_tenant(session, args.tenant).keys, key=lambda k: k.created_at)
        print(f"{'KEY ID':<14}  {'CREATED':<20}  {'LAST USED':<20}  {'STATE':<8}  LABEL")
        for key in keys:
            used = key.last_used_at.strftime("%Y-%m-%d %H:%M:%S") if key.last_used_at else "-"
            state = "revoked" if key.revoked_at else "active"
            created = key.created_at.strftime("%Y-%m-%d %H:%M:%S")
            print(f"{key.key_id:<14}  {created:<20}  {used:<20}  {state:<8}  {key.label or ''}")
    db.dispose()
    return 0


def keys_revoke(args: argparse.Namespace) -> int:
    from app.db.session import Database
    from app.keys import revoke_key

    key_id = args.key_id.removeprefix("dq_").split("_", 1)[0]
    db = Database(load_settings().database_url, pool_size=1)
    with db.session() as session:
        revoked = revoke_key(session, key_id)
    db.dispose()
    if not revoked:
        raise ValueError(f"no active key {key_id!r}")
    print(f"key {key_id} revoked")
    return 0


def webhook_secret(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from app.db.models import new_webhook_secret
    from app.db.session import Database
    from app.db.types import utcnow

    db = Database(load_settings().database_url, pool_size=1)
    with db.session() as session:
        tenant = _tenant(session, args.tenant)
        if tenant.webhook_secret is None:
            tenant.webhook_secret = new_webhook_secret()
        if args.rotate:
            tenant.webhook_secret_previous = tenant.webhook_secret
            tenant.webhook_secret_previous_until = utcnow() + timedelta(seconds=args.overlap)
            tenant.webhook_secret = new_webhook_secret()
        secret = tenant.webhook_secret
    db.dispose()
    print(secret)
    return 0


def model_build_tiny(args: argparse.Namespace) -> int:
    from workers.tiny import build_tiny_model

    path = build_tiny_model(args.dir, seed=args.seed)
    print(f"tiny model saved to {path}")
    return 0
