"""The API's gauges read the values known work leaves: queue depth and the oldest job's
age on a queue only this module uses, jobs in flight while one runs, and requests in
flight while two wait. An API of the module's own, so no other test's requests or jobs
are counted."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from testbed.jobs import auth
from testbed.processes import ApiServer
from testbed.waiting import wait_until

pytestmark = pytest.mark.services

QUEUE = "gpu.gauges"
MODELS = """\
default_model = "tiny"

[models.tiny]
path = "{tiny}"
queue = "gpu.tiny"
dtype = "float32"
max_width = 256
max_height = 256
max_pixels = 49152
default_width = 64
default_height = 64
max_steps = 500
default_steps = 4

[models.gauges]
path = "{tiny}"
queue = "{queue}"
dtype = "float32"
max_width = 64
max_height = 64
default_width = 64
default_height = 64
"""


@pytest.fixture(scope="module")
def gauges_api(stack, tmp_path_factory):
    from app.broker.topology import declare_topology
    from testbed.services import broker_connection

    with broker_connection(stack.broker_url) as conn:
        declare_topology(conn, [QUEUE])
    folder = tmp_path_factory.mktemp("gauges")
    (folder / "models.toml").write_text(MODELS.format(tiny=stack.tiny_model, queue=QUEUE))
    env = {
        **stack.env,
        "DIFFQ_MODELS_FILE": str(folder / "models.toml"),
        "DIFFQ_METRICS_DIR": str(folder / "metrics"),
    }
    server = ApiServer(env, stack.logs, name="api-gauges", workers=2, threads=8).start()
    yield server
    server.stop()


def _value(api: ApiServer, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(api.metrics_url, timeout=10).text
    found = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def _post(api, key, body, **headers) -> requests.Response:
    return requests.post(
        f"{api.url}/v1/jobs", json=body, headers={**auth(key), **headers}, timeout=30
    )


def _cancel(api, key, job: dict) -> None:
    requests.post(job["urls"]["cancel"], headers=auth(key), timeout=10)


def test_queue_depth_and_the_oldest_jobs_age(gauges_api, tenant_key):
    assert _value(gauges_api, "diffq_queue_depth", queue=QUEUE) == 0
    assert _value(gauges_api, "diffq_queue_oldest_age_seconds", queue=QUEUE) == 0
    first_sent = time.monotonic()
    jobs = [_post(gauges_api, tenant_key, {"prompt": f"g{i}", "model": "gauges"}) for i in range(3)]
    first_answered = first_sent + jobs[0].elapsed.total_seconds()
    assert all(job.status_code == 202 for job in jobs)
    jobs = [job.json() for job in jobs]
    time.sleep(1.5)

    asked = time.monotonic()
    depth = _value(gauges_api, "diffq_queue_depth", queue=QUEUE)
    age = _value(gauges_api, "diffq_queue_oldest_age_seconds", queue=QUEUE)
    answered = time.monotonic()
    print(f"\ndepth {depth}, oldest {age:.2f} s (first job {asked - first_answered:.2f} s old)")
    assert depth == 3
    # The first job was stored between its POST and its answer: its age at the scrape
    # lies between these bounds (0.1 s for clocks read in two processes).
    assert asked - first_answered - 0.1 <= age <= answered - first_sent + 0.1
    assert _value(gauges_api, "diffq_jobs_in_flight", queue=QUEUE) == 0

    _cancel(gauges_api, tenant_key, jobs[0])
    assert _value(gauges_api, "diffq_queue_depth", queue=QUEUE) == 2
    younger = _value(gauges_api, "diffq_queue_oldest_age_seconds", queue=QUEUE)
    assert younger <= age + (time.monotonic() - asked)  # now the second job's age
    for job in jobs[1:]:
        _cancel(gauges_api, tenant_key, job)
    assert _value(gauges_api, "diffq_queue_depth", queue=QUEUE) == 0
    assert _value(gauges_api, "diffq_queue_oldest_age_seconds", queue=QUEUE) == 0


def _tiny_idle(db) -> None:
    from sqlalchemy import func, select

    from app.db.models.jobs import Job
    from app.jobs.states import JobStatus

    def idle() -> bool:
        with db.session() as session:
            return not session.scalar(
                select(func.count())
                .select_from(Job)
                .where(
                    Job.queue == "gpu.tiny",
                    Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]),
                )
            )

    wait_until(idle, timeout=120, interval=0.2)


def test_jobs_in_flight_while_one_runs(gauges_api, worker, tenant_key, db):
    _tiny_idle(db)  # the session's worker has nothing else running
    assert _value(gauges_api, "diffq_jobs_in_flight", queue="gpu.tiny") == 0
    body = {"prompt": "in flight", "steps": 500, "width": 256, "height": 192, "num_images": 3}
    job = _post(gauges_api, tenant_key, body).json()
    try:
        wait_until(
            lambda: (
                requests.get(job["urls"]["self"], headers=auth(tenant_key), timeout=10).json()[
                    "status"
                ]
                == "running"
            ),
            timeout=60,
        )
        assert _value(gauges_api, "diffq_jobs_in_flight", queue="gpu.tiny") == 1
        assert _value(gauges_api, "diffq_queue_depth", queue="gpu.tiny") == 0
    finally:
        _cancel(gauges_api, tenant_key, job)
    assert _value(gauges_api, "diffq_jobs_in_flight", queue="gpu.tiny") == 0


def test_requests_in_flight_while_two_wait(gauges_api, tenant_key):
    """Two submits held by `Prefer: wait` on a queue no worker serves are two requests
    being answered; the scrape itself is not counted. Their jobs are canceled once the
    gauge is read, which ends both waits: the count never races a wait running out."""
    assert _value(gauges_api, "diffq_http_requests_in_flight") == 0
    answers: list[requests.Response] = []

    def waiting(i: int) -> None:
        answers.append(
            _post(gauges_api, tenant_key, {"prompt": f"w{i}", "model": "gauges"}, Prefer="wait=60")
        )

    threads = [threading.Thread(target=waiting, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()

    def stored() -> list[dict]:
        listed = requests.get(f"{gauges_api.url}/v1/jobs", headers=auth(tenant_key), timeout=10)
        return listed.json()["data"]

    wait_until(lambda: len(stored()) == 2, timeout=50, interval=0.1)
    held = _value(gauges_api, "diffq_http_requests_in_flight")
    for job in stored():
        _cancel(gauges_api, tenant_key, job)
    for thread in threads:
        thread.join()
    assert held == 2
    assert [a.json()["status"] for a in answers] == ["canceled", "canceled"]  # the waits ended
    assert _value(gauges_api, "diffq_http_requests_in_flight") == 0
