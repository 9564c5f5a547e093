"""No 500 and no traceback from a malformed request to Dash's own routes: a callback request
that fails inside Dash's dispatch, before any code of this project runs (a malformed envelope,
an output no callback has), is a 400, a component file that is not there a 404, each with one
line in the log. An error raised in this project's own code keeps its 500 and its traceback:
that is a bug."""
from __future__ import annotations

import logging
import os

import flask
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)
SUITES = "/_dash-component-suites/"
CALLBACK = "/_dash-update-component"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def register(server: flask.Flask) -> None:
    @server.errorhandler(Exception)
    def refused(e: Exception):
        if isinstance(e, HTTPException):
            return e
        path = flask.request.path
        if path.startswith(SUITES):
            log.warning("refused %s: no such component file (%s)", path[:200], type(e).__name__)
            return flask.jsonify({"error": "no such component file"}), 404
        if path == CALLBACK and not _raised_in_ours(e):
            log.warning("refused a callback request Dash cannot read (%s: %s)", type(e).__name__, str(e)[:120])
            return flask.jsonify({"error": "a callback request this page never sends"}), 400
        server.log_exception((type(e), e, e.__traceback__))
        return flask.jsonify({"error": "internal error"}), 500


def _raised_in_ours(e: BaseException) -> bool:
    """Whether a frame of the error's traceback is this project's code (not an installed package)."""
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name.startswith(ROOT) and "site-packages" not in name:
            return True
        tb = tb.tb_next
    return False
