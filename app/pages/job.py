"""One job: its scaling curve, nodes and progress over time, its events, and why it has the
nodes it has."""
from __future__ import annotations

import dash
from dash import Input, Output, State, dash_table, dcc, html, no_update

from core.explain import why

from app import context, ids
from app.format import duration, si, sim_time

dash.register_page(__name__, path_template="/jobs/<job_id>", name="Job", title="Job · harvester")


def layout(job_id=None, **_):
    return html.Div([
        dcc.Store(id=ids.JOB_ID, data=job_id),
        html.Div(id=ids.JOB_HEAD),
        html.P(id=ids.JOB_WHY, className="why"),
        html.Div([html.Button("Cancel job", id=ids.JOB_CANCEL, n_clicks=0, className="button danger",
                              style={"display": "none"}),
                  html.Span(id=ids.JOB_CANCEL_RESULT)]),
        html.Div([
            dcc.Graph(id=ids.JOB_CURVE, config={"displayModeBar": False}, className="job-graph"),
            dcc.Graph(id=ids.JOB_NODES, config={"displayModeBar": False}, className="job-graph"),
            dcc.Graph(id=ids.JOB_PROGRESS, config={"displayModeBar": False}, className="job-graph"),
        ], className="job-graphs"),
        html.H3("Events"),
        dash_table.DataTable(id=ids.JOB_EVENTS, columns=[{"id": c, "name": c} for c in ("time", "kind", "node", "detail")],
                             data=[], page_size=15, style_cell={"fontSize": 13, "padding": "3px 8px"}),
    ])


def _queue_position(snap, job_id):
    queued = sorted((j for j in snap.jobs if j["state"] == "queued"), key=lambda j: j["submit_time"])
    for k, j in enumerate(queued, 1):
        if j["id"] == job_id:
            return k
    return None


@dash.callback(Output(ids.JOB_HEAD, "children"), Output(ids.JOB_WHY, "children"),
               Output(ids.JOB_CURVE, "figure"), Output(ids.JOB_NODES, "figure"),
               Output(ids.JOB_PROGRESS, "figure"), Output(ids.JOB_EVENTS, "data"),
               Output(ids.JOB_CANCEL, "style"),
               Input(ids.TICK, "n_intervals"), Input(ids.JOB_ID, "data"))
def update_job(n, job_id):
    if n and n % 2:       # every other second is plenty for one job
        return (no_update,) * 7
    h, hist = context.harvester, context.history
    snap = h.snapshot
    job = h.job(job_id) if job_id else None
    info = snap.job(job_id) if job_id else None
    if job is None or info is None:
        return html.H2(f"No job {job_id}"), "", _empty(), _empty(), _empty(), [], {"display": "none"}
    cfg = snap.config
    line = why(job, info["nodes"], snap.kpis["idle"], snap.kpis["harvested"], snap.kpis["running"],
               cfg["max_jobs"], cfg["tfwd"], cfg["policy"], _queue_position(snap, job_id))
    head = html.Div([
        html.H2(f"{job.name or job.id}  ·  {job.id}"),
        html.Div([
            _fact("state", info["state"]), _fact("owner", job.owner or "job set"),
            _fact("nodes now", f'{info["nodes"]} (min {job.min_nodes}, max {job.max_nodes})'),
            _fact("samples/s", si(info["samples_per_second"])),
            _fact("progress", f'{100 * info["progress"]:.1f} % of {si(job.total_samples)}'),
            _fact("ETA", sim_time(info["eta"]) if info["eta"] else "–"),
            _fact("submitted", sim_time(job.submit_time)),
            _fact("grow / shrink pause", f"{duration(job.scale_up_seconds)} / {duration(job.scale_down_seconds)}"),
        ], className="facts"),
    ])
    user = context.current_user()
    can_cancel = user is not None and user.may_cancel(job.owner) and not job.state.finished
    thr = hist.job_throughput(job_id)
    allocs = hist.job_allocations(job_id)
    events = job_log(hist.job_events(job_id), allocs)
    return (head, line, curve_figure(job, info, hist.job_curve_points(job_id)),
            nodes_figure(allocs, snap.time, info), progress_figure(thr, snap.time, info, job.total_samples),
            events, {} if can_cancel else {"display": "none"})


def job_log(events, allocs, limit=200) -> list[dict]:
    """The job's own events and every change of its allocation, newest first."""
    rows = [(e["time"], e["kind"], e["node"] or "", e["detail"] or "") for e in reversed(events)]
    rows += [(a["time"], a["reason"], "", f'{a["from_nodes"]} → {a["to_nodes"]} nodes') for a in allocs]
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], i), reverse=True)
    return [{"time": sim_time(rows[i][0]), "kind": rows[i][1], "node": rows[i][2], "detail": rows[i][3]}
            for i in order[:limit]]


def _fact(k, v):
    return html.Div([html.Div(k, className="fact-key"), html.Div(v, className="fact-value")], className="fact")


def _empty():
    return {"data": [], "layout": {"height": 280}}


def curve_figure(job, info, measured) -> dict:
    """The curve the allocator uses, the measured points, and where the job is now."""
    top = max(job.max_nodes, max(job.curve.nodes))
    xs = list(range(0, top + 1, max(1, top // 200)))
    if xs[-1] != top:
        xs.append(top)
    data = [{"type": "scatter", "mode": "lines", "name": "curve in use", "x": xs,
             "y": [job.curve(x) if x >= job.min_nodes else 0 for x in xs], "line": {"color": "#5e81ac"}},
            {"type": "scatter", "mode": "markers", "name": "given points", "x": list(job.curve.nodes),
             "y": list(job.curve.samples_per_second), "marker": {"color": "#5e81ac", "size": 7}}]
    if measured:
        data.append({"type": "scatter", "mode": "markers", "name": "measured",
                     "x": [m["nodes"] for m in measured], "y": [m["samples_per_second"] for m in measured],
                     "marker": {"color": "#d08770", "size": 9, "symbol": "diamond"}})
    n = info["nodes"]
    if n:
        data.append({"type": "scatter", "mode": "markers", "name": f"now: {n} nodes", "x": [n],
                     "y": [job.curve(n)], "marker": {"color": "#bf616a", "size": 14, "symbol": "star"}})
    return {"data": data, "layout": {
        "title": {"text": "Scaling curve", "font": {"size": 13}}, "height": 280,
        "margin": {"l": 55, "r": 10, "t": 30, "b": 40},
        "xaxis": {"title": {"text": "nodes"}}, "yaxis": {"title": {"text": "samples/s"}},
        "legend": {"orientation": "h", "y": -0.3}, "shapes": [
            {"type": "rect", "xref": "x", "yref": "paper", "x0": 0, "x1": job.min_nodes, "y0": 0, "y1": 1,
             "fillcolor": "#eceff4", "line": {"width": 0}, "layer": "below"}]}}


def nodes_figure(allocs, now, info) -> dict:
    xs, ys = [], []
    for a in allocs:
        xs.append(a["time"] * 1000)
        ys.append(a["to_nodes"])
    if xs:
        xs.append(now * 1000)
        ys.append(info["nodes"])
    return {"data": [{"type": "scatter", "mode": "lines", "x": xs, "y": ys, "line": {"shape": "hv", "color": "#2ca02c"},
                      "fill": "tozeroy", "name": "nodes"}],
            "layout": {"title": {"text": "Nodes over time", "font": {"size": 13}}, "height": 280,
                       "margin": {"l": 45, "r": 10, "t": 30, "b": 40}, "xaxis": {"type": "date"}}}


def progress_figure(thr, now, info, total) -> dict:
    xs = [t["time"] * 1000 for t in thr if t["samples_done"] is not None]
    ys = [100 * t["samples_done"] / total for t in thr if t["samples_done"] is not None]
    if xs:
        xs.append(now * 1000)
        ys.append(100 * info["progress"])
    return {"data": [{"type": "scatter", "mode": "lines", "x": xs, "y": ys, "line": {"color": "#d62728"},
                      "name": "progress"}],
            "layout": {"title": {"text": "Progress (%)", "font": {"size": 13}}, "height": 280,
                       "margin": {"l": 45, "r": 10, "t": 30, "b": 40}, "xaxis": {"type": "date"},
                       "yaxis": {"range": [0, 100]}}}


@dash.callback(Output(ids.JOB_CANCEL_RESULT, "children"), Input(ids.JOB_CANCEL, "n_clicks"),
               State(ids.JOB_ID, "data"), prevent_initial_call=True)
def cancel(n_clicks, job_id):
    if not n_clicks:
        return no_update
    user = context.current_user()
    job = context.harvester.job(job_id)
    if user is None:
        return html.Span("Log in to cancel.", className="error")
    if job is None:
        return html.Span(f"No job {job_id}.", className="error")
    if not user.may_cancel(job.owner):
        return html.Span("Only its owner or staff may cancel this job.", className="error")
    try:
        context.harvester.cancel(job_id)
    except (ValueError, RuntimeError, KeyError) as e:
        return html.Span(str(e), className="error")
    return html.Span(f"Cancelled {job_id}.", className="ok")


