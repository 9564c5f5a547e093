"""The browser's login: `POST /login` (the form on /login) and `POST /logout`.

The signed session cookie holds only a server-side session's id (app.sessions), which logout
ends for good; a failed or throttled login answers with the dashboard page itself (status 401 or
429 with `Retry-After`), its message flashed into /login.
"""
from __future__ import annotations

import dash
import flask

from . import context
from .signin import Refused


def sentence(text: str) -> str:
    """The API's lower-case message as the page's sentence."""
    return text[:1].upper() + text[1:] + "."


def register(app: dash.Dash) -> None:
    server = app.server

    def page(status: int, message: str, **headers: str) -> flask.Response:
        flask.flash(message, "error")
        resp = flask.make_response(app.index(), status)
        resp.headers.update(headers)
        return resp

    @server.post("/login")
    def login_form():
        form = flask.request.form
        try:
            user = context.gate.login(context.users, form.get("username", "").strip(), form.get("password", ""),
                                      flask.request.remote_addr or "")
        except Refused as e:
            return page(e.status, sentence(str(e)), **{"Retry-After": str(e.retry_after)})
        if user is None:
            return page(401, "Wrong user name or password.")
        context.start_session(user)
        return flask.redirect("/jobs", 303)

    @server.post("/logout")
    def logout():
        context.end_session()
        flask.flash("Logged out.", "ok")
        return flask.redirect("/login", 303)
