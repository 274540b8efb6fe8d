"""create_app(): the one place the Flask app is built."""

from __future__ import annotations

from flask import Flask

from app import logs
from app.config import Settings, load_settings
from app.metrics.instruments import HTTP_CUT
from app.web.body_limit import BodyLimit
from app.web.edge import Edge
from app.web.errors import register_error_handlers
from app.web.metrics import install as install_metrics
from app.web.model_bounds import declare as declare_model_bounds
from app.web.openapi import Api, KeyedOperations, spec_options
from app.web.request_reader import RequestGuard
from app.web.root import ApiRoot
from app.web.services import close_request_session


def create_app(settings: Settings | None = None, *, celery=None) -> Flask:
    """The API, wired by its process's root (app/services.py): a gunicorn worker builds
    one app, so one root. `settings` (tests, tools) stands in for the environment's."""
    settings = settings or load_settings()
    svc = ApiRoot(settings, celery=celery, publish_pause=settings.relay_after)
    logs.configure(settings.log_level, settings.log_format)
    app = Flask("diffq")
    app.config.update(
        API_TITLE="diffq",
        API_VERSION="v1",
        OPENAPI_VERSION="3.0.3",
        OPENAPI_URL_PREFIX="/",
        OPENAPI_JSON_PATH="openapi.json",
        API_SPEC_OPTIONS=spec_options(),
        MAX_CONTENT_LENGTH=max(
            settings.max_body_bytes,
            2 * settings.input_max_bytes,
            settings.batch_max_bytes,
            settings.adapter_max_bytes,
        ),
    )
    app.json.sort_keys = False
    # Opened now, not on a first request that many threads may share.
    svc.catalog, svc.db, svc.storage, svc.publisher, svc.watcher  # noqa: B018
    app.extensions["diffq"] = svc
    # app/web/openapi.py: flask-smorest's, with diffq's error document and keyed 401s
    api = Api(app, spec_kwargs={"extra_plugins": [KeyedOperations()]})
    from app.web.resources.adapters.routes import blp as adapters_blp
    from app.web.resources.batches.files import blp as batch_files_blp
    from app.web.resources.batches.routes import blp as batches_blp
    from app.web.resources.files.routes import blp as files_blp
    from app.web.resources.health.routes import blp as health_blp
    from app.web.resources.jobs.events import blp as events_blp
    from app.web.resources.jobs.routes import blp as jobs_blp
    from app.web.resources.jobs.webhooks import blp as webhooks_blp
    from app.web.resources.jobs.ws import blp as ws_blp
    from app.web.resources.models.routes import blp as models_blp
    from app.web.resources.openai.routes import blp as openai_blp
    from app.web.resources.openai.videos import blp as videos_blp
    from app.web.resources.uploads.routes import blp as uploads_blp
    from app.web.resources.usage.routes import blp as usage_blp
    from app.web.ui.routes import blp as ui_blp

    blueprints = (
        jobs_blp,
        uploads_blp,
        adapters_blp,
        events_blp,
        ws_blp,
        webhooks_blp,
        usage_blp,
        models_blp,
        health_blp,
        files_blp,
        openai_blp,
        videos_blp,
        batches_blp,
        batch_files_blp,
    )
    for blueprint in blueprints:
        api.register_blueprint(blueprint)
    app.register_blueprint(ui_blp)  # the page and /docs: HTML, not part of the API document
    declare_model_bounds(api.spec, svc.catalog)
    register_error_handlers(app, api)
    install_metrics(app, svc)
    app.teardown_appcontext(close_request_session)
    uploads = (settings.input_max_bytes, "DIFFQ_INPUT_MAX_BYTES")
    batches = (settings.batch_max_bytes, "DIFFQ_BATCH_MAX_BYTES")
    body_limit = BodyLimit(
        app.wsgi_app,
        settings.max_body_bytes,
        routes={
            "/v1/uploads": uploads,
            "/v1/adapters": (settings.adapter_max_bytes, "DIFFQ_ADAPTER_MAX_BYTES"),
            # An edit carries an image and its mask.
            "/v1/images/edits": (2 * settings.input_max_bytes, "2 x DIFFQ_INPUT_MAX_BYTES"),
            "/v1/batches": batches,
            "/v1/files": batches,
        },
        openai_prefix=openai_blp.url_prefix + "/",
    )
    # Outermost: the port a request came in on, its forwarded headers, its links' base.
    app.wsgi_app = Edge(body_limit, settings)
    # What the gunicorn worker reads each request with, before a thread takes it.
    app.extensions["diffq.request_guard"] = RequestGuard(
        header_timeout=settings.http_header_timeout,
        body_timeout=settings.http_body_timeout,
        limit=body_limit.limit_for,
        refusal=body_limit.refusal,
        cut=lambda reason: HTTP_CUT.labels(reason).inc(),
    )
    return app
