"""`diffq queue pause|resume|list`: an operator pauses a model's work without losing a job
(app/jobs/pauses.py); also `celery -A tasks queue …`. The API's operators' route does the
same (`PUT /v1/models/{model}/pause`, an operator's key)."""

from __future__ import annotations

import getpass

import click
from celery.bin.base import handle_preload_options


def _services():
    from tasks.celery_app import services

    return services()


def _refused(exc) -> click.ClickException:
    return click.BadParameter(str(exc)) if exc.unknown else click.ClickException(str(exc))


@click.group(name="queue")
@click.pass_context
@handle_preload_options
def queue(ctx):
    """Pause and resume models' queues: queued jobs wait, nothing is lost."""


@queue.command("pause")
@click.argument("models", nargs=-1, required=True)
@click.option(
    "--now",
    is_flag=True,
    help="also send running jobs back to the queue at their next step, each with a "
    "checkpoint it resumes from (jobs that checkpoint; the others finish)",
)
@click.option("--reason", help="shown with the pause (GET /v1/models)")
def pause(models, now, reason):
    """Stop starting the models' jobs: their workers stop consuming their queues within
    DIFFQ_PAUSE_POLL seconds; running jobs finish (or, with --now, go back to the queue
    with a checkpoint). Models that share a queue are paused together."""
    from app.jobs import pauses

    svc = _services()
    try:
        with svc.db.session() as session:
            done = pauses.pause(
                session, svc.catalog, models, now=now, reason=reason, by=getpass.getuser()
            )
    except pauses.PauseRefused as exc:
        raise _refused(exc) from exc
    for found in done:
        running = "running jobs go back with a checkpoint" if found.now else "running jobs finish"
        click.echo(f"{found.model}  paused ({running})")


@queue.command("resume")
@click.argument("models", nargs=-1, required=True)
def resume(models):
    """Start the models' jobs again, in the order they would have run."""
    from app.jobs import pauses

    svc = _services()
    try:
        with svc.db.session() as session:
            resumed = set(pauses.resume(session, svc.catalog, models))
    except pauses.PauseRefused as exc:
        raise _refused(exc) from exc
    for model in dict.fromkeys(models):
        click.echo(f"{model}  {'resumed' if model in resumed else 'was not paused'}")


@queue.command("list")
def listing():
    """Each model: paused or running, and its queued jobs."""
    from sqlalchemy import func, select

    from app.db.models.jobs import Job
    from app.jobs import pauses
    from app.jobs.states import JobStatus

    svc = _services()
    with svc.db.session() as session:
        paused = pauses.paused(session)
        queued = dict(
            session.execute(
                select(Job.model, func.count())
                .where(Job.status == JobStatus.QUEUED)
                .group_by(Job.model)
            ).all()
        )
    click.echo(f"{'MODEL':<24}{'STATE':<10}{'QUEUED':>8}  SINCE / REASON")
    for name in sorted(svc.catalog.models):
        found = paused.get(name)
        state = "paused" if found else "running"
        note = (
            f"{found.paused_at:%Y-%m-%d %H:%M:%S}{' --now' if found.now else ''}"
            f"{f'  {found.reason}' if found.reason else ''}"
            if found
            else ""
        )
        click.echo(f"{name:<24}{state:<10}{queued.get(name, 0):>8}  {note}")


COMMANDS = (queue,)
