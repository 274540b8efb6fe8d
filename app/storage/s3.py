"""S3 storage through boto3: any S3-compatible endpoint (AWS, SeaweedFS, MinIO)."""

from __future__ import annotations

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from app.storage.base import StorageError

_PERMANENT_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "NoSuchBucket",
    "InvalidBucketName",
}


def _translate(exc: Exception, action: str) -> StorageError:
    """boto errors stop here: the rest of diffq sees StorageError only."""
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        transient = code not in _PERMANENT_CODES and (status >= 500 or status in (0, 408, 429))
        return StorageError(f"{action}: S3 answered {status} {code}", transient=transient)
    return StorageError(f"{action}: {type(exc).__name__}: {exc}", transient=True)


class S3Storage:
    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        public_endpoint_url: str | None = None,
        region: str = "us-east-1",
        create_bucket: bool = False,
        connect_timeout: float = 3.0,
        read_timeout: float = 20.0,
    ) -> None:
        if not bucket:
            raise ValueError("an S3 storage URL needs a bucket: s3://BUCKET[/prefix]")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        config = Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            # diffq retries with its own backoff (app/storage/retry.py); one try per call here.
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
        self.client = boto3.client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config
        )
        # Presigned URLs carry the host they were signed for: sign for the one clients reach.
        self.presigner = (
            boto3.client("s3", endpoint_url=public_endpoint_url, region_name=region, config=config)
            if public_endpoint_url
            else self.client
        )
        self._create_bucket = create_bucket
        self._bucket_ready = False

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _ensure_bucket(self) -> None:
        if self._bucket_ready or not self._create_bucket:
            return
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 404:
                raise
            self.client.create_bucket(Bucket=self.bucket)
        self._bucket_ready = True

    def put(self, key: str, data: bytes, content_type: str) -> None:
        try:
            self._ensure_bucket()
            self.client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, ContentType=content_type
            )
        except (BotoCoreError, ClientError) as exc:
            raise _translate(exc, f"put {key}") from exc

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (BotoCoreError, ClientError) as exc:
            raise _translate(exc, f"delete {key}") from exc

    def get(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except (BotoCoreError, ClientError) as exc:
            raise _translate(exc, f"get {key}") from exc

    def url(self, key: str, ttl: int) -> str:
        return self.presigner.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self._key(key)}, ExpiresIn=ttl
        )

    def check(self) -> None:
        """The store answers. A missing bucket is fine when diffq creates it on the first
        upload (DIFFQ_S3_CREATE_BUCKET): a fresh deployment is ready before any image."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404 and self._create_bucket:
                return
            raise _translate(exc, f"head bucket {self.bucket}") from exc
        except BotoCoreError as exc:
            raise _translate(exc, f"head bucket {self.bucket}") from exc
