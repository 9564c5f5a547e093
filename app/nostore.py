"""No cache keeps what the harvester answers: pages, Dash's callbacks, the API, /login and
/metrics all carry `Cache-Control: no-store`, so that what a logged-in user saw (their jobs, a
token) is not left in a browser's or a proxy's cache after logout. Static files (styles, Dash's
fingerprinted scripts) keep their own caching: they hold nothing of anyone's."""
from __future__ import annotations

import flask

STATIC_PREFIXES = ("/assets/", "/_dash-component-suites/", "/_favicon.ico")


def cacheable(path: str) -> bool:
    return path.startswith(STATIC_PREFIXES)


def register(server: flask.Flask) -> None:
    @server.after_request
    def no_store(resp: flask.Response) -> flask.Response:
        if not cacheable(flask.request.path):
            resp.headers["Cache-Control"] = "no-store"
        return resp
