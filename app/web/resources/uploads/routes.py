"""Input images: `POST /v1/uploads` stores one for the tenant (checked and decoded here,
never first in a worker), a job names it by id (`image`, `mask`)."""

from __future__ import annotations

import uuid

import marshmallow as ma
from flask import redirect, request, url_for
from flask.views import MethodView
from flask_smorest import abort
from marshmallow import fields

from app import uploads
from app.addons.controlnet import control as controls
from app.uploads import InputRefused, input_key
from app.web.auth import current_tenant, require_api_key
from app.web.bodies import Blueprint
from app.web.errors import found
from app.web.inputs import store
from app.web.openapi import BINARY, answers, form_body
from app.web.services import request_session, services

blp = Blueprint(
    "uploads",
    __name__,
    url_prefix="/v1/uploads",
    description="Input images for image-to-image and inpainting jobs.",
)
blp.before_request(require_api_key)

IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp")


class UploadSchema(ma.Schema):
    id = fields.UUID(metadata={"description": "What a job's `image` or `mask` names."})
    sha256 = fields.String(
        metadata={"description": "SHA-256 of the image as stored (PNG): in job manifests."}
    )
    width = fields.Integer(metadata={"example": 768})
    height = fields.Integer(metadata={"example": 512})
    bytes = fields.Integer(metadata={"description": "Size of the stored PNG."})
    mode = fields.String(metadata={"description": "RGB, or RGBA where the image has transparency."})
    content_type = fields.String(metadata={"example": "image/png"})
    created_at = fields.DateTime()
    expires_at = fields.DateTime(
        metadata={
            "description": "After this the id no longer names it (DIFFQ_INPUT_TTL); a job "
            "that uses it keeps the image as long as the job's results are kept."
        }
    )
    urls = fields.Dict(keys=fields.String(), values=fields.String())


def _view(row) -> dict:
    shown = ("id", "sha256", "width", "height", "bytes", "mode", "created_at", "expires_at")
    return {
        **{name: getattr(row, name) for name in shown},
        "content_type": "image/png",
        "urls": {
            "self": url_for("uploads.Upload", upload_id=row.id, _external=True),
            "content": url_for("uploads.UploadContent", upload_id=row.id, _external=True),
        },
    }


def _found(upload_id: uuid.UUID):
    return found(uploads.find(request_session(), current_tenant(), upload_id), "upload")


def _body() -> bytes:
    """The image: the `file` part of a multipart form, or the whole body."""
    if request.mimetype == "multipart/form-data":
        part = request.files.get("file")
        if part is None:
            abort(422, errors={"files": {"file": ["Missing: send the image as `file`."]}})
        return part.read()
    if request.mimetype not in (*IMAGE_TYPES, "application/octet-stream"):
        problem = (
            f"Send the image as multipart/form-data (field `file`) or as the body with "
            f"Content-Type one of {', '.join(IMAGE_TYPES)}; got {request.mimetype or 'none'!r}."
        )
        abort(415, message=problem, errors={"headers": {"Content-Type": [problem]}})
    return request.get_data(cache=False)


@blp.route("")
class Uploads(MethodView):
    @blp.doc(
        requestBody=form_body(
            {"file": BINARY}, ["file"], **{kind: {"schema": BINARY} for kind in IMAGE_TYPES}
        )
    )
    @blp.response(201, UploadSchema)
    @answers(
        blp,
        """
        413 Past DIFFQ_INPUT_MAX_BYTES.
        415 Neither a multipart form nor an image body.
        422 Not a PNG, JPEG or WebP image, truncated or damaged, or past
            DIFFQ_INPUT_MAX_PIXELS (read from its header, before decoding).
        """,
    )
    def post(self):
        """Upload an input image

        Checked and decoded here: a PNG, JPEG or WebP image, at most DIFFQ_INPUT_MAX_PIXELS
        pixels (read from the header before anything is decoded), decoded in full, turned
        upright by its EXIF orientation, stored as PNG under your prefix. The same image
        uploaded again is the same upload (its expiry moved on). Jobs name it by `id`.
        """
        try:
            row = store(_body(), field="file")
        except InputRefused as refused:
            abort(refused.status, errors={"files": {"file": [refused.message]}})
        return _view(row), 201


@blp.route("/<uuid:upload_id>")
class Upload(MethodView):
    @blp.response(200, UploadSchema)
    @blp.alt_response(404, description="No such upload (or not yours, or expired).")
    def get(self, upload_id: uuid.UUID):
        """Look an upload up

        Its digest, size and mode, when it was stored and when it expires, and its links
        (`urls.content` downloads the PNG). Another tenant's, a forgotten or an expired
        upload is a 404.
        """
        return _view(_found(upload_id))

    @blp.response(204)
    @blp.alt_response(404, description="No such upload (or not yours, or expired).")
    def delete(self, upload_id: uuid.UUID):
        """Forget an upload

        Its id names nothing from now on, and the stored image is deleted at once: a
        link to it handed out before answers 404. Where a job that may still run, or
        whose results are kept, names the image, it stays until that job's results go
        (the job needs it to run, and a replay to run again).
        """
        row = _found(upload_id)
        uploads.forget(request_session(), services().storage, row)
        return None


@blp.route("/<uuid:upload_id>/content")
class UploadContent(MethodView):
    @blp.response(302, description="Redirect to a short-lived download URL of the PNG.")
    @blp.alt_response(404, description="No such upload (or not yours, or expired).")
    def get(self, upload_id: uuid.UUID):
        """Download an upload (the PNG as stored)

        A redirect to a link to the PNG that expires after DIFFQ_PRESIGN_TTL seconds
        (900); the link needs no key.
        """
        svc = services()
        row = _found(upload_id)
        key = input_key(row.tenant_id, row.sha256)
        return redirect(svc.storage.url(key, svc.settings.presign_ttl), 302)


class ControlQuerySchema(ma.Schema):
    preprocess = fields.String(
        load_default="canny",
        validate=ma.validate.OneOf(controls.PREPROCESSORS),
        metadata={"description": "`canny` (default) or `none`, as a job's control says."},
    )


@blp.route("/<uuid:upload_id>/control")
class UploadControl(MethodView):
    @blp.arguments(ControlQuerySchema, location="query")
    @blp.response(
        200,
        description="The PNG a ControlNet reads, at the upload's size.",
        content_type="image/png",
    )
    @blp.alt_response(404, description="No such upload (or not yours, or expired).")
    @blp.alt_response(422, description="An unknown `preprocess`.")
    def get(self, query, upload_id: uuid.UUID):
        """Preview an upload as a control image

        What a job's control with this image and `preprocess` gives its ControlNet (the
        worker resizes it to the job's output first): with `canny`, OpenCV's Canny edges,
        white on black. The page shows it beside the control field.
        """
        import io

        from flask import send_file
        from PIL import Image

        svc = services()
        row = _found(upload_id)
        data = svc.storage.get(input_key(row.tenant_id, row.sha256))
        image = Image.open(io.BytesIO(data))
        made = controls.preprocessed(image, query["preprocess"], image.width, image.height)
        buffer = io.BytesIO()
        made.save(buffer, format="PNG")
        buffer.seek(0)
        return send_file(buffer, mimetype="image/png", max_age=0)
