"""GET /files/<key>?expires=…&signature=…: what a presigned URL is when images are local."""

from __future__ import annotations

from flask import request, send_file
from flask.views import MethodView
from flask_smorest import abort

from app.storage.base import StorageError
from app.storage.local import LocalStorage
from app.web.bodies import Blueprint
from app.web.services import services

blp = Blueprint("files", __name__, description="Signed image downloads (local storage only).")


@blp.route("/files/<path:key>")
class SignedFile(MethodView):
    @blp.doc(security=[])
    @blp.response(200, description="The image.")
    @blp.alt_response(403, description="Bad or expired signature.")
    @blp.alt_response(404, description="No such file, or storage is not local.")
    def get(self, key: str):
        """Download a locally stored image with a signed, expiring URL

        The links a job's images get when the images are stored on this machine (`diffq
        up`'s default): `expires` and `signature` are the link's; no key is needed.
        """
        storage = services().storage
        if not isinstance(storage, LocalStorage):
            abort(404, message="Not found.")
        try:
            expires = int(request.args.get("expires", ""))
        except ValueError:
            abort(403, message="Bad or expired signature.")
        if not storage.verify(key, expires, request.args.get("signature", "")):
            abort(403, message="Bad or expired signature.")
        try:
            path = storage.path(key)
        except StorageError:
            abort(404, message="Not found.")
        if not path.is_file():
            abort(404, message="Not found.")
        return send_file(path, max_age=0)
