"""The `diffq` command: run the service's parts, administer it, and use it.

One click tree: the service (cli/serve.py, cli/up.py), administration (cli/admin.py),
the operators' commands shared with `celery -A tasks` (cli/operators.py) and the API
client (cli/client.py). cli/ sits above the layers it wires (app/, workers/, tasks/); each
command builds its process's root (app/services.py) on first use.
"""

from __future__ import annotations

import os
import sys

import click
from sqlalchemy.exc import DBAPIError

from app import logs, services
from cli import admin, batch, client, operators, pausing, serve, up, video


@click.group("diffq", context_settings={"help_option_names": ["-h", "--help"]})
def diffq() -> None:
    """diffq: text-to-image diffusion models as durable asynchronous jobs."""


for command in (
    serve.api,
    serve.worker,
    serve.relay,
    serve.webhooks,
    serve.flower,
    up.up,
    *admin.COMMANDS,
    *operators.COMMANDS,
    *pausing.COMMANDS,
    client.generate,
    video.video,
    client.jobs,
    batch.batch,
):
    diffq.add_command(command)


def main(argv: list[str] | None = None) -> int:
    logs.configure("INFO", os.environ.get("DIFFQ_LOG_FORMAT", "text").strip().lower())
    try:
        result = diffq.main(
            argv, prog_name="diffq", standalone_mode=False, obj=operators.DiffqContext()
        )
    except KeyboardInterrupt:
        return 130
    except click.exceptions.Exit as exc:  # --help
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        print("Aborted!", file=sys.stderr)
        return 1
    except client.ApiError as exc:  # 2: the request must change; 3: the service could not
        print(f"diffq: {exc}", file=sys.stderr)
        return 2 if exc.refused else 3
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"diffq: {exc}", file=sys.stderr)
        return 2
    except client.Unreachable as exc:
        print(f"diffq: {exc}", file=sys.stderr)
        return 3
    except DBAPIError as exc:  # an operator's command on a database it cannot use
        print(f"diffq: {database_problem(exc)}", file=sys.stderr)
        return 3
    finally:
        services.reset()  # the command's root: its settings and connections end with it
    return result if isinstance(result, int) else 0


def database_problem(exc: DBAPIError) -> str:
    """One line for a database error, naming the database and what to check."""
    reason = str(exc.orig or exc).strip().splitlines()[0]
    try:
        url = services.root().settings.database_url
    except Exception:  # noqa: BLE001 - the settings themselves may be what failed
        url = "DIFFQ_DATABASE_URL"
    where = url.split("@")[-1] if "@" in url else url  # never the password
    hint = (
        "run `diffq db upgrade` first (scripts/up does it), or point DIFFQ_HOME or "
        "DIFFQ_DATABASE_URL at the service's database"
        if "no such table" in reason or "does not exist" in reason
        else "is it up, and is DIFFQ_DATABASE_URL right?"
    )
    return f"the database at {where} answered: {reason}; {hint}"
