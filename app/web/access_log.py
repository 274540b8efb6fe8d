"""gunicorn's access log without secrets: a WebSocket ticket in a query string is written
as `ticket=[redacted]` (it opens a socket for a minute), and so is any other parameter
named like a credential."""

from __future__ import annotations

import re

from gunicorn.glogging import Logger

REDACTED = "[redacted]"
_SECRET_PARAMETER = re.compile(
    r"((?:^|[?&;])(?:ticket|token|key|api_key|access_token|signature)=)[^&;#\s]*", re.I
)


def redact(text: str | None) -> str | None:
    """`/v1/jobs/1/ws?ticket=abc&last_event_id=3` → `…?ticket=[redacted]&last_event_id=3`."""
    if not text:
        return text
    return _SECRET_PARAMETER.sub(lambda m: m.group(1) + REDACTED, text)


class RedactingLogger(Logger):
    """The `--logger-class` of `diffq api` (cli/serve.py)."""

    def atoms(self, resp, req, environ, request_time):
        atoms = super().atoms(resp, req, environ, request_time)
        for name in ("r", "q", "f"):
            atoms[name] = redact(atoms.get(name))
        return atoms
