"""The page and /docs: served from this server, under a strict Content-Security-Policy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.services

STATIC = Path(__file__).parents[2] / "app" / "web" / "ui" / "static"


def test_root_redirects_to_the_page(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response.headers["Location"].endswith("/ui")


@pytest.mark.parametrize("path", ["/ui", "/docs"])
def test_pages_carry_a_csp_without_inline_script(client, path):
    response = client.get(path)
    assert response.status_code == 200
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self';" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert "frame-ancestors 'none'" in policy
    html = response.get_data(as_text=True)
    # Every script has a src on this origin; none is inline or from elsewhere.
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)


def test_images_from_s3_are_allowed_and_nothing_else_is(client, stack):
    policy = client.get("/ui").headers["Content-Security-Policy"]
    img_src = next(p for p in policy.split("; ") if p.startswith("img-src"))
    assert stack.s3.endpoint.rstrip("/") in img_src.split()
    assert "*" not in img_src.split() and "https:" not in img_src.split()


def test_no_static_file_writes_markup_from_strings():
    for script in STATIC.glob("*.js"):
        text = script.read_text()
        assert not re.search(
            r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write", text
        ), script


def test_docs_assets_come_from_the_python_package(client):
    js = client.get("/docs/swagger/swagger-ui-bundle.js")
    assert js.status_code == 200
    assert js.mimetype == "text/javascript"
    assert b"SwaggerUIBundle" in js.data
    assert client.get("/docs/swagger/swagger-ui.css").status_code == 200
    assert client.get("/docs/swagger/index.html").status_code == 404
    assert client.get("/ui/docs.js").status_code == 200
