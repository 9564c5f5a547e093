"""Every JSON answer of the server is strict JSON: the one place where Flask (`jsonify`, Dash's
`_dash-dependencies`) turns Python into JSON refuses NaN and ±Infinity, which Python's json
writes as bare words that a browser's `JSON.parse` rejects along with the whole answer. A
non-finite number (a job's progress read from hostile output, a sum that overflowed) is sent as
null rather than failing the answer with a 500, and said once per route in the log. Dash's
callback answers go through Plotly's encoder, which writes null for them itself."""
from __future__ import annotations

import json
import logging
import threading
from typing import Any

import flask
from flask.json.provider import DefaultJSONProvider

from .format import finite

log = logging.getLogger(__name__)


class StrictProvider(DefaultJSONProvider):
    """Flask's JSON provider with `allow_nan=False`: clean data is encoded once as before; data
    holding a non-finite number is encoded again with each one as null."""

    def __init__(self, app: flask.Flask) -> None:
        super().__init__(app)
        self._told: set[str] = set()
        self._lock = threading.Lock()

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        kwargs.setdefault("default", self.default)
        kwargs.setdefault("ensure_ascii", self.ensure_ascii)
        kwargs.setdefault("sort_keys", self.sort_keys)
        kwargs["allow_nan"] = False
        try:
            return json.dumps(obj, **kwargs)
        except ValueError as e:
            if "Out of range float" not in str(e):
                raise
        self._tell_once()
        default = kwargs["default"]
        kwargs["default"] = lambda o: finite(default(o))
        return json.dumps(finite(obj), **kwargs)

    def _tell_once(self) -> None:
        """One log line per route that answered a non-finite number: what made it is a bug or
        hostile input worth finding, but not worth a line per request."""
        where = flask.request.path if flask.has_request_context() else "outside a request"
        rule = flask.request.url_rule if flask.has_request_context() else None
        key = rule.rule if rule is not None else where
        with self._lock:
            if key in self._told:
                return
            self._told.add(key)
        log.warning("a non-finite number in the JSON answer to %s was sent as null", where[:200])


def install(server: flask.Flask) -> None:
    server.json = StrictProvider(server)
