"""Session services: a private PostgreSQL database, RabbitMQ vhost and SeaweedFS bucket.

Each session creates its own database, vhost and S3 server, so it can run beside
anything else on the machine; everything is removed at the end.

scripts/test runs the suite in two pytest-xdist processes (`-n 2 --dist loadscope`): the
fault scenarios (tests/faults, on their own private brokers and databases) in one, the
rest in the other, each in the order a single process runs them. The fault figures each
process gathers are reported once, by the process that started them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.embedded import EmbeddedService
from testbed.processes import ApiServer, ManagedProcess, start_worker
from testbed.stack import MODEL_CACHE_ENV, Stack, build_tiny_video_model, start_stack
from tests.faults.harness import REPORT, Figures, write_report


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
def video_worker(stack) -> ManagedProcess:
    """A real Celery worker serving model `tiny-video` (a tiny LTX-Video, queue
    gpu.tiny-video) on the CPU."""
    build_tiny_video_model(stack)
    process = start_worker(stack.env, stack.logs, "worker-tiny-video", models="tiny-video")
    yield process
    process.stop()


@pytest.fixture(scope="session")
def api_server(stack) -> ApiServer:
    """The API under gunicorn, on a free loopback port."""
    server = ApiServer(stack.env, stack.logs).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def embedded(tmp_path_factory) -> EmbeddedService:
    """`diffq up` on its embedded defaults (SQLite, the filesystem broker, local files),
    as a newcomer runs it: the second mode every feature's end-to-end test runs in."""
    service = EmbeddedService(tmp_path_factory.mktemp("embedded")).start()
    yield service
    service.stop()


@dataclass(frozen=True)
class Served:
    """A service to run a test against: `api` has `url` and `port`; `key` is a new
    tenant's."""

    mode: str
    api: ApiServer | EmbeddedService
    key: str


@pytest.fixture(params=["production", "embedded"])
def served(request) -> Served:
    """The test runs twice: on PostgreSQL, RabbitMQ and S3 (the API under gunicorn and a
    worker), then on `diffq up`'s embedded stores. Each mode has broken a feature the
    other passed."""
    if request.param == "production":
        api = request.getfixturevalue("api_server")
        request.getfixturevalue("worker")
        return Served("production", api, request.getfixturevalue("tenant_key"))
    up = request.getfixturevalue("embedded")
    return Served("embedded", up, up.new_key())


@dataclass(frozen=True)
class ServedVideo:
    """A service with a video model to run a test against: `api` has `url` and `port`;
    `key` and `other_key` are two tenants'."""

    mode: str
    api: ApiServer | EmbeddedService
    key: str
    other_key: str

    @property
    def url(self) -> str:
        return self.api.url


@pytest.fixture(params=["production", "embedded"])
def served_video(request) -> ServedVideo:
    """`served` for video: production's stores with a worker serving `tiny-video`, then
    `diffq up`, whose default catalog serves it."""
    if request.param == "production":
        api = request.getfixturevalue("api_server")
        request.getfixturevalue("video_worker")
        return ServedVideo(
            "production",
            api,
            request.getfixturevalue("tenant_key"),
            request.getfixturevalue("other_key"),
        )
    up = request.getfixturevalue("embedded")
    return ServedVideo("embedded", up, up.new_key(), up.new_key("o"))


@pytest.fixture(scope="session")
def db(stack):
    from app.db.session import Database

    database = Database(stack.database_url)
    yield database
    database.dispose()


@pytest.fixture(scope="session")
def flask_app(stack):
    from app.web.factory import create_app

    app = create_app()
    yield app
    app.extensions["diffq"].close()  # its LISTEN connection, before the database goes


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


# The fault scenarios that break a service or the network (the broker, PostgreSQL, S3,
# partitions, clocks, the quorum cluster); the rest of tests/faults kill workers.
SERVICE_FAULTS = frozenset(
    {
        "test_api_partitions.py",
        "test_clock_jump.py",
        "test_crash_faults.py",
        "test_partitions.py",
        "test_quorum_cluster.py",
        "test_service_faults.py",
    }
)


def process_of(nodeid: str) -> str:
    """Which of scripts/test's four processes runs a test: the fault scenarios in two
    (killed workers; broken services and networks), each on a fault stack of its own,
    with the tests that need no service beside them (tests/worker with the killed workers,
    tests/unit with the broken services: the fault lanes had 250 s of slack in a 1,300 s
    run, and these need nothing started), and everything else in two halves, by a
    checksum of the file's path (even enough: 546 and 544 s of test time when it was
    set)."""
    import zlib

    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/faults/"):
        return "faults-services" if path.rsplit("/", 1)[1] in SERVICE_FAULTS else "faults-workers"
    if path.startswith("tests/worker/"):
        return "faults-workers"
    if path.startswith("tests/unit/"):
        return "faults-services"
    return f"main-{zlib.crc32(path.encode()) % 2}"


def pytest_configure(config) -> None:
    """The run's tiny models are built once, into a folder every process of the run
    shares (testbed/stack.py `build_tiny_model`); pytest-xdist's processes inherit it."""
    if not hasattr(config, "workerinput") and MODEL_CACHE_ENV not in os.environ:
        os.environ[MODEL_CACHE_ENV] = tempfile.mkdtemp(prefix="diffq-tiny-models-")
        config._diffq_model_cache = os.environ[MODEL_CACHE_ENV]


def pytest_unconfigure(config) -> None:
    cache = getattr(config, "_diffq_model_cache", None)
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop(MODEL_CACHE_ENV, None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """scripts/test's processes (`process_of`), each running its tests in collection
    order. A scheduler of our own rather than `xdist_group` marks: xdist 3.8 groups by
    rewriting each test's node id, which pytest 9 no longer reads, so the marks spread
    tests over every process (two quorum clusters at once, say)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByProcess(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return process_of(nodeid)

    return ByProcess(config, log)


def pytest_sessionfinish(session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # a pytest-xdist worker: its fault figures go to the controller
        output["fault_figures"] = [fig.plain() for fig in REPORT]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: a worker ended; keep the fault figures it gathered."""
    for data in getattr(node, "workeroutput", {}).get("fault_figures", ()):
        REPORT.append(Figures.from_plain(data))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not REPORT or hasattr(config, "workeroutput"):
        return
    path = Path(config.rootpath) / ".test-runs" / "faults.txt"
    path.parent.mkdir(exist_ok=True)
    write_report(path)
    terminalreporter.section("fault scenarios")
    for line in path.read_text().splitlines():
        terminalreporter.write_line(line)
