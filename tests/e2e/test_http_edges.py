"""What gunicorn answers by itself, and bodies the parser refuses, through the real server:
JSON problems like every other answer of the API; and its access log's byte counts."""

from __future__ import annotations

import io
import json
import re
import socket
import uuid

import pytest
import requests
from PIL import Image

from testbed.jobs import auth
from testbed.processes import ApiServer
from testbed.waiting import wait_until

pytestmark = pytest.mark.services


def _raw(api_server, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are; (status, headers, body) of the answer."""
    with socket.create_connection(("127.0.0.1", api_server.port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_a_100_kb_header_is_a_json_431(api_server, tenant_key):
    response = requests.get(
        f"{api_server.url}/v1/jobs",
        headers={**auth(tenant_key), "X-Padding": "p" * 100_000},
        timeout=10,
    )
    assert response.status_code == 431
    assert response.headers["Content-Type"] == "application/json"
    problem = response.json()
    assert problem["code"] == 431 and problem["status"] == "Request Header Fields Too Large"
    assert "8190 bytes" in problem["message"]


def test_a_request_line_over_the_limit_is_a_json_414(api_server):
    status, headers, body = _raw(
        api_server, b"GET /v1/jobs?" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert status == 414 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["code"] == 414


def test_a_malformed_request_is_a_json_400(api_server):
    status, headers, body = _raw(api_server, b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n")
    assert status == 400 and headers["Content-Type"] == "application/json"
    problem = json.loads(body)
    assert problem["code"] == 400 and "HTTP" in problem["message"]


def test_a_650_byte_body_nested_324_deep_is_a_422_through_gunicorn(api_server, tenant_key):
    body = '{"prompt": "x", "metadata": {"a": ' + "[" * 322 + "]" * 322 + "}}"
    assert len(body) < 700
    for path in ("/v1/jobs", "/v1/images/generations"):
        response = requests.post(
            f"{api_server.url}{path}",
            data=body,
            headers={**auth(tenant_key), "Content-Type": "application/json"},
            timeout=10,
        )
        assert response.status_code == 422, (path, response.text)
        assert "32 levels" in response.text


def _logged_bytes(server, path: str, query: str = r"(?:\?\S*)?") -> int:
    """The body size the access log wrote for the one GET of `path` (with a query that
    `query` matches), once the line is there: gunicorn writes it after the response."""
    pattern = rf'"GET {re.escape(path)}{query} HTTP/1\.1" 200 (\d+) '

    def logged():
        return [int(size) for size in re.findall(pattern, server.log())]

    (size,) = wait_until(logged, timeout=10)
    return size


def test_a_file_sent_whole_is_logged_with_its_size(api_server):
    """A file the API sends whole (Swagger UI's bundle, the page's files) was logged as
    `200 0`: gunicorn's sendfile path did not count its bytes."""
    for path in ("/docs/swagger/swagger-ui-bundle.js", "/ui/app.css"):
        mark = f"?seen={uuid.uuid4().hex}"  # this GET's line, whoever else fetched the file
        response = requests.get(f"{api_server.url}{path}{mark}", timeout=10)
        assert response.status_code == 200 and len(response.content) > 1000
        assert int(response.headers["Content-Length"]) == len(response.content)
        logged = _logged_bytes(api_server, path, re.escape(mark))
        assert logged == len(response.content), path


def test_an_image_of_the_local_store_is_logged_with_its_size(stack, tmp_path):
    """A result image of the local store (the embedded mode's `/files/…?signature=…`) is
    logged with the bytes sent; its signature stays out of the log."""
    from app.storage.local import LocalStorage

    secret = "s" * 32
    env = {**stack.env, "DIFFQ_STORAGE_URL": f"file://{tmp_path / 'images'}"}
    env["DIFFQ_SECRET_KEY"] = secret
    store = LocalStorage(root=tmp_path / "images", secret_key=secret)
    image = Image.effect_noise((160, 120), 64).convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    store.put("tenant/jobs/1/0.png", buffer.getvalue(), "image/png")
    server = ApiServer(env, tmp_path, name="api-local-files").start()
    try:
        link = store.url("tenant/jobs/1/0.png", 60)
        response = requests.get(f"{server.url}{link}", timeout=10)
        assert response.status_code == 200 and response.content == buffer.getvalue()
        assert _logged_bytes(server, "/files/tenant/jobs/1/0.png") == len(buffer.getvalue())
        assert "signature=[redacted]" in server.log()
        assert link.split("signature=")[1] not in server.log()
    finally:
        server.stop()
