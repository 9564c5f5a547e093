"""Log in (and out): the session cookie Flask signs with the server's secret."""
from __future__ import annotations


import dash
import flask
from dash import Input, Output, State, dcc, html, no_update

from app import context, ids

dash.register_page(__name__, path="/login", name="Log in", title="Log in · harvester")


def layout(logout=None, **_):
    if logout:
        flask.session.pop("user", None)
    return html.Div([
        html.H2("Log in"),
        html.P("Anyone may watch; registering and cancelling jobs needs an account.", className="muted"),
        html.Div([html.Label("User", htmlFor=ids.LOGIN_USER),
                  dcc.Input(id=ids.LOGIN_USER, type="text", autoComplete="username", className="form-input")],
                 className="form-row"),
        html.Div([html.Label("Password", htmlFor=ids.LOGIN_PASSWORD),
                  dcc.Input(id=ids.LOGIN_PASSWORD, type="password", autoComplete="current-password",
                            className="form-input", n_submit=0)], className="form-row"),
        html.Button("Log in", id=ids.LOGIN_SUBMIT, n_clicks=0, className="button"),
        html.Div("Logged out." if logout else "", id=ids.LOGIN_RESULT, className="form-result"),
    ], className="form narrow")


@dash.callback(Output(ids.LOGIN_RESULT, "children"), Output(ids.URL, "href"),
               Input(ids.LOGIN_SUBMIT, "n_clicks"), Input(ids.LOGIN_PASSWORD, "n_submit"),
               State(ids.LOGIN_USER, "value"), State(ids.LOGIN_PASSWORD, "value"),
               prevent_initial_call=True)
def login(n_clicks, n_submit, name, password):
    if not (n_clicks or n_submit):
        return no_update, no_update
    user = context.users.check((name or "").strip(), password or "")
    if user is None:
        return html.Span("Wrong user name or password.", className="error"), no_update
    flask.session["user"] = user.name
    flask.session.permanent = True
    return html.Span(f"Logged in as {user.name}.", className="ok"), "/jobs"


