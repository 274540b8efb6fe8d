"""What the API believes about a request before Flask sees it: which port it came in on,
who sent it, and the URL its links are built from.

- **Ports.** `diffq api` listens on the public port and, when DIFFQ_API_METRICS_PORT is
  set (9806 by default, on DIFFQ_API_METRICS_HOST), on a metrics port. The metrics port
  answers `/metrics` and `/healthz` only; the public port never answers `/metrics`
  (404, as for any path it does not serve). A network policy can then open one and not
  the other.
- **Forwarded headers.** `X-Forwarded-For` is read only from a peer inside
  DIFFQ_TRUSTED_PROXIES (werkzeug's ProxyFix, one hop); from anyone else every
  `X-Forwarded-*` and `Forwarded` header is dropped, so a client cannot choose the
  address its failed authentications are counted against. The scheme is the public
  URL's: `X-Forwarded-Proto` changes no link.
- **Links.** Every absolute URL the API writes (`Location`, a job's `urls`, a ticket's
  `url`, result links) is built from DIFFQ_PUBLIC_URL: the request's `Host` is replaced
  by it here, so no view can copy a client's `Host` into a link.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from urllib.parse import urlsplit

from werkzeug.middleware.proxy_fix import ProxyFix

from app.config import Settings

METRICS_PATHS = ("/metrics", "/healthz")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(raw: str | None) -> tuple[Network, ...]:
    """`10.0.0.0/8, 192.168.1.7` → networks; ValueError naming the bad entry."""
    networks = []
    for part in filter(None, (p.strip() for p in (raw or "").split(","))):
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError as exc:
            raise ValueError(f"not an address or network: {part!r}") from exc
    return tuple(networks)


def _in(address: str, networks: Iterable[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    return any(ip in network for network in networks)


def _not_found(start_response) -> list[bytes]:
    body = json.dumps({"code": 404, "status": "Not Found", "message": "Not found."}).encode()
    start_response(
        "404 NOT FOUND", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    )
    return [body]


class Edge:
    """The WSGI layer in front of the Flask app (app/web/factory.py)."""

    def __init__(self, app, settings: Settings) -> None:
        self.app = app
        self.trusted = parse_networks(settings.trusted_proxies)
        self.proxied = ProxyFix(app, x_for=1, x_proto=0, x_host=0, x_port=0, x_prefix=0)
        self.metrics_port = str(settings.api_metrics_port) if settings.api_metrics_port else None
        public = urlsplit(settings.public_url)
        self.scheme = public.scheme or "http"
        self.host = public.netloc
        self.prefix = public.path.rstrip("/")

    def __call__(self, environ, start_response):
        def with_nosniff(status, headers, exc_info=None):
            # Every answer: a browser never second-guesses the type diffq assigned.
            if not any(name.lower() == "x-content-type-options" for name, _ in headers):
                headers = [*headers, ("X-Content-Type-Options", "nosniff")]
            return start_response(status, headers, exc_info)

        return self._serve(environ, with_nosniff)

    def _serve(self, environ, start_response):
        on_metrics_port = environ.get("SERVER_PORT") == self.metrics_port
        path = environ.get("PATH_INFO", "")
        if on_metrics_port != (path == "/metrics") and not (on_metrics_port and path == "/healthz"):
            return _not_found(start_response)
        trusted = _in(environ.get("REMOTE_ADDR", ""), self.trusted)
        if not trusted:
            for name in [n for n in environ if n.startswith("HTTP_X_FORWARDED_")]:
                del environ[name]
            environ.pop("HTTP_FORWARDED", None)
        # Links: built from the public URL, whatever Host the client sent.
        environ["diffq.sent_host"] = environ.get("HTTP_HOST", "")
        environ["HTTP_HOST"] = self.host
        environ["wsgi.url_scheme"] = self.scheme
        if self.prefix:
            environ["SCRIPT_NAME"] = self.prefix
        if trusted:
            return self.proxied(environ, start_response)
        return self.app(environ, start_response)
