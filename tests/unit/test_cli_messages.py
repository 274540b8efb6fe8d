"""How the `diffq` client commands say an API's error (cli/api.py's ApiError): the
message with each field's problem, a batch's bad lines (a few of them), Retry-After on
the same line, and whether the request was refused (exit 2) or not served (exit 3)."""

from __future__ import annotations

from cli.api import MAX_LINES_SHOWN, ApiError
from diffq.client.errors import InvalidResponseError, error_for


def _said(status: int, body: dict, retry_after: float | None = None) -> ApiError:
    return ApiError(error_for(status, body, retry_after))


def test_a_refusal_is_its_message_and_each_field():
    refused = _said(
        422,
        {
            "status": "Unprocessable Entity",
            "message": "Invalid request.",
            "errors": {"json": {"steps": ["Too many."], "loras": {"0": {"scale": ["Big."]}}}},
        },
    )
    assert refused.refused
    assert str(refused).splitlines() == [
        "HTTP 422 Unprocessable Entity",
        "  Invalid request.",
        "  steps: Too many.",
        "  loras.0.scale: Big.",
    ]


def test_a_batchs_bad_lines_are_named_a_few_at_a_time():
    bad = {str(n): {"steps": ["Too many."]} for n in range(1, 16)}
    bad["2"] = {"_line": ["Not valid JSON."]}
    refused = _said(
        422,
        {
            "status": "Unprocessable Entity",
            "message": "15 of 15 requests are invalid.",
            "errors": {"lines": bad},
        },
    )
    lines = str(refused).splitlines()
    assert lines[:4] == [
        "HTTP 422 Unprocessable Entity",
        "  15 of 15 requests are invalid.",
        "  line 1: steps: Too many.",
        "  line 2: Not valid JSON.",
    ]
    assert len(lines) == 2 + MAX_LINES_SHOWN + 1
    assert lines[-1] == f"  … and {15 - MAX_LINES_SHOWN} more lines"


def test_what_the_service_could_not_serve_is_one_line_and_not_refused():
    outage = _said(
        503,
        {"status": "Service Unavailable", "message": "The job store is unavailable."},
        retry_after=5,
    )
    assert not outage.refused
    assert str(outage) == (
        "HTTP 503 Service Unavailable: The job store is unavailable. (retry after 5 s)"
    )
    assert not _said(500, {"status": "Internal Server Error", "message": "Oops."}).refused
    unreadable = ApiError(InvalidResponseError(200, "the answer is not JSON: '<html>'"))
    assert (
        not unreadable.refused and str(unreadable) == "HTTP 200: the answer is not JSON: '<html>'"
    )
    limited = _said(429, {"status": "Too Many Requests", "message": "Slow down."}, retry_after=7)
    assert limited.refused and str(limited).endswith("Slow down. (retry after 7 s)")
