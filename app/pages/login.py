"""Log in: a plain HTML form posted to `POST /login` (app/session.py), so that the browser's
login gets real HTTP statuses (401, 429 with Retry-After) and works with password managers."""
from __future__ import annotations

import dash
import flask
from dash import dcc, html

from app import ids

dash.register_page(__name__, path="/login", name="Log in", title="Log in · harvester")


def layout(**_):
    notes = [html.Div(text, className="ok" if kind == "ok" else "error")
             for kind, text in flask.get_flashed_messages(with_categories=True)]
    return html.Div([
        html.H2("Log in"),
        html.P("Anyone may watch; registering and cancelling jobs needs an account.", className="muted"),
        html.Form([
            html.Div([html.Label("User", htmlFor=ids.LOGIN_USER),
                      dcc.Input(id=ids.LOGIN_USER, name="username", type="text", autoComplete="username",
                                className="form-input", required=True)],
                     className="form-row"),
            html.Div([html.Label("Password", htmlFor=ids.LOGIN_PASSWORD),
                      dcc.Input(id=ids.LOGIN_PASSWORD, name="password", type="password",
                                autoComplete="current-password", className="form-input", required=True)],
                     className="form-row"),
            html.Button("Log in", id=ids.LOGIN_SUBMIT, type="submit", className="button"),
        ], method="post", action="/login"),
        html.Div(notes, id=ids.LOGIN_RESULT, className="form-result"),
    ], className="form narrow")
