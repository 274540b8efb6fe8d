"""The security tier: every promise of docs/security.md, held by a test that fails when
it is broken. It runs in the default suite on the session's services (tests/conftest.py):
an in-process app with the limits under test, and one gunicorn API for what needs real
sockets (streams, WebSockets, ports)."""

from __future__ import annotations

import io
import uuid
from dataclasses import replace

import pytest
from PIL import Image

from testbed.jobs import auth
from testbed.processes import ApiServer

PUBLIC_URL = "https://diffq.example.test"
TRUSTED_PROXY = "10.9.0.0/16"
# A tenant's streams on one process, and the process's: small, so that tests reach them.
TENANT_STREAMS = 2
PROCESS_STREAMS = 4


@pytest.fixture(scope="session")
def guarded_app(stack):
    """The API in this process with the guards' limits set low enough to reach."""
    from app.config import load_settings
    from app.web.factory import create_app

    settings = replace(
        load_settings(),
        auth_failures=5,
        trusted_proxies=TRUSTED_PROXY,
        public_url=PUBLIC_URL,
        public_origins=(PUBLIC_URL,),
        metrics_cache_ttl=60.0,
        api_metrics_port=9806,
    )
    app = create_app(settings)
    yield app
    app.extensions["diffq"].close()  # its LISTEN connection, before the database goes


@pytest.fixture(scope="session")
def guarded_embedded_app(stack, tmp_path_factory):
    """The same guarded API on `diffq up`'s embedded stores (SQLite, the filesystem broker,
    local files) with the suite's models; `.db` is its database."""
    from app.config import load_settings
    from app.db.migrate import upgrade
    from app.db.session import Database
    from app.web.factory import create_app

    home = tmp_path_factory.mktemp("embedded-api")
    settings = load_settings(
        {"DIFFQ_HOME": str(home), "DIFFQ_MODELS_FILE": stack.env["DIFFQ_MODELS_FILE"]}
    )
    upgrade(settings.database_url)
    settings = replace(
        settings,
        auth_failures=5,
        trusted_proxies=TRUSTED_PROXY,
        public_url=PUBLIC_URL,
        public_origins=(PUBLIC_URL,),
        rate_limit=0,
    )
    app = create_app(settings)
    app.db = Database(settings.database_url)
    yield app
    app.db.dispose()
    app.extensions["diffq"].close()


@pytest.fixture
def guarded(guarded_app):
    return guarded_app.test_client()


@pytest.fixture(scope="session")
def guarded_server(stack):
    """gunicorn, two processes: the stream caps, the public URL, a metrics port."""
    env = {
        **stack.env,
        "DIFFQ_PUBLIC_URL": PUBLIC_URL,
        "DIFFQ_MAX_TENANT_STREAMS": str(TENANT_STREAMS),
        "DIFFQ_MAX_STREAMS": str(PROCESS_STREAMS),
        "DIFFQ_SSE_KEEPALIVE": "1",
    }
    server = ApiServer(env, stack.logs, name="api-security", workers=1, threads=16).start()
    yield server
    server.stop()


def png(size=(64, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (120, 30, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def new_key(db, prefix: str) -> str:
    from app.keys import create_key, get_or_create_tenant

    with db.session() as session:
        tenant = get_or_create_tenant(session, f"{prefix}-{uuid.uuid4().hex[:12]}")
        return create_key(session, tenant, prefix)


def submit(client, key: str, **body) -> dict:
    """A job nobody serves (model tiny-b has no worker in this tier): it stays queued."""
    answer = client.post(
        "/v1/jobs", json={"prompt": "p", "model": "tiny-b", "steps": 2, **body}, headers=auth(key)
    )
    assert answer.status_code == 202, answer.get_json()
    return answer.get_json()
