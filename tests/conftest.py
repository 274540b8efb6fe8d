"""Session services: a private PostgreSQL database, RabbitMQ vhost and SeaweedFS bucket.

Each session creates its own database, vhost and S3 server, so it can run beside
anything else on the machine; everything is removed at the end.
"""

from __future__ import annotations

import os
import uuid

import pytest

from testbed.processes import ApiServer, ManagedProcess, start_worker
from testbed.stack import Stack, start_stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Stack:
    stack = start_stack(tmp_path_factory.mktemp("stack"))
    # In-process code (the Flask test client, publishers) reads the same settings.
    for name in [n for n in os.environ if n.startswith("DIFFQ_") and n not in stack.env]:
        del os.environ[name]
    os.environ.update(stack.env)
    yield stack
    stack.close()


@pytest.fixture(scope="session")
def worker(stack) -> ManagedProcess:
    """A real Celery worker serving model `tiny` (queue gpu.tiny) on the CPU."""
    process = start_worker(stack.env, stack.logs, "worker-tiny", models="tiny")
    yield process
    process.stop()


@pytest.fixture(scope="session")
def api_server(stack) -> ApiServer:
    """The API under gunicorn, on a free loopback port."""
    server = ApiServer(stack.env, stack.logs).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def db(stack):
    from app.db.session import Database

    database = Database(stack.database_url)
    yield database
    database.dispose()


@pytest.fixture(scope="session")
def flask_app(stack):
    from app.web.factory import create_app

    return create_app()


@pytest.fixture
def client(flask_app):
    return flask_app.test_client()


@pytest.fixture
def tenant_key(db) -> str:
    """A new tenant with one key, so tests never see each other's jobs."""
    from app.keys import create_key, get_or_create_tenant

    with db.session() as session:
        tenant = get_or_create_tenant(session, f"t-{uuid.uuid4().hex[:12]}")
        return create_key(session, tenant, "test")


@pytest.fixture
def other_key(db) -> str:
    from app.keys import create_key, get_or_create_tenant

    with db.session() as session:
        tenant = get_or_create_tenant(session, f"o-{uuid.uuid4().hex[:12]}")
        return create_key(session, tenant, "other")
