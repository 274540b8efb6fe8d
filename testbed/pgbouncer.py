"""PgBouncer in transaction mode in front of a PostgreSQL, on a free loopback port.

Its clients authenticate with nothing (`trust`, loopback only); it logs in to the server
as the user and password of the server URL it is given. PgBouncer will not run as root:
as root it runs as `postgres`, as the private servers do (testbed/private_postgres.py).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg2

from testbed.ports import free_port, wait_for_port

INI = """[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {root}/users.txt
pool_mode = transaction
default_pool_size = {pool}
max_client_conn = 2000
server_reset_query =
admin_users = {user}
logfile = {root}/pgbouncer.log
"""


def why_not() -> str | None:
    """Why no PgBouncer can run here, or None."""
    if shutil.which("pgbouncer") is None:
        return "the pgbouncer binary is not installed (apt-get install pgbouncer)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "PgBouncer will not run as root, and there is no postgres user to run it as"
    return None


class PgBouncer:
    def __init__(self, server_url: str, pool_size: int) -> None:
        parts = urlsplit(server_url.replace("+psycopg2", ""))
        self._server = parts
        self.pool_size = pool_size
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="diffq-pgbouncer-"))
        self._process: subprocess.Popen | None = None

    def url(self, server_url: str) -> str:
        """`server_url` (a database on the same server) through this pooler, as diffq's
        SQLAlchemy URL."""
        parts = urlsplit(server_url)
        user = parts.username or ""
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit(("postgresql+psycopg2", netloc, parts.path, "", ""))

    def start(self) -> PgBouncer:
        user, password = self._server.username or "", unquote(self._server.password or "")
        (self.root / "users.txt").write_text(f'"{user}" "{password}"\n')
        ini = self.root / "pgbouncer.ini"
        ini.write_text(
            INI.format(
                host=self._server.hostname,
                port=self._server.port or 5432,
                listen=self.port,
                root=self.root,
                pool=self.pool_size,
                user=user,
            )
        )
        command = ["pgbouncer", str(ini)]
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, account.pw_uid, account.pw_gid)
            command = ["runuser", "-u", "postgres", "--", *command]
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_for_port(self.port, timeout=30)
        except (TimeoutError, OSError):
            self.stop()
            raise RuntimeError(f"pgbouncer did not listen: {self.log()[-2000:]}") from None
        return self

    def server_ports(self) -> set[int]:
        """The local ports of the pooler's connections to the server (its admin console's
        SHOW SERVERS): a server session whose client port is one of them is the pooler's."""
        user = self._server.username or ""
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, dbname="pgbouncer", user=user)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW SERVERS")
                columns = [c.name for c in cur.description]
                return {row[columns.index("local_port")] for row in cur.fetchall()}
        finally:
            conn.close()

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)  # runuser and pgbouncer alike
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
