"""Image storage behind one small interface: S3 (any compatible endpoint) or a local folder."""

from __future__ import annotations

from urllib.parse import urlparse

from app.config import Settings
from app.storage.base import Storage, StorageError, StorageUnavailable

__all__ = [
    "Storage",
    "StorageError",
    "StorageUnavailable",
    "checkpoint_key",
    "image_key",
    "open_storage",
]


def image_key(tenant_id: object, job_id: object, index: int, extension: str) -> str:
    """Derived from the job id alone, so a re-run overwrites rather than duplicates."""
    return f"{tenant_id}/{job_id}/{index}.{extension}"


def checkpoint_key(tenant_id: object, job_id: object) -> str:
    """A running job's checkpoint (workers/checkpoints.py), beside its images."""
    return f"{tenant_id}/{job_id}/checkpoint.pt"


def open_storage(settings: Settings) -> Storage:
    parsed = urlparse(settings.storage_url)
    if parsed.scheme == "s3":
        from app.storage.s3 import S3Storage

        return S3Storage(
            bucket=parsed.netloc,
            prefix=parsed.path.lstrip("/"),
            endpoint_url=settings.s3_endpoint_url,
            public_endpoint_url=settings.s3_public_endpoint_url,
            region=settings.s3_region,
            create_bucket=settings.s3_create_bucket,
        )
    if parsed.scheme == "file":
        from app.storage.local import LocalStorage

        return LocalStorage(root=parsed.path, secret_key=settings.secret_key)
    raise ValueError(
        "DIFFQ_STORAGE_URL must be s3://bucket[/prefix] or file:///path, "
        f"got {settings.storage_url!r}"
    )
