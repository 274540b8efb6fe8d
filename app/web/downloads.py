"""The `Content-Disposition` of a download (RFC 6266, RFC 5987): the file's own name as
`filename*` (UTF-8, percent-encoded), an ASCII stand-in as `filename`, and never a path:
a name's folders (`../`, `C:\\`) are dropped, quotes, backslashes and control characters
cannot break out of the header."""

from __future__ import annotations

import unicodedata
from urllib.parse import quote

FALLBACK = "download"
SAFE = " ._-()[]+,"  # with letters and digits, what the ASCII `filename` keeps


def attachment(filename: str | None) -> str:
    """`attachment; filename="…"; filename*=UTF-8''…` for a name a client gave."""
    name = (filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C").strip(" .")
    if not name:
        name = FALLBACK
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    ascii_name = "".join(ch if ch.isalnum() or ch in SAFE else "_" for ch in ascii_name)
    ascii_name = ascii_name.strip(" ._") or FALLBACK
    if ascii_name == name:
        return f'attachment; filename="{name}"'
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"
