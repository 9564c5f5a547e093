"""The Dash app: a shell (navigation, login state, the one live-update Interval) around one
page per file in app/pages, plus the JSON API and /metrics on the same Flask server."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import dash
import flask
from dash import Input, Output, dcc, html

from core.service import Harvester

from . import context, ids
from .auth import Tokens, Users, secret_key
from .queries import History
from .sessions import Lifetimes, SessionStore
from .webconfig import WebConfig

HERE = Path(__file__).resolve().parent
UPDATE_MS = 1000


def create_app(harvester: Harvester, users: Users, web: WebConfig = WebConfig()) -> dash.Dash:
    context.harvester = harvester
    context.users = users
    harvester.quota_source = users.quotas     # node caps and period quotas from the users file
    key = secret_key(harvester.db)
    context.tokens = Tokens(key)
    context.sessions = SessionStore(Path(f"{harvester.db}.sessions"),
                                    Lifetimes(web.session_idle_s, web.session_max_s))
    users.watch(context.end_stale_sessions)    # a password changed: that user's sessions end
    context.end_stale_sessions()               # and those changed while the server was down
    context.history = History(harvester.db)
    app = dash.Dash(__name__, use_pages=True, pages_folder=str(HERE / "pages"),
                    assets_folder=str(HERE.parent / "assets"), title="Idle-node harvester",
                    suppress_callback_exceptions=True, update_title=None, compress=True)
    server = app.server
    server.secret_key = key
    server.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax",
                         PERMANENT_SESSION_LIFETIME=web.session_max_s, SESSION_REFRESH_EACH_REQUEST=False,
                         SESSION_COOKIE_SECURE=web.secure_cookies,
                         MAX_CONTENT_LENGTH=web.max_body_bytes)
    app.layout = shell
    from . import (api, callback_inputs, dasherrors, gridserve, jsondepth, metrics, nostore, security, session,
                   strictjson)
    strictjson.install(server)          # every jsonify: no NaN or Infinity, sent as null
    jsondepth.register(server)          # first: nothing below parses a body nested too deep
    dasherrors.register(server)
    security.protect(app)
    callback_inputs.register(app)
    gridserve.register(server)          # after the checks above: answers the grid callback itself
    api.register(server)
    metrics.register(server, web.metrics_interval_s, web.metrics_token)
    session.register(app)
    nostore.register(server)            # pages and API answers never kept in a cache
    return app


def shell() -> html.Div:
    links = [("Cluster", "/"), ("Jobs", "/jobs"), ("Allocator", "/allocator")]
    if context.harvester.capabilities.can_restart:      # live mode has no replay to control
        links.append(("Replay", "/replay"))
    user = context.current_user() if flask.has_request_context() else None
    if user is not None and user.is_staff:              # usage per person is for staff
        links.append(("Usage", "/usage"))
    return html.Div([
        dcc.Location(id=ids.URL),
        dcc.Interval(id=ids.TICK, interval=UPDATE_MS),
        html.Header([
            html.Span("Idle-node harvester", className="brand"),
            html.Nav([dcc.Link(name, href=href, className="nav-link") for name, href in links]),
            html.Span(id=ids.STATUS_BAR, className="status-bar"),
            html.Span(id=ids.NAV_USER, className="nav-user"),
        ], className="topbar"),
        html.Main(dash.page_container, className="page"),
    ])


@dash.callback(Output(ids.NAV_USER, "children"), Input(ids.URL, "pathname"))
def nav_user(_path):
    user = context.current_user()
    if user is None:
        return dcc.Link("Log in", href="/login", className="nav-link")
    return [html.Span(f"{user.name} ({user.role})"), " ",
            html.Form(html.Button("Log out", id=ids.LOGOUT, type="submit", className="nav-link link-button"),
                      method="post", action="/logout", className="inline-form")]


@dash.callback(Output(ids.STATUS_BAR, "children"), Input(ids.TICK, "n_intervals"))
def status_bar(_n):
    from .format import sim_time
    h = context.harvester
    snap = h.snapshot
    if snap.status in ("loading", "error") or h.problem:
        return f"replay {snap.status}" + (f": {h.problem}" if h.problem else "")
    store = store_badge(h.store_problem)
    if store is not None:
        return [f"{sim_time(snap.time)} · {snap.status} ", store]
    if h.capabilities.can_set_speed:
        return f"{sim_time(snap.time)} · replay {snap.status} · {h.speed:g}x"
    text = f"{sim_time(snap.time)} · live ({snap.config.get('dispatcher', '')}) · {snap.status} "
    return [text, source_badge(snap.source_status)] if snap.source_status else text


def store_badge(st: Optional[dict]) -> Optional[html.Span]:
    """Store writes failing (kept in memory and retried): a red badge, the reason on hover."""
    if not st:
        return None
    return html.Span(f"store failing · {st.get('unsaved_rows', 0):,} rows unsaved", id=ids.STORE_BADGE,
                     title=str(st.get("detail", "")), className="source-badge source-stale store-failing")


def source_badge(st: dict) -> html.Span:
    """The node source's state at a glance; `stale` (its batch scheduler cannot be asked, the
    harvester keeps what it holds) stands out, with the reason on hover."""
    from .format import sim_time
    state = st.get("state", "ok")
    label = f'{st.get("name", "source")}: {state}'
    if state == "stale" and st.get("since"):
        label += f' since {sim_time(st["since"])[11:19]}'
    if st.get("held") is not None:
        label += f' · {st["held"]} held, {st.get("used") or 0} used'
    return html.Span(label, id=ids.SOURCE_BADGE, title=st.get("detail", ""),
                     className=f"source-badge source-{state}")
