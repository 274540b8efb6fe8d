"""Operators' commands: `dlq`, `requeue`, `queues`, the same click commands on both CLIs.

`diffq dlq|requeue|queues …`, and `celery -A tasks dlq|requeue|queues …` through the
`celery.commands` entry point (pyproject.toml), beside inspect, status and purge. On the
celery CLI, `celery -A tasks jobs requeue` is the older spelling of `requeue` (on `diffq`,
`jobs` is the API client's). Every destructive command asks first unless given --yes, and
prints what it did, one line per job.
"""

from __future__ import annotations

import json
import uuid

import click
from celery.bin.base import CeleryCommand, handle_preload_options


def _services():
    from tasks.celery_app import services

    return services()


class DiffqContext:
    """What these commands find in `ctx.obj` under `diffq` (the celery CLI gives its own
    CLIContext): the Celery app, imported only by a command that uses it."""

    @property
    def app(self):
        from tasks import app

        return app


def _dead_letters(ctx: click.Context, queues: tuple[str, ...]):
    from app.broker.backend import Unsupported
    from app.jobs.deadletters import dead_letters

    svc = _services()
    catalog, app = svc.catalog, ctx.obj.app
    chosen = list(queues) or catalog.queues
    unknown = sorted(set(chosen) - set(catalog.queues))
    if unknown:
        raise click.BadParameter(f"unknown queue(s) {unknown}; known: {catalog.queues}")
    try:
        return dead_letters(svc.broker, app.connection_for_write, svc.db, chosen)
    except Unsupported as exc:
        raise click.ClickException(str(exc)) from exc


def _selection(job_ids: tuple[str, ...], error_code: str | None, everything: bool):
    from app.jobs.deadletters import Selection

    try:
        ids = frozenset(uuid.UUID(j) for j in job_ids)
    except ValueError as exc:
        raise click.BadParameter(f"not a job id: {exc}") from exc
    try:
        return Selection(everything=everything, job_ids=ids, error_code=error_code)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def _confirm(yes: bool, question: str) -> None:
    if not yes:
        click.confirm(question, abort=True)


def _report(actions, verb: str) -> None:
    for action in actions:
        click.echo(f"{action.job_id}  {action.queue:<16} {action.outcome}")
    done = sum(a.outcome.startswith(verb) for a in actions)
    click.echo(f"{verb} {done} of {len(actions)} selected dead letter(s)")


_queue_option = click.option(
    "-Q",
    "--queue",
    "queues",
    multiple=True,
    help="a work queue whose DLQ to use (repeatable; default: every configured queue)",
)
_select_options = [
    click.option("--job", "job_ids", multiple=True, help="a job id (repeatable)"),
    click.option("--error-code", help="every dead letter whose job failed with this code"),
    click.option("--all", "everything", is_flag=True, help="every dead letter"),
    click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation"),
]


def _with_selection(command):
    for option in reversed(_select_options):
        command = option(command)
    return command


@click.group(name="dlq")
@click.pass_context
@handle_preload_options
def dlq(ctx):
    """Dead-letter queues: list, requeue, purge."""


@dlq.command("list")
@_queue_option
@click.option("--limit", type=int, default=0, help="show at most this many (default: all)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
@click.pass_context
def dlq_list(ctx, queues, limit, as_json):
    """List dead letters (job, tenant, reason, attempts, age) without removing any."""
    letters = _dead_letters(ctx, queues).list(limit or None)
    if as_json:
        for letter in letters:
            click.echo(json.dumps(letter.as_dict()))
        return
    click.echo(f"{'JOB':<36}  {'QUEUE':<14} {'ATTEMPTS':>8} {'AGE':>8}  {'TENANT':<36}  REASON")
    for letter in letters:
        age = letter.age_seconds()
        click.echo(
            f"{letter.job_id!s:<36}  {letter.queue:<14} {letter.attempts or 0:>8} "
            f"{(f'{age:.0f}s' if age is not None else '-'):>8}  {letter.tenant!s:<36}  "
            f"{letter.death_reason}; {letter.error or letter.status or 'no job row'}"
        )
    click.echo(f"{len(letters)} dead letter(s)")


@dlq.command("requeue")
@_queue_option
@_with_selection
@click.pass_context
def dlq_requeue(ctx, queues, job_ids, error_code, everything, yes):
    """Send dead letters back to their work queue with a fresh attempt budget (the job
    goes back to `queued` in the same step)."""
    selection = _selection(job_ids, error_code, everything)
    _confirm(yes, "Requeue the selected dead letters?")
    _report(_dead_letters(ctx, queues).requeue(selection, _services().publisher), "requeued")


@dlq.command("purge")
@_queue_option
@_with_selection
@click.pass_context
def dlq_purge(ctx, queues, job_ids, error_code, everything, yes):
    """Remove dead letters for good; their jobs end `failed` with `dead_lettered`."""
    selection = _selection(job_ids, error_code, everything)
    _confirm(yes, "Purge the selected dead letters? Their jobs will not run again.")
    _report(_dead_letters(ctx, queues).purge(selection), "purged")


@click.command(cls=CeleryCommand, name="requeue", short_help="Requeue failed or stuck jobs by id.")
@click.argument("job_ids", nargs=-1, required=True)
@click.option(
    "--stuck",
    is_flag=True,
    help="also take running jobs whose lease expired (their worker is gone)",
)
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@click.pass_context
@handle_preload_options
def requeue(ctx, job_ids, stuck, yes):
    """Queue failed jobs (or queued ones whose message was lost) again, with a fresh
    attempt budget, and publish them. Succeeded and canceled jobs are left alone."""
    from app.broker.publish import publish_and_mark
    from app.db.models.jobs import Job
    from app.jobs import transitions

    try:
        ids = [uuid.UUID(j) for j in job_ids]
    except ValueError as exc:
        raise click.BadParameter(f"not a job id: {exc}") from exc
    _confirm(yes, f"Requeue {len(ids)} job(s)?")
    svc = _services()
    db, publisher = svc.db, svc.publisher
    done = 0
    for job_id in ids:
        with db.session() as session:
            moved = transitions.requeue_by_operator(session, job_id, stuck_running=stuck)
            job = session.get(Job, job_id)
        if job is None:
            click.echo(f"{job_id}  skipped: no such job")
        elif not moved:
            click.echo(f"{job_id}  skipped: job {job.status.value}")
        else:
            published = publish_and_mark(db, publisher, job)
            click.echo(f"{job_id}  requeued" + ("" if published else " (relay publishes)"))
            done += 1
    click.echo(f"requeued {done} of {len(ids)} job(s)")


@click.group(name="jobs")
@click.pass_context
@handle_preload_options
def jobs(ctx):
    """Jobs by id: `requeue` (the older spelling of `celery -A tasks requeue`)."""


jobs.add_command(requeue)


@click.command(
    cls=CeleryCommand, name="queues", short_help="Depth of every work queue (and its DLQ)."
)
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
@click.pass_context
@handle_preload_options
def queues(ctx, as_json):
    """Depth of every work queue: jobs queued and running (PostgreSQL), ready messages
    and consumers (RabbitMQ; with a broker that keeps no depths, the embedded one, the
    workers that answer), dead letters, and the oldest queued job's age."""
    from app.gauges.readings import broker_readings, job_gauges

    svc = _services()
    catalog, db = svc.catalog, svc.db
    values: dict[str, dict[str, float]] = {q: {} for q in catalog.queues}
    families = job_gauges(db, catalog.queues)
    broker = broker_readings(svc.broker, ctx.obj.app.connection_for_read, catalog.queues)
    if broker is not None:  # a backend without depths leaves its columns unknown ("?")
        families += broker.collect()
    for family in families:
        for sample in family.samples:
            queue = sample.labels.get("queue")
            if queue in values:
                values[queue][family.name.removeprefix("diffq_")] = sample.value
    if broker is None:
        # A backend without depths (the embedded filesystem broker) keeps no consumer
        # count: ask the workers which queues they consume, over its broadcast (1 s).
        consumers = _consumers_by_queue(ctx.obj.app)
        for queue, row in values.items():
            row["queue_consumers"] = consumers.get(queue, 0)
    columns = [
        ("queue_depth", "QUEUED"),
        ("jobs_in_flight", "RUNNING"),
        ("broker_queue_messages", "MESSAGES"),
        ("queue_consumers", "CONSUMERS"),
        ("dlq_depth", "DLQ"),
        ("queue_oldest_age_seconds", "OLDEST_S"),
    ]
    if as_json:
        for queue, row in values.items():
            click.echo(json.dumps({"queue": queue, **{key: row.get(key) for key, _ in columns}}))
        return
    click.echo(f"{'QUEUE':<20}" + "".join(f"{title:>11}" for _, title in columns))
    for queue, row in values.items():
        cells = "".join(f"{(f'{row[key]:.0f}' if key in row else '?'):>11}" for key, _ in columns)
        click.echo(f"{queue:<20}{cells}")


def _consumers_by_queue(app, timeout: float = 1.0) -> dict[str, int]:
    """Workers consuming each queue, as they answer `inspect active_queues`."""
    answers = app.control.inspect(timeout=timeout).active_queues() or {}
    counts: dict[str, int] = {}
    for queues in answers.values():
        for queue in queues or ():
            counts[queue["name"]] = counts.get(queue["name"], 0) + 1
    return counts


# What `diffq` adds (its `jobs` is the API client's, cli/client.py).
COMMANDS = (dlq, requeue, queues)
