"""The Content-Security-Policy of the page and the docs: scripts and styles from here only."""

from __future__ import annotations

from urllib.parse import urlparse

from app.config import Settings


def _origin(url: str) -> str:
    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.netloc}"


def image_origins(settings: Settings) -> list[str]:
    """Where result images (and a video job's clip) are served from: this origin, or the S3
    endpoint clients reach."""
    if urlparse(settings.storage_url).scheme != "s3":
        return []  # local images are under /files on this origin
    endpoint = settings.s3_public_endpoint_url or settings.s3_endpoint_url
    return [_origin(endpoint)] if endpoint else ["https://*.amazonaws.com"]


def policy(settings: Settings) -> str:
    storage = image_origins(settings)
    images = " ".join(["'self'", "data:", "blob:", *storage])
    media = " ".join(["'self'", *storage])  # a video job's MP4, where its poster is
    connect = " ".join(["'self'", *storage])
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            f"img-src {images}",
            f"media-src {media}",
            # Downloads read the image back as a blob; the API is this origin.
            f"connect-src {connect}",
            "font-src 'self'",
            "manifest-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


def security_headers(settings: Settings) -> dict[str, str]:
    return {
        "Content-Security-Policy": policy(settings),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
    }
