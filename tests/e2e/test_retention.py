"""Past the retention period a job's images leave the store; the job stays, marked."""

from __future__ import annotations

import time

import pytest
import requests

from testbed.jobs import auth, submit, wait_terminal

pytestmark = pytest.mark.services


def test_images_past_retention_are_deleted_and_the_job_says_so(
    api_server, worker, tenant_key, db, stack
):
    from app.config import load_settings
    from app.housekeeping.retention import remove_expired_results
    from app.storage import open_storage

    job = submit(api_server.url, tenant_key, prompt="retention", steps=2, num_images=2)
    done = wait_terminal(api_server.url, tenant_key, job["id"])
    assert done["status"] == "succeeded" and not done["data_removed"]
    bucket_listing = stack.s3.client().list_objects_v2(Bucket=stack.bucket, Prefix="")
    before = {o["Key"] for o in bucket_listing.get("Contents", [])}
    mine = {k for k in before if job["id"] in k}
    assert len(mine) == 2

    time.sleep(1.1)
    storage = open_storage(load_settings())
    removed = [remove_expired_results(db, storage, retention_seconds=1.0)]
    while removed[-1]:  # earlier tests' jobs are past 1 s too: drain them, 100 a pass
        removed.append(remove_expired_results(db, storage, retention_seconds=1.0))
    assert sum(removed) >= 1

    after = stack.s3.client().list_objects_v2(Bucket=stack.bucket, Prefix="")
    assert not {o["Key"] for o in after.get("Contents", [])} & mine
    shown = wait_terminal(api_server.url, tenant_key, job["id"])
    assert shown["data_removed"] is True and shown["result"] is None
    image = requests.get(
        f"{api_server.url}/v1/jobs/{job['id']}/images/0",
        headers=auth(tenant_key),
        allow_redirects=False,
        timeout=10,
    )
    assert image.status_code == 410
    assert remove_expired_results(db, storage, retention_seconds=1.0) == 0  # each job once
