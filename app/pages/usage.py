"""Usage (staff): node-hours, GPU-hours and samples per owner or account, the share of the idle
node-hours each used, and a stacked chart of the nodes each held over time. Figures come from
the store's history (core/usage.py through the harvester), the same as `GET /api/usage`."""
from __future__ import annotations

import time
from typing import Optional

import dash
from dash import Input, Output, dash_table, dcc, html, no_update

from app import context, ids
from app.charts import DASH, LIVE_TIME_AXIS, MARGIN, TIME_AXIS, count_axis, empty_figure, ratio
from app.format import plotly_text, si, sim_time

dash.register_page(__name__, path="/usage", name="Usage", title="Usage · harvester")

#: the windows offered, in seconds before the last save (None: the whole run)
WINDOWS = {"all": None, "hour": 3600.0, "day": 86400.0, "week": 7 * 86400.0}
WINDOW_LABELS = {"all": "whole run", "hour": "last hour", "day": "last day", "week": "last week"}
GROUPS = {"owner": "owner", "account": "account / project"}
#: refresh every this many ticks of the shell's 1 s interval (a report reads the whole history)
EVERY_TICKS = 5
COLOURS = ("#5e81ac", "#d08770", "#a3be8c", "#b48ead", "#ebcb8b", "#88c0d0", "#bf616a", "#8fbcbb")
_CELL = {"fontSize": 13, "padding": "3px 8px", "fontFamily": "inherit"}
COLUMNS = (("who", "owner"), ("account", "account"), ("jobs", "jobs"), ("node_hours", "node-hours"),
           ("gpu_hours", "GPU-hours"), ("samples", "samples"), ("share", "share of idle node-hours"))


def _staff() -> bool:
    user = context.current_user()
    return user is not None and user.is_staff


def layout(**_):
    if not _staff():
        return html.Div([html.H2("Usage"),
                         html.P("Only staff see usage: log in as a staff member.", className="error")])
    return html.Div([
        html.H2("Usage"),
        html.Div([
            html.Label(["Per ", dcc.Dropdown(id=ids.USAGE_BY, options=[{"label": v, "value": k}
                                                                       for k, v in GROUPS.items()],
                                             value="owner", clearable=False, style={"width": 200})]),
            html.Label(["Window ", dcc.Dropdown(id=ids.USAGE_WINDOW, options=[{"label": v, "value": k}
                                                                             for k, v in WINDOW_LABELS.items()],
                                                value="all", clearable=False, style={"width": 160})]),
            html.A("Download CSV", id=ids.USAGE_CSV, href="/api/usage.csv?by=owner", className="button"),
        ], className="row usage-controls", style={"gap": "16px", "alignItems": "center"}),
        html.P(id=ids.USAGE_SUMMARY, className="muted"),
        dash_table.DataTable(id=ids.USAGE_TABLE, columns=[{"id": c, "name": n} for c, n in COLUMNS], data=[],
                             style_cell=_CELL, sort_action="native"),
        dcc.Graph(id=ids.USAGE_CHART, config={"displayModeBar": False}),
        html.P("A node counts for a job from the allocation that gave it to the one that took it away (a shrink, "
               "a reclaim by the main scheduler, the job's end), up to the store's last save; GPU-hours are "
               "node-hours times each node's GPUs; the idle node-hours are the timeline's.", className="hint"),
    ])


def window(key: Optional[str], until: float) -> tuple[Optional[float], Optional[float]]:
    """(from, to) of a window named on the page; the whole run is (None, None)."""
    span = WINDOWS.get(key or "all")
    return (None, None) if span is None else (until - span, None)


@dash.callback(Output(ids.USAGE_SUMMARY, "children"), Output(ids.USAGE_TABLE, "data"),
               Output(ids.USAGE_CHART, "figure"), Output(ids.USAGE_CSV, "href"),
               Input(ids.TICK, "n_intervals"), Input(ids.USAGE_BY, "value"), Input(ids.USAGE_WINDOW, "value"))
def update(n, by, key):
    trigger = dash.callback_context.triggered_id
    if trigger == ids.TICK and n and n % EVERY_TICKS:
        return (no_update,) * 4
    if not _staff():
        return "Only staff see usage.", [], empty_figure("Nodes held"), ""
    by = by if by in GROUPS else "owner"
    h = context.harvester
    accounts = context.users.accounts()
    start = None
    if WINDOWS.get(key or "all") is not None:
        start, _ = window(key, h.usage(None, None, by, accounts).end)
    rep = h.usage(start, None, by, accounts, series=True)
    body = rep.to_dict()
    total = body["total"]
    summary = (f"{sim_time(rep.start)} to {sim_time(rep.end)}: {total['node_hours']:,.1f} node-hours, "
               f"{total['gpu_seconds'] / 3600.0:,.1f} GPU-hours and {si(total['samples'])} samples by "
               f"{total['jobs']:,} jobs; {ratio(total['node_seconds'], total['idle_node_seconds'])} of the "
               f"{total['idle_node_seconds'] / 3600.0:,.1f} idle node-hours used.")
    rows = [{"who": _who(r[by], by), "account": (r.get("account") or DASH) if by == "owner" else DASH,
             "jobs": r["jobs"], "node_hours": round(r["node_hours"], 2), "gpu_hours": round(r["gpu_seconds"] / 3600, 2),
             "samples": si(r["samples"]), "share": ratio(r["node_seconds"], total["idle_node_seconds"])}
            for r in body["rows"]]
    query = f"by={by}" + (f"&from={start!r}" if start is not None else "")
    return summary, rows, stacked(rep.series, by, h.capabilities.can_set_speed), f"/api/usage.csv?{query}"


def _who(key: str, by: str) -> str:
    if key:
        return key
    return "the job set" if by == "owner" else "(no account)"


def stacked(series: dict, by: str, simulated: bool) -> dict:
    """Mean nodes held per owner (or account) in each step, stacked: the harvest, split by who."""
    nodes = series.get("nodes") or {}
    if not nodes:
        return empty_figure("Nodes held, by " + by, "no node has been held in this window")
    xs = [time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) for t in series["times"]]
    order = sorted(nodes, key=lambda k: -sum(nodes[k]))
    traces = [{"type": "scatter", "mode": "lines", "stackgroup": "held", "name": plotly_text(_who(k, by)),
               "x": xs, "y": nodes[k], "line": {"width": 0.5, "color": COLOURS[i % len(COLOURS)]},
               "hovertemplate": "%{y:.2f} nodes<extra>" + plotly_text(_who(k, by)) + "</extra>"}
              for i, k in enumerate(order)]
    top = max(sum(v[i] for v in nodes.values()) for i in range(len(xs)))
    step = series.get("step", 60.0)
    return {"data": traces, "layout": {
        "title": {"text": f"Nodes held, by {by} (mean per {step / 60:g} min)", "font": {"size": 13}},
        "height": 320, "margin": MARGIN, "legend": {"orientation": "h", "y": -0.25},
        "xaxis": TIME_AXIS if simulated else LIVE_TIME_AXIS, "yaxis": count_axis("nodes", top)}}
