"""POST /v1/batches's body: which of its two forms it is, and each line checked.

**diffq's form** (the `Content-Type` says which): a JSON object with `requests`, a list of
POST /v1/jobs bodies each with the client's `custom_id`; or JSON Lines
(`application/jsonl`, `application/x-ndjson`), one such request a line, the batch's
options in the query string. Any bad line refuses the whole batch: `422`, nothing
stored, `errors.lines` naming each bad line (1-based: the n-th line, or the n-th item of
`requests`) and its fields, so a client fixes its input and sends it again.

**OpenAI's form**: a JSON object with `input_file_id` (a file uploaded with purpose
`batch`), `endpoint` and `completion_window`, the file's lines being OpenAI's request
lines (`custom_id`, `method`, `url`, `body`). As OpenAI does: a file whose lines cannot
be read as requests (not JSON, no `custom_id`, a duplicate one, another method or URL)
gives a batch that is `failed`, with `errors` naming each line; a request whose body
breaks a rule goes to the error file on its own and the others run.

So the two are told apart by `input_file_id`: present, OpenAI's; absent, diffq's.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from flask import request
from flask_smorest import abort

from app.batches.ingest import BatchLine, BatchRequest
from app.jobs.submit import Submission
from app.web.bodies import loads, parse_json_body
from app.web.inputs import keep, without_inputs
from app.web.resources.batches.endpoints import ENDPOINTS, LineRefused, load_job
from app.web.strings import unstorable
from app.webhooks.guard import UnsafeUrl, check_url_at_submit, parse_allow_list

JSONL_TYPES = ("application/jsonl", "application/x-ndjson", "application/x-jsonlines", "text/jsonl")
MAX_CUSTOM_ID = 256
MAX_LISTED = 100  # bad lines named in one answer
METADATA_MAX_BYTES = 2048
MIN_WINDOW, MAX_WINDOW = 60, 7 * 24 * 3600
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
OPTIONS = ("completion_window", "webhook", "metadata", "endpoint")


@dataclass
class Parsed:
    request: BatchRequest
    failed: list[dict[str, Any]] | None = None  # an OpenAI file's unreadable lines


def window_seconds(value: Any) -> int | None:
    """`completion_window`: seconds, or a number with a unit (`90m`, `24h`, `2d`)."""
    if value is None:
        return None
    text = str(value).strip().lower() if not isinstance(value, bool) else ""
    match = _WINDOW.match(text)
    if match is None:
        abort(
            422,
            message="completion_window: Must be seconds or a number with s, m, h or d (like 24h).",
            errors={"json": {"completion_window": ["Must be like 3600, 90m, 24h or 2d."]}},
        )
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if not MIN_WINDOW <= seconds <= MAX_WINDOW:
        abort(
            422,
            message=f"completion_window: Must be between {MIN_WINDOW} s and 7 days.",
            errors={"json": {"completion_window": ["Between 60 seconds and 7 days."]}},
        )
    return seconds


def _options(given: dict[str, Any], settings) -> dict[str, Any]:
    webhook = given.get("webhook")
    if webhook is not None:
        if not isinstance(webhook, str):
            _field_error("webhook", "Must be a URL.")
        try:
            check_url_at_submit(webhook, parse_allow_list(settings.webhook_allow_cidrs))
        except UnsafeUrl as exc:
            _field_error("webhook", f"Not allowed: {exc}.")
    metadata = given.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, dict) or len(json.dumps(metadata)) > METADATA_MAX_BYTES
    ):
        _field_error("metadata", f"An object of at most {METADATA_MAX_BYTES} bytes of JSON.")
    window = given.get("completion_window")
    return {
        "completion_window": str(window) if window is not None else None,
        "window_seconds": window_seconds(window),
        "webhook": webhook,
        "metadata": metadata,
    }


def _field_error(field: str, message: str) -> None:
    abort(422, message=f"{field}: {message}", errors={"json": {field: [message]}})


def _too_many(count: int, limit: int, what: str) -> None:
    abort(
        413,
        message=f"The batch has {count} requests; the limit is {limit} (DIFFQ_BATCH_MAX_LINES).",
        errors={"json": {what: [f"At most {limit} requests."]}},
    )


def _idempotency_key() -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is not None and not 1 <= len(key) <= 255:
        abort(
            422,
            message="Idempotency-Key: Length must be between 1 and 255.",
            errors={"headers": {"Idempotency-Key": ["Length must be between 1 and 255."]}},
        )
    return key


def parse(settings, read_file) -> Parsed:
    """The request as a batch to store, or the 4xx that refuses it. `read_file(id)` gives
    an uploaded input file's bytes (None: no such file of this tenant)."""
    mimetype = request.mimetype
    key = _idempotency_key()
    raw = request.get_data(cache=False)
    body_hash = hashlib.sha256(raw).hexdigest()
    if mimetype in JSONL_TYPES:
        options = {k: request.args.get(k) for k in OPTIONS if request.args.get(k) is not None}
        if "metadata" in options:
            try:
                options["metadata"] = loads(options["metadata"])
            except ValueError:
                _field_error("metadata", "Must be a JSON object.")
        items = _jsonl(raw, settings.batch_max_lines)
        return Parsed(_native(items, options, settings, key, body_hash, "body"))
    if mimetype != "application/json":
        problem = (
            "Send application/json (an object with `requests`, or OpenAI's "
            "`input_file_id`) or application/jsonl (one request a line)."
        )
        abort(415, message=problem, errors={"headers": {"Content-Type": [problem]}})
    body = parse_json_body(raw)  # a 400 or 422 saying what is wrong, never a 500
    if not isinstance(body, dict):
        _field_error("_schema", "The body must be a JSON object.")
    if problem := unstorable({k: v for k, v in body.items() if k != "requests"}):
        abort(422, message=f"A field: {problem}")
    unknown = sorted(set(body) - {"requests", "input_file_id", *OPTIONS, "output_expires_after"})
    if unknown:
        _field_error(unknown[0], "Unknown field.")
    if "input_file_id" in body:
        return _openai(body, settings, key, body_hash, read_file)
    items = body.get("requests")
    if not isinstance(items, list):
        _field_error("requests", "Missing: a list of job requests, each with its `custom_id`.")
    if len(items) > settings.batch_max_lines:
        _too_many(len(items), settings.batch_max_lines, "requests")
    endpoint = body.get("endpoint", "/v1/jobs")
    if endpoint != "/v1/jobs":
        _field_error("endpoint", "With `requests`, each is a POST /v1/jobs body: `/v1/jobs`.")
    numbered = list(enumerate(items, 1))
    return Parsed(_native(numbered, body, settings, key, body_hash, "requests"))


def _jsonl(raw: bytes, max_lines: int) -> list[tuple[int, Any]]:
    """(line number, parsed value) for every line that is not blank."""
    lines = raw.split(b"\n")
    items: list[tuple[int, Any]] = []
    bad: dict[str, dict[str, list[str]]] = {}
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        if len(items) >= max_lines:
            count = sum(1 for line in lines if line.strip())
            _too_many(count, max_lines, "body")
        try:
            items.append((number, loads(text)))
        except (ValueError, UnicodeDecodeError):
            if len(bad) < MAX_LISTED:
                bad[str(number)] = {"_line": ["Not valid JSON."]}
            items.append((number, None))
    if bad:
        _refuse_lines(bad, len(items))
    return items


def _refuse_lines(bad: dict[str, dict[str, list[str]]], total: int, more: int = 0) -> None:
    first, problems = next(iter(bad.items()))
    field, messages = next(iter(problems.items()))
    named = "" if field == "_line" else f"{field}: "
    count = len(bad) + more
    abort(
        422,
        message=f"{count} of {total} requests are invalid, nothing was stored; line {first}: "
        f"{named}{' '.join(messages)}",
        errors={"lines": bad},
    )


def _native(items, options, settings, key, body_hash, what: str) -> BatchRequest:
    opts = _options(options, settings)
    if not items:
        abort(
            422,
            message="The batch has no requests.",
            errors={"json": {what: ["At least one request."]}},
        )
    lines: list[BatchLine] = []
    bad: dict[str, dict[str, Any]] = {}
    more = 0
    seen: set[str] = set()
    inputs: list = []
    for number, item in items:
        try:
            custom_id, body = _custom_id(item, seen)
            loaded, _ = load_job(body)
        except LineRefused as exc:
            if len(bad) < MAX_LISTED:
                bad[str(number)] = exc.errors or {exc.param or "_line": [exc.message]}
            else:
                more += 1
            continue
        loaded, needs = without_inputs(loaded)
        inputs.extend(needs)
        lines.append(BatchLine(number, custom_id, Submission(**loaded)))
    if bad:
        _refuse_lines(bad, len(items), more)
    keep(inputs)  # the whole batch is valid: its input images are stored
    return BatchRequest(
        endpoint="/v1/jobs",
        lines=lines,
        completion_window=opts["completion_window"],
        window_seconds=opts["window_seconds"],
        webhook=opts["webhook"],
        metadata=opts["metadata"],
        idempotency_key=key,
        body_hash=body_hash,
    )


def _custom_id(item: Any, seen: set[str]) -> tuple[str, dict[str, Any]]:
    if not isinstance(item, dict):
        raise LineRefused("Must be a JSON object.", "_line", {"_line": ["Must be a JSON object."]})
    body = dict(item)
    custom_id = body.pop("custom_id", None)
    problem = None
    if custom_id is None:
        problem = "Missing: every request needs its own custom_id."
    elif not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID:
        problem = f"Must be a string of 1 to {MAX_CUSTOM_ID} characters."
    elif "\x00" in custom_id:
        problem = "Must not contain a NUL character (U+0000)."
    elif custom_id in seen:
        problem = f"Duplicate: {custom_id!r} names an earlier request too."
    if problem is not None:
        raise LineRefused(f"custom_id: {problem}", "custom_id", {"custom_id": [problem]})
    seen.add(custom_id)
    return custom_id, body


def _openai(body, settings, key, body_hash, read_file) -> Parsed:
    raw_id = body.get("input_file_id")
    try:
        file_id = uuid.UUID(str(raw_id))
    except ValueError:
        file_id = None
    data = read_file(file_id) if file_id is not None else None
    if data is None:
        abort(404, message=f"No such file: {raw_id!r} (upload it with POST /v1/files).")
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        names = ", ".join(ENDPOINTS)
        _field_error("endpoint", f"Must be one of {names}.")
    window = body.get("completion_window")
    if window is None:
        _field_error("completion_window", "Missing: like 24h.")
    opts = _options(body, settings)
    loader = ENDPOINTS[endpoint].load
    lines: list[BatchLine] = []
    failed: list[dict[str, Any]] = []
    seen: set[str] = set()
    inputs: list = []
    numbered = [(n, text) for n, text in enumerate(data.split(b"\n"), 1) if text.strip()]
    if not numbered:
        _field_error("input_file_id", "The file has no requests.")
    if len(numbered) > settings.batch_max_lines:
        _too_many(len(numbered), settings.batch_max_lines, "input_file_id")
    for number, text in numbered:
        problem = None
        try:
            item = loads(text)
        except (ValueError, UnicodeDecodeError):
            item, problem = None, ("invalid_json_line", "Not valid JSON.", None)
        if problem is None and not isinstance(item, dict):
            problem = ("invalid_request", "Must be a JSON object.", None)
        if problem is None:
            custom_id = item.get("custom_id")
            if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID:
                problem = ("invalid_custom_id", "custom_id: 1 to 256 characters.", "custom_id")
            elif custom_id in seen:
                used = f"custom_id {custom_id!r} is used by an earlier line."
                problem = ("duplicate_custom_id", used, "custom_id")
            elif str(item.get("method", "POST")).upper() != "POST":
                problem = ("invalid_method", "method must be POST.", "method")
            elif item.get("url") != endpoint:
                problem = ("mismatched_url", f"url must be the batch's {endpoint}.", "url")
            elif not isinstance(item.get("body"), dict):
                problem = ("invalid_body", "body must be a JSON object.", "body")
            elif unstorable(item):
                problem = ("invalid_value", f"A value: {unstorable(item)}", None)
        if problem is not None:
            code, message, param = problem
            failed.append({"code": code, "message": message, "param": param, "line": number})
            continue
        seen.add(custom_id)
        try:
            loaded, b64 = loader(item["body"])
        except LineRefused as exc:
            error = {"status": 422, "code": "invalid_value", "message": exc.message}
            error["param"] = exc.param
            lines.append(BatchLine(number, custom_id, error=error))
            continue
        loaded, needs = without_inputs(loaded)
        inputs.extend(needs)
        lines.append(BatchLine(number, custom_id, Submission(**loaded), b64_json=b64))
    keep(inputs)
    return Parsed(
        BatchRequest(
            endpoint=endpoint,
            lines=lines,
            completion_window=str(window),
            window_seconds=opts["window_seconds"],
            webhook=opts["webhook"],
            metadata=opts["metadata"],
            input_file_id=file_id,
            idempotency_key=key,
            body_hash=body_hash,
        ),
        failed=failed[:MAX_LISTED] if failed else None,
    )
