"""The Files API batches use (OpenAI's `files.create`, `retrieve`, `content`, `list`,
`delete`): input files are kept in the result store under the tenant's prefix; a
batch's output and error files are rendered from its jobs when read (app/batches)."""

from __future__ import annotations

import json
import uuid

from flask import Response, request, stream_with_context
from flask.views import MethodView
from flask_smorest import abort
from sqlalchemy import select

from app.batches.render import output_lines
from app.db.models.batches import Batch, BatchFile
from app.db.types import utcnow
from app.ids import uuid7
from app.web.auth import current_tenant, require_api_key
from app.web.bodies import Blueprint
from app.web.downloads import attachment
from app.web.errors import found
from app.web.openapi import BINARY, form_body
from app.web.resources.batches import errors
from app.web.resources.batches.schemas import FileListSchema, FileSchema
from app.web.services import request_session, services

blp = Blueprint(
    "batch_files",
    __name__,
    url_prefix="/v1/files",
    description="Files for batches (OpenAI's Files API): upload a batch's input, download "
    "its output and error files.",
)
blp.before_request(require_api_key)
errors.install(blp)
PURPOSES = ("batch",)


@blp.before_request
def _larger_bodies() -> None:
    settings = services().settings
    request.max_content_length = settings.batch_max_bytes
    request.max_form_memory_size = settings.batch_max_bytes


def file_object(found: BatchFile) -> dict:
    return {
        "id": str(found.id),
        "object": "file",
        "bytes": found.bytes,
        "created_at": int(found.created_at.timestamp()),
        "filename": found.filename,
        "purpose": found.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def _file_or_404(file_id: uuid.UUID) -> BatchFile:
    mine = select(BatchFile).where(BatchFile.id == file_id, BatchFile.tenant_id == current_tenant())
    return found(request_session().scalar(mine), "file")


@blp.route("")
class Files(MethodView):
    @blp.doc(
        requestBody=form_body(
            {"file": BINARY, "purpose": {"type": "string", "enum": list(PURPOSES)}},
            ["file", "purpose"],
        )
    )
    @blp.response(200, FileSchema)
    @blp.alt_response(413, description="Over DIFFQ_BATCH_MAX_BYTES.")
    @blp.alt_response(422, description="No file, an empty one, or a purpose other than batch.")
    def post(self):
        """Upload a batch's input file

        Multipart: `file` (JSON Lines, one OpenAI request a line) and `purpose`
        (`batch`). Its lines are read when a batch names it (POST /v1/batches).
        """
        purpose = request.form.get("purpose")
        if purpose not in PURPOSES:
            abort(
                422,
                message="purpose: Must be batch.",
                errors={"form": {"purpose": ["Must be batch."]}},
            )
        upload = request.files.get("file")
        if upload is None:
            abort(422, message="file: Missing.", errors={"form": {"file": ["Missing."]}})
        data = upload.read()
        if not data.strip():
            abort(422, message="file: The file is empty.", errors={"form": {"file": ["Empty."]}})
        svc, tenant = services(), current_tenant()
        file_id = uuid7()
        key = f"{tenant}/files/{file_id}.jsonl"
        svc.storage.put(key, data, "application/jsonl")
        found = BatchFile(
            id=file_id,
            tenant_id=tenant,
            purpose=purpose,
            filename=(upload.filename or "input.jsonl")[:255],
            bytes=len(data),
            created_at=utcnow(),
            storage_key=key,
        )
        session = request_session()
        session.add(found)
        session.commit()
        return file_object(found)

    @blp.response(200, FileListSchema)
    def get(self):
        """List your files, newest first (at most 100)

        OpenAI's file objects: the batch input files you uploaded and the output files of
        your batches.
        """
        rows = request_session().scalars(
            select(BatchFile)
            .where(BatchFile.tenant_id == current_tenant())
            .order_by(BatchFile.id.desc())
            .limit(100)
        )
        return {"object": "list", "data": [file_object(f) for f in rows], "has_more": False}


@blp.route("/<uuid:file_id>")
class FileById(MethodView):
    @blp.response(200, FileSchema)
    @blp.alt_response(404, description="No such file (or not yours).")
    def get(self, file_id: uuid.UUID):
        """Get a file's description

        OpenAI's file object: its id, size, name, purpose and when it was made.
        """
        return file_object(_file_or_404(file_id))

    @blp.response(200, description='`{"id", "object": "file", "deleted": true}`.')
    @blp.alt_response(404, description="No such file (or not yours).")
    @blp.alt_response(409, description="An output file: it goes with its batch.")
    def delete(self, file_id: uuid.UUID):
        """Delete an input file

        Its bytes are removed from the store at once. A batch's output file goes with its
        batch (a 409).
        """
        found = _file_or_404(file_id)
        if found.storage_key is None:
            abort(409, message="A batch's output file goes with its batch.")
        services().storage.delete(found.storage_key)
        session = request_session()
        session.delete(found)
        session.commit()
        return {"id": str(file_id), "object": "file", "deleted": True}


@blp.route("/<uuid:file_id>/content")
class FileContent(MethodView):
    @blp.response(
        200, description="The file's bytes (JSON Lines).", content_type="application/jsonl"
    )
    @blp.alt_response(404, description="No such file (or not yours).")
    def get(self, file_id: uuid.UUID):
        """Download a file

        An input file as uploaded; a batch's output file (its succeeded requests) or
        error file (every other request) as JSON Lines in OpenAI's batch output shape,
        with freshly signed image links.
        """
        found = _file_or_404(file_id)
        svc = services()
        headers = {"Content-Disposition": attachment(found.filename)}
        if found.storage_key is not None:
            return Response(
                svc.storage.get(found.storage_key), mimetype="application/jsonl", headers=headers
            )
        stream = _rendered(svc, found.batch_id, found.purpose == "batch_error", request.url_root)
        return Response(stream_with_context(stream), mimetype="application/jsonl", headers=headers)


def _rendered(svc, batch_id: uuid.UUID, errors_file: bool, base_url: str):
    with svc.db.session() as session:
        batch = session.get(Batch, batch_id)
        if batch is None:
            return
        lines = output_lines(
            session,
            batch,
            svc.storage,
            svc.settings.presign_ttl,
            base_url,
            errors=errors_file,
        )
        for line in lines:
            yield json.dumps(line, separators=(",", ":")) + "\n"
