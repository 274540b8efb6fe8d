"""S3 unreachable during upload: retried with backoff, then failed/storage_unavailable."""

from __future__ import annotations

import uuid

import pytest
import requests

from testbed import services
from testbed.faultproxy import FaultProxy
from testbed.jobs import submit, wait_terminal
from testbed.processes import ApiServer, start_worker
from testbed.services import broker_connection
from testbed.stack import QUEUES
from testbed.waiting import wait_until

pytestmark = pytest.mark.services


@pytest.fixture(scope="module")
def outage(stack):
    """Own vhost, an API, and a worker that reaches S3 only through a cuttable proxy."""
    from app.broker.topology import declare_topology

    vhost = f"diffq-test-s3-{uuid.uuid4().hex[:8]}"
    broker_url = services.create_vhost(vhost)
    with broker_connection(broker_url) as conn:
        declare_topology(conn, QUEUES)
    proxy = FaultProxy(stack.s3.port).start()
    api_env = {**stack.env, "DIFFQ_BROKER_URL": broker_url}
    worker_env = {
        **api_env,
        "DIFFQ_S3_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}",
        "DIFFQ_UPLOAD_RETRIES": "4",
        "DIFFQ_UPLOAD_BACKOFF": "0.2",
        "DIFFQ_UPLOAD_BACKOFF_MAX": "1.0",
    }
    api = ApiServer(api_env, stack.logs, name="api-s3-outage").start()
    worker = start_worker(worker_env, stack.logs, "worker-s3-outage", models="tiny")
    yield api, worker, proxy, broker_url
    worker.stop()
    api.stop()
    proxy.stop()
    services.delete_vhost(vhost)


def test_an_upload_that_fails_twice_is_retried_and_succeeds(outage, tenant_key):
    api, worker, proxy, _ = outage
    refused_before = proxy.refused
    proxy.refuse_next(2)
    job = submit(api.url, tenant_key, prompt="through the storm", steps=2)
    done = wait_terminal(api.url, tenant_key, job["id"])
    assert done["status"] == "succeeded", done
    assert proxy.refused - refused_before == 2
    assert worker.count(rf"upload of \S+/{job['id']}/0.png failed .*; retry \d") == 2
    image = requests.get(done["result"]["images"][0]["url"], timeout=10)
    assert image.status_code == 200 and image.content[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_outage_longer_than_the_retries_fails_the_job_truthfully(outage, tenant_key):
    api, worker, proxy, broker_url = outage
    dead_lettered_before, _ = services.queue_state(broker_url, "gpu.tiny.dlq")
    proxy.down()
    try:
        job = submit(api.url, tenant_key, prompt="lost at sea", steps=2)
        done = wait_terminal(api.url, tenant_key, job["id"], timeout=60)
    finally:
        proxy.up()
    assert done["status"] == "failed"
    assert done["error"]["code"] == "storage_unavailable"
    assert "after 5 attempt(s)" in done["error"]["message"]
    assert done["result"] is None and done["finished_at"] is not None
    assert worker.count(rf"upload of \S+/{job['id']}/0.png failed .*; retry \d") == 4
    # The message is kept in the dead-letter queue for an operator to requeue (the row is
    # written first, then the message is rejected: wait for the broker to move it).
    wait_until(
        lambda: services.queue_state(broker_url, "gpu.tiny.dlq")[0] == dead_lettered_before + 1
    )
