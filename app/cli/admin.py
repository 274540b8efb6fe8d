"""Administration: `diffq db upgrade`, `diffq keys create`, `diffq model build-tiny`."""

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
    create.set_defaults(handler=keys_create)

    model = commands.add_parser("model", help="model directories")
    model_commands = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    tiny = model_commands.add_parser(
        "build-tiny", help="save a tiny random-weight Stable Diffusion pipeline to DIR"
    )
    tiny.add_argument("dir")
    tiny.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    tiny.set_defaults(handler=model_build_tiny)


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
        key = create_key(session, tenant, args.label)
    db.dispose()
    print(key)
    return 0


def model_build_tiny(args: argparse.Namespace) -> int:
    from workers.tiny import build_tiny_model

    path = build_tiny_model(args.dir, seed=args.seed)
    print(f"tiny model saved to {path}")
    return 0
