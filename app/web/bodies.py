"""Request bodies: one parser for every operation that reads a JSON body.

Whatever the body, the answer is a JSON problem that says what is wrong, never a 500:

- `415` a body sent without `Content-Type: application/json` (or `application/*+json`),
  naming the header (`errors.headers["Content-Type"]`);
- `400` a body that is not JSON: not UTF-8, or a syntax error, with the decoder's
  position (`errors.json`: `["Invalid JSON body: Expecting value: line 1 column 11 …"]`);
- `422` JSON beyond the parser's limits, naming the top-level field it is in: nested
  deeper than MAX_DEPTH levels, a number written in more than MAX_NUMBER_CHARS
  characters, or one JSON has not (`NaN`, `Infinity`, or a float beyond the double's
  range). Python's decoder would otherwise fail with RecursionError (about 320 levels
  under gunicorn, fewer in a deep call stack) or ValueError (integers over 4,300
  digits): 500s from a body of a few hundred bytes.

An empty body is no body: the schema then reports its missing required fields.

The limits are checked cheaply on the way: the decoder calls back for each number, and
the nesting is only measured when the body holds more brackets than MAX_DEPTH. The scan
that names the field runs only for a body already refused.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NoReturn

import flask
import flask_smorest
import marshmallow as ma
from flask_smorest import abort
from webargs import core
from webargs.flaskparser import FlaskParser

MAX_DEPTH = 32  # the request object is level 1, so `metadata` may nest 31 levels
MAX_NUMBER_CHARS = 100  # a seed or a size needs ten; a double's exact decimal, 25

NOT_JSON_NUMBER = "NaN and Infinity are not JSON numbers."


class _Refused(ValueError):
    """A number the parser does not take (raised from the decoder's callbacks)."""


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Refused(text)
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Refused(text)
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(text)
    return value


def _constant(text: str) -> NoReturn:
    raise _Refused(text)


# Strings (skipped whole, so brackets inside them do not count), brackets, and numbers
# (NaN and Infinity among them).
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]|-?(?:\d[\d.eE+-]*|Infinity)|NaN', re.S)


def _field_name(token: str) -> str:
    try:
        return str(json.loads(token))
    except ValueError:
        return token[1:-1]


def _number_problem(token: str) -> str | None:
    if token == "NaN" or token.endswith("Infinity"):
        return NOT_JSON_NUMBER
    if len(token) > MAX_NUMBER_CHARS:
        return (
            f"A number written in {len(token):,} characters; at most {MAX_NUMBER_CHARS} are read."
        )
    if not token.lstrip("-").isdigit():
        try:
            if not math.isfinite(float(token)):
                return f"{token[:20]} is beyond the range of a number (a double)."
        except ValueError:
            return None  # not a number after all: the decoder's message will say
    return None


def locate(text: str) -> tuple[str | None, str] | None:
    """(the top-level field, what is wrong) for the first value beyond the parser's limits
    in `text`, or None. The field is None when the body is not an object."""
    depth = 0
    field: str | None = None
    in_object = text.lstrip().startswith("{")
    for match in _TOKENS.finditer(text):
        token = match.group()
        first = token[0]
        if first == '"':
            # At depth 1 the last string before any value is that value's key.
            if depth == 1 and in_object:
                field = _field_name(token)
        elif first in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return field, (
                    f"Nested more than {MAX_DEPTH} levels deep; a request body may nest at "
                    f"most {MAX_DEPTH} levels (the body itself is level 1)."
                )
        elif first in "]}":
            depth -= 1
        else:
            problem = _number_problem(token)
            if problem is not None:
                return field, problem
    return None


def _refuse(found: tuple[str | None, str] | None) -> NoReturn:
    if found is None:
        abort(400, errors={"json": ["Invalid JSON body."]})
    field, problem = found
    abort(422, errors={"json": {field if field is not None else "_schema": [problem]}})


def parse_json_body(data: bytes) -> Any:
    """The body's JSON, or an HTTP error (400 or 422) that says what is wrong with it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        abort(
            400,
            errors={"json": [f"Invalid JSON body: not UTF-8 ({exc.reason} at byte {exc.start})."]},
        )
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        _refuse_undecodable(text, exc)
    except (_Refused, RecursionError, ValueError):
        _refuse(locate(text))
    if text.count("[") + text.count("{") > MAX_DEPTH:
        found = locate(text)
        if found is not None:
            _refuse(found)
    return value


def loads(data: bytes | str) -> Any:
    """JSON within the same limits as a body (a batch's lines), or ValueError saying what
    is wrong; never RecursionError."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except json.JSONDecodeError:
        raise
    except (_Refused, RecursionError, ValueError):
        found = locate(text)
        raise ValueError(found[1] if found else "Not valid JSON.") from None
    if text.count("[") + text.count("{") > MAX_DEPTH and (found := locate(text)):
        raise ValueError(found[1])
    return value


def _refuse_undecodable(text: str, exc: json.JSONDecodeError) -> NoReturn:
    # A body cut short may also be nested too deep before the cut: say the first.
    found = locate(text[: exc.pos])
    if found is not None:
        _refuse(found)
    abort(400, errors={"json": [f"Invalid JSON body: {exc}."]})


def _content_type_problem(request: flask.Request) -> str:
    sent = request.headers.get("Content-Type")
    if not sent:
        return "Missing: a request body needs Content-Type: application/json."
    return f"Must be application/json for a JSON body, not {sent[:100]!r}."


class RequestParser(FlaskParser):
    """webargs' Flask parser, with the body read by `parse_json_body`, and a query
    parameter no operation declares refused (a 422 naming it) like an unknown body field,
    rather than dropped: `?stauts=failed` would otherwise list every job."""

    DEFAULT_UNKNOWN_BY_LOCATION = {
        **FlaskParser.DEFAULT_UNKNOWN_BY_LOCATION,
        "query": ma.RAISE,
        "querystring": ma.RAISE,
    }

    def _raw_load_json(self, req: flask.Request) -> Any:
        data = req.get_data(cache=True)
        if not data:
            return core.missing
        if not core.is_json(req.mimetype):
            abort(
                415,
                message="The request body must be JSON.",
                errors={"headers": {"Content-Type": [_content_type_problem(req)]}},
            )
        return parse_json_body(data)


class Blueprint(flask_smorest.Blueprint):
    """Every API blueprint: flask-smorest's, reading requests with RequestParser."""

    ARGUMENTS_PARSER = RequestParser()
