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


def test_an_input_image_stays_while_a_job_needs_it_and_goes_after(
    api_server, worker, tenant_key, db, stack
):
    """An expired upload's image is removed once no job that may run, or whose results
    are kept, names it; a job that used it holds it as long as its own results."""
    import io
    import uuid
    from datetime import timedelta

    from PIL import Image

    from app.config import load_settings
    from app.db.models.inputs import Upload
    from app.db.types import utcnow
    from app.housekeeping.retention import remove_expired_results, remove_unused_inputs
    from app.storage import open_storage
    from app.uploads import input_key

    def png(color) -> bytes:
        buffer = io.BytesIO()
        Image.new("RGB", (64, 64), color).save(buffer, format="PNG")
        return buffer.getvalue()

    def stored(upload) -> bool:
        key = input_key(upload["tenant"], upload["sha256"])
        listing = stack.s3.client().list_objects_v2(Bucket=stack.bucket, Prefix="")
        return any(o["Key"].endswith(key) for o in listing.get("Contents", []))

    made = {}
    for name, color in (("used", (200, 30, 30)), ("unused", (30, 200, 30))):
        answer = requests.post(
            f"{api_server.url}/v1/uploads",
            files={"file": (f"{name}.png", png(color))},
            headers=auth(tenant_key),
            timeout=10,
        ).json()
        made[name] = answer
    job = submit(
        api_server.url, tenant_key, kind="img2img", prompt="r", image=made["used"]["id"], steps=2
    )
    assert wait_terminal(api_server.url, tenant_key, job["id"])["status"] == "succeeded"
    with db.session() as session:
        for answer in made.values():
            row = session.get(Upload, uuid.UUID(answer["id"]))
            answer["tenant"] = str(row.tenant_id)
            row.expires_at = utcnow() - timedelta(seconds=1)  # both past their own expiry
        session.commit()
    storage = open_storage(load_settings())
    assert stored(made["used"]) and stored(made["unused"])
    while remove_unused_inputs(db, storage, retention_seconds=3600):
        pass  # earlier tests' expired uploads too
    assert stored(made["used"])  # its job's results are kept: so is its input
    assert not stored(made["unused"])
    with db.session() as session:
        held = session.get(Upload, uuid.UUID(made["used"]["id"]))
        assert held.expires_at > utcnow()  # held again for its job
        assert session.get(Upload, uuid.UUID(made["unused"]["id"])) is None

    time.sleep(1.1)  # the job's results go; then its input is no longer needed
    while remove_expired_results(db, storage, retention_seconds=1.0):
        pass
    with db.session() as session:
        session.get(Upload, uuid.UUID(made["used"]["id"])).expires_at = utcnow()
        session.commit()
    while remove_unused_inputs(db, storage, retention_seconds=3600):
        pass
    assert not stored(made["used"])
