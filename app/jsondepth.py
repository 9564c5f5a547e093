"""Refuse request bodies nested deeper than any real one (a 400), before anything parses them:
Python's json parser and every function that walks its result would otherwise end in a
RecursionError (a 500, or a 503 where it passes for a RuntimeError) on a body ~1,000 deep."""
from __future__ import annotations

import re
from itertools import accumulate

import flask

#: deepest nesting accepted in any request body (the dashboard's own callbacks stay under 20)
MAX_DEPTH = 64
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


def depth(body: bytes) -> int:
    """How deep the brackets of a JSON text nest (outside strings); other text counts 0."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    return max(accumulate(1 if c in b"[{" else -1 for c in brackets))


def refuse_deep_json():
    """Flask `before_request`: a 400 for a body nested deeper than MAX_DEPTH, on every route."""
    if not flask.request.content_length and flask.request.method in ("GET", "HEAD", "OPTIONS"):
        return None
    body = flask.request.get_data(cache=True)
    if body and depth(body) > MAX_DEPTH:
        resp = flask.jsonify({"error": f"the JSON is nested deeper than {MAX_DEPTH} levels"})
        resp.status_code = 400
        return resp
    return None


def register(server: flask.Flask) -> None:
    server.before_request(refuse_deep_json)
