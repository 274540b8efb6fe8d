"""A local folder as the image store, with HMAC-signed expiring URLs served by the API."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import time
from pathlib import Path
from urllib.parse import quote

from app.storage.base import StorageError

FILES_ROUTE = "/files/"


def _signature(secret_key: str, key: str, expires: int) -> str:
    mac = hmac.new(secret_key.encode(), f"{key}\n{expires}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


class LocalStorage:
    def __init__(self, *, root: str | Path, secret_key: str) -> None:
        self.root = Path(root)
        self.secret_key = secret_key

    def path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise StorageError(f"key escapes the storage root: {key!r}", transient=False)
        return path

    def put(self, key: str, data: bytes, content_type: str) -> None:
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)  # readers see the whole file or none of it
        except OSError as exc:
            raise StorageError(f"put {key}: {exc}", transient=True) from exc

    def delete(self, key: str) -> None:
        path = self.path(key)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"delete {key}: {exc}", transient=True) from exc
        # Its folder (a job's, or an upload's) goes with its last file; one still holding
        # files, or the root, stays.
        if path.parent != self.root.resolve():
            with contextlib.suppress(OSError):
                path.parent.rmdir()

    def get(self, key: str) -> bytes:
        try:
            return self.path(key).read_bytes()
        except FileNotFoundError as exc:
            raise StorageError(f"get {key}: no such object", transient=False) from exc
        except OSError as exc:
            raise StorageError(f"get {key}: {exc}", transient=True) from exc

    def url(self, key: str, ttl: int) -> str:
        """A path on the API (made absolute by the API), valid for `ttl` seconds."""
        expires = int(time.time()) + ttl
        signature = _signature(self.secret_key, key, expires)
        return f"{FILES_ROUTE}{quote(key)}?expires={expires}&signature={signature}"

    def verify(self, key: str, expires: int, signature: str) -> bool:
        if expires < time.time():
            return False
        return hmac.compare_digest(_signature(self.secret_key, key, expires), signature)

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"storage folder {self.root}: {exc}", transient=False) from exc
        if not os.access(self.root, os.W_OK):
            raise StorageError(f"storage folder {self.root} is not writable", transient=False)
