"""GET / (a redirect), /ui and its assets, /docs and Swagger UI's assets from its package."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Response, redirect, send_from_directory
from swagger_ui_bundle import swagger_ui_path

from app.web.services import services
from app.web.ui.csp import security_headers

STATIC = Path(__file__).parent / "static"
# The Swagger UI files /docs needs, served from the swagger-ui-bundle package.
SWAGGER_FILES = frozenset(
    {"swagger-ui.css", "swagger-ui-bundle.js", "favicon-32x32.png", "favicon-16x16.png"}
)
ASSET_MAX_AGE = 3600

blp = Blueprint("ui", __name__)


@blp.after_request
def _headers(response: Response) -> Response:
    response.headers.update(security_headers(services().settings))
    return response


@blp.get("/")
def root():
    return redirect("/ui", 302)


@blp.get("/ui")
def page():
    return send_from_directory(STATIC, "index.html", max_age=0)


@blp.get("/ui/<path:name>")
def page_asset(name: str):
    # Revalidated on every load, so an upgrade never mixes old and new modules.
    return send_from_directory(STATIC, name, max_age=0)


@blp.get("/docs")
def docs():
    return send_from_directory(STATIC, "docs.html", max_age=0)


@blp.get("/docs/swagger/<name>")
def swagger_asset(name: str):
    if name not in SWAGGER_FILES:
        return Response("Not found.", status=404, mimetype="text/plain")
    return send_from_directory(Path(str(swagger_ui_path)), name, max_age=ASSET_MAX_AGE)
