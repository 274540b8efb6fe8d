"""Headers that cannot be forged, and defaults checked as the worker will use them: a file
name a client chose comes back as RFC 6266 `filename*` with its folders dropped and no way
out of the header; every answer says `X-Content-Type-Options: nosniff`; an image-to-image
request whose steps leave no step at the default strength is a 422 naming the field it
gave, on POST /v1/jobs and on OpenAI's edits, never a job that crashes on the worker."""

from __future__ import annotations

import io

import pytest
from PIL import Image
from werkzeug.http import parse_options_header

from app.web.downloads import attachment
from testbed.jobs import auth


def _parsed(header: str) -> dict[str, str]:
    """As a browser reads it: `filename*` where given (RFC 6266), else `filename`."""
    kind, options = parse_options_header(header)
    return {"type": kind, "filename": options.get("filename")}


@pytest.mark.parametrize(
    ("sent", "ascii_name", "name"),
    [
        ("in.jsonl", "in.jsonl", "in.jsonl"),
        ("../../etc/passwd", "passwd", "passwd"),
        ("C:\\Users\\x\\in.jsonl", "in.jsonl", "in.jsonl"),
        ("été.jsonl", "ete.jsonl", "été.jsonl"),
        ("x\"; filename*=UTF-8''evil.html", None, "x\"; filename*=UTF-8''evil.html"),
        ("a\r\nSet-Cookie: x=1", None, "aSet-Cookie: x=1"),
        ("", "download", "download"),
    ],
)
def test_a_clients_file_name_is_one_name_without_folders(sent, ascii_name, name):
    header = attachment(sent)
    assert "\r" not in header and "\n" not in header
    assert header.count("filename*=") <= 1 and header.count("filename=") <= 2
    parsed = _parsed(header)
    assert parsed["type"] == "attachment" and parsed["filename"] == name, header
    if ascii_name is not None:
        assert f'filename="{ascii_name}"' in header


def test_a_batch_files_crafted_name_cannot_inject_a_second_filename(client, tenant_key):
    crafted = 'folder/a".html'  # a quote that, unescaped, ended the header's name
    uploaded = client.post(
        "/v1/files",
        data={"purpose": "batch", "file": (io.BytesIO(b'{"custom_id": "a"}'), crafted)},
        headers=auth(tenant_key),
        content_type="multipart/form-data",
    ).get_json()
    answer = client.get(f"/v1/files/{uploaded['id']}/content", headers=auth(tenant_key))
    header = answer.headers["Content-Disposition"]
    # Whatever name the form's parser kept, it comes back as one name, without folders.
    stored = uploaded["filename"].replace("\\", "/").rsplit("/", 1)[-1]
    assert _parsed(header)["filename"] == stored, (uploaded["filename"], header)
    assert header.count("filename*=") <= 1 and header.count(";") <= 2
    assert answer.headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize(
    "path", ["/v1/models", "/v1/jobs/not-a-uuid", "/healthz", "/nothing-here", "/openapi.json"]
)
def test_every_answer_says_nosniff(client, tenant_key, path):
    answer = client.get(path, headers=auth(tenant_key))
    assert answer.headers.get("X-Content-Type-Options") == "nosniff", (path, answer.status_code)


def _png(size=(64, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (90, 120, 150)).save(buffer, "PNG")
    return buffer.getvalue()


def test_steps_that_leave_no_step_at_the_default_strength_are_refused(client, tenant_key):
    import base64

    image = "data:image/png;base64," + base64.b64encode(_png()).decode()
    body = {"kind": "img2img", "prompt": "p", "image": image, "steps": 1}
    answer = client.post("/v1/jobs", json=body, headers=auth(tenant_key))
    assert answer.status_code == 422, answer.get_json()
    (message,) = answer.get_json()["errors"]["json"]["steps"]
    assert "0.75 (the default) x 1" in message and "at least 2 steps" in message
    assert (
        client.post("/v1/jobs", json={**body, "steps": 2}, headers=auth(tenant_key)).status_code
        == 202
    )
    assert (
        client.post(
            "/v1/jobs", json={**body, "strength": 1.0}, headers=auth(tenant_key)
        ).status_code
        == 202
    )


def test_an_edit_with_one_step_is_a_422_naming_steps_not_a_500(client, tenant_key):
    answer = client.post(
        "/v1/images/edits",
        data={"prompt": "p", "steps": "1", "image": (io.BytesIO(_png()), "in.png")},
        headers=auth(tenant_key),
        content_type="multipart/form-data",
    )
    assert answer.status_code == 422, answer.get_json()
    assert answer.get_json()["error"]["param"] == "steps"


@pytest.mark.parametrize(
    "host", ["127\u30020\u30020\u30021", "\u24db\u24de\u24d2\u24d0\u24db\u24d7\u24de\u24e2\u24e3"]
)
def test_a_unicode_loopback_webhook_is_a_422_at_submit(client, tenant_key, host):
    body = {"prompt": "p", "webhook": f"http://{host}:9/hook"}
    answer = client.post("/v1/jobs", json=body, headers=auth(tenant_key))
    assert answer.status_code == 422, answer.get_json()
    assert "webhook" in answer.get_json()["errors"]["json"]


def test_a_running_job_says_its_time_left_at_its_own_pace():
    from datetime import timedelta
    from types import SimpleNamespace

    from app.db.types import utcnow
    from app.jobs.queue_info import running_eta

    def job(step: int, total: int, stage: str = "denoising", seconds: float = 30.0):
        progress = {"stage": stage, "step": step, "total_steps": total}
        return SimpleNamespace(progress=progress, started_at=utcnow() - timedelta(seconds=seconds))

    info = running_eta(job(10, 40))  # 30 s for 10 steps: 90 s for the 30 left
    assert info.position is None and 89 <= info.eta_seconds <= 92
    assert running_eta(job(0, 40)) is None  # no pace yet
    assert running_eta(job(5, 5)) is None  # denoising done: decoding, encoding
    assert running_eta(job(3, 40, stage="loading")) is None
