"""A background thread that LISTENs on PostgreSQL channels and hands notifications over."""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Callable, Iterable

import psycopg2
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

# Its sessions' application_name, as pg_stat_activity shows them.
NAME = "diffq-listener"

# Called with (channel, payload); with (None, None) after a reconnect, since
# notifications sent while disconnected are lost and listeners must re-read.
Callback = Callable[[str | None, str | None], None]


def psycopg2_dsn(database_url: str) -> str:
    url = make_url(database_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


class Listener:
    def __init__(self, database_url: str, channels: Iterable[str], callback: Callback) -> None:
        self._dsn = psycopg2_dsn(database_url)
        self._channels = list(channels)
        self._callback = callback
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-listener", daemon=True)
        self.connected = threading.Event()

    def start(self) -> Listener:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        delay = 0.5
        first = True
        while not self._stop.is_set():
            conn = None
            try:
                conn = psycopg2.connect(self._dsn, connect_timeout=5, application_name=NAME)
                conn.autocommit = True
                with conn.cursor() as cur:
                    for channel in self._channels:
                        cur.execute(f'LISTEN "{channel}"')
                self.connected.set()
                if not first:
                    self._callback(None, None)
                first, delay = False, 0.5
                self._drain(conn)
            except psycopg2.Error as exc:
                self.connected.clear()
                log.warning("notification listener lost PostgreSQL (%s); retrying", exc)
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)
            finally:
                if conn is not None:
                    conn.close()

    def _drain(self, conn) -> None:
        while not self._stop.is_set():
            readable, _, _ = select.select([conn], [], [], 1.0)
            if not readable:
                # An idle connection can die silently; a cheap round trip finds out.
                with conn.cursor() as cur:
                    cur.execute("SELECT 1")
                continue
            conn.poll()
            while conn.notifies:
                note = conn.notifies.pop(0)
                try:
                    self._callback(note.channel, note.payload)
                except Exception:
                    log.exception("notification callback failed")
