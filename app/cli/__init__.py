"""The `diffq` command: run the service's parts and administer it."""

from __future__ import annotations

import argparse
import os
import sys

from app import logs
from app.cli import admin, client, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffq", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.register(commands)
    client.register(commands)
    admin.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    logs.configure("INFO", os.environ.get("DIFFQ_LOG_FORMAT", "text").strip().lower())
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args) or 0
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, FileExistsError, client.ApiError) as exc:
        print(f"diffq: {exc}", file=sys.stderr)
        return 2
