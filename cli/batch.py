"""`diffq batch`: submit a JSON Lines file of job requests as one batch and follow it
(a progress bar over the batch; Ctrl-C asks whether to cancel it), get, list, cancel,
and download its results. Through cli/api.py's client, like every client command, so an
error is one line and the exit status `diffq generate`'s: 2 refused (a 4xx, a file that
cannot be read or is not JSON Lines), 3 the API unreachable or unable to serve it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from cli.api import Client
from cli.client import _client, _connection

BAR_WIDTH = 30


def progress_line(batch: dict) -> str:
    counts = batch.get("counts") or {}
    total = counts.get("total") or batch.get("request_counts", {}).get("total") or 0
    done = sum(counts.get(k, 0) for k in ("succeeded", "failed", "canceled", "expired", "invalid"))
    filled = int(BAR_WIDTH * done / total) if total else 0
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    return (
        f"[{bar}] {done}/{total} {batch['status']}: succeeded {counts.get('succeeded', 0)}, "
        f"failed {counts.get('failed', 0)}, running {counts.get('running', 0)}, "
        f"queued {counts.get('queued', 0)}"
    )


def _summary(batch: dict) -> str:
    counts = batch.get("counts") or {}
    shown = ", ".join(f"{k} {v}" for k, v in counts.items() if v and k != "total")
    return f"batch {batch['id']} {batch['status']} ({shown or 'nothing'})"


def _write_results(client: Client, batch_id: str, output: str) -> int:
    rows = client.batch_results(batch_id)
    try:
        Path(output).write_text("".join(json.dumps(row) + "\n" for row in rows))
    except OSError as exc:
        raise ValueError(f"cannot write {output}: {exc.strerror or exc}") from None
    return len(rows)


@click.group("batch", short_help="Batches: many jobs as one (submit a JSONL file, follow it).")
def batch() -> None:
    """Batches through the API: submit, get, list, cancel, results."""


@batch.command("submit")
@click.argument("path", type=click.Path())
@click.option("--completion-window", help="jobs not started by then expire (24h, 90m, 3600)")
@click.option("--webhook", help="a URL for the batch's end")
@click.option("--idempotency-key", help="the same key again answers with the same batch")
@click.option("--wait", is_flag=True, help="follow it to its end with a progress bar")
@click.option("-o", "--output", help="with --wait: write the results file here")
@click.option("--json", "as_json", is_flag=True, help="print the batch as JSON")
@_connection
def batch_submit(
    path, completion_window, webhook, idempotency_key, wait, output, as_json, url, key
) -> int:
    """Submit PATH (JSON Lines: one POST /v1/jobs body a line, each with its custom_id).

    Exit status: 0 submitted (with --wait: completed), 1 the batch ended otherwise, 2 the
    API refused it (or PATH cannot be read or is not JSON Lines), 3 the API could not be
    reached or could not serve it, 130 interrupted.
    """
    client = _client(url, key)
    handle = client.submit_batch(
        path,
        completion_window=completion_window,
        webhook=webhook,
        idempotency_key=idempotency_key,
    )
    print(f"batch {handle.id} {handle.batch['status']}", file=sys.stderr)
    found = handle.batch
    if wait:
        show = not as_json

        def draw(current: dict) -> None:
            if show:
                sys.stderr.write("\r\033[K" + progress_line(current))
                sys.stderr.flush()

        try:
            found = client.wait_batch(handle, draw)
        except KeyboardInterrupt:
            sys.stderr.write("\n")
            if click.confirm(f"Cancel batch {handle.id}?", default=False, err=True):
                # On a client of its own: the interrupt may have landed mid-request, and
                # the cancel must not depend on the state the old client was left in.
                with _client(url, key) as fresh:
                    found = fresh.cancel_batch(handle.id)
                print(_summary(found), file=sys.stderr)
            else:
                print(f"batch {handle.id} goes on: diffq batch get {handle.id}", file=sys.stderr)
            return 130
        if show:
            sys.stderr.write("\n")
        if output:
            count = _write_results(client, handle.id, output)
            print(f"{count} results in {output}", file=sys.stderr)
    if as_json:
        print(json.dumps(found, indent=2))
    else:
        print(_summary(found))
    return 0 if found["status"] in ("in_progress", "completed", "validating") else 1


@batch.command("get")
@click.argument("batch_id")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@_connection
def batch_get(batch_id, as_json, url, key) -> int:
    """Show a batch."""
    found = _client(url, key).batch(batch_id)
    print(json.dumps(found, indent=2) if as_json else _summary(found))
    return 0


@batch.command("list")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@_connection
def batch_list(limit, as_json, url, key) -> int:
    """Your batches, newest first."""
    page = _client(url, key).batches(limit)
    if as_json:
        print(json.dumps(page, indent=2))
    else:
        for found in page["data"]:
            print(_summary(found))
    return 0


@batch.command("cancel")
@click.argument("batch_id")
@_connection
def batch_cancel(batch_id, url, key) -> int:
    """Cancel a batch: queued jobs at once, running ones at their next step."""
    print(_summary(_client(url, key).cancel_batch(batch_id)))
    return 0


@batch.command("results")
@click.argument("batch_id")
@click.option("-o", "--output", help="a file (default: standard output)")
@_connection
def batch_results(batch_id, output, url, key) -> int:
    """The results file of an ended batch (JSON Lines, input order)."""
    client = _client(url, key)
    if output:
        print(f"{_write_results(client, batch_id, output)} results in {output}", file=sys.stderr)
    else:
        for row in client.batch_results(batch_id):
            print(json.dumps(row))
    return 0
