"""The page's CSP lets images come from where the storage serves them, and nowhere else."""

from __future__ import annotations

from app.config import load_settings
from app.web.ui.csp import image_origins, policy


def _settings(tmp_path, **env):
    return load_settings({"DIFFQ_HOME": str(tmp_path), **env})


def test_local_images_are_same_origin(tmp_path):
    settings = _settings(tmp_path)
    assert image_origins(settings) == []
    assert "img-src 'self' data: blob:;" in policy(settings)


def test_s3_images_come_from_the_endpoint_clients_reach(tmp_path):
    settings = _settings(
        tmp_path,
        DIFFQ_STORAGE_URL="s3://bucket/prefix",
        DIFFQ_S3_ENDPOINT_URL="http://seaweed.internal:8333",
        DIFFQ_S3_PUBLIC_ENDPOINT_URL="https://images.example.com/s3",
    )
    assert image_origins(settings) == ["https://images.example.com"]
    assert "connect-src 'self' https://images.example.com;" in policy(settings)


def test_aws_without_an_endpoint_allows_amazon_only(tmp_path):
    settings = _settings(tmp_path, DIFFQ_STORAGE_URL="s3://bucket")
    assert image_origins(settings) == ["https://*.amazonaws.com"]
    assert "script-src 'self';" in policy(settings)
