"""What gunicorn answers by itself, and bodies the parser refuses, through the real server:
JSON problems like every other answer of the API."""

from __future__ import annotations

import json
import socket

import pytest
import requests

from testbed.jobs import auth

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
