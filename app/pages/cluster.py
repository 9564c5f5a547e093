"""Cluster: the node grid as the machine is built, KPI cards, and the timelines."""
from __future__ import annotations

import dash
from dash import Input, Output, Patch, State, dcc, html, no_update

from app import context, ids
from app.capacity import held_back
from app.charts import LIVE_TIME_AXIS, MARGIN, NO_DATA, TIME_AXIS, count_axis, legend_label, ratio
from app.format import gpus, si
from app.grid import BUSY_COLOUR, IDLE_COLOUR, JOB_COLOURS, PROBE_COLOURS, RESCALE_COLOUR, grid_figure
from app.gridserve import current_update

dash.register_page(__name__, path="/", name="Cluster", title="Cluster · harvester")

TIMELINE_POINTS = 20000


def _kpi(id_: str, label: str) -> html.Div:
    return html.Div([html.Div("–", id=id_, className="kpi-value"), html.Div(label, className="kpi-label")],
                    className="kpi")


def layout(**_):
    snap = context.harvester.snapshot
    cache = context.cells
    key = None
    figure = {"data": [], "layout": {"height": 300}}
    if snap.nodes:
        lay = cache.layout(snap.nodes)
        figure = grid_figure(lay, snap.nodes, cache.cells(snap))
        key = {"boot": context.BOOT, "seq": snap.seq, "machine": cache.machine_id(snap.nodes)}
    return html.Div([
        html.Div([
            _kpi(ids.KPI_IDLE, "idle nodes now"),
            _kpi(ids.KPI_HARVESTED, "harvested now"),
            _kpi(ids.KPI_HARVEST_PCT, "of idle node-hours used"),
            _kpi(ids.KPI_RATE, "samples/s"),
            _kpi(ids.KPI_JOBS, "jobs running / queued"),
        ], id=ids.KPI, className="kpis"),
        html.P(id=ids.HELD_BACK, className="notice"),
        dcc.Graph(id=ids.GRID, figure=figure, config={"displayModeBar": False},
                  className="grid-graph"),
        dcc.Store(id=ids.GRID_KEY, data=key),
        html.Div(id=ids.LEGEND, className="legend"),
        html.Div([
            dcc.Graph(id=ids.TL_NODES, figure=_timeline_fig("nodes"), config={"displayModeBar": False},
                      className="timeline"),
            dcc.Graph(id=ids.TL_RATE, figure=_timeline_fig("rate"), config={"displayModeBar": False},
                      className="timeline"),
        ], className="timelines"),
        dcc.Store(id=ids.TL_KEY, data=None),
    ])


def _timeline_fig(which: str) -> dict:
    """An empty timeline that says so; the first points bring its axes (see update_timelines)."""
    if which == "nodes":
        traces = [{"type": "scatter", "mode": "lines", "name": "nodes used by jobs", "x": [], "y": [],
                   "line": {"color": "#3cb44b", "shape": "hv", "width": 1}, "fill": "tozeroy"},
                  {"type": "scatter", "mode": "lines", "name": "idle nodes offered", "x": [], "y": [],
                   "line": {"color": "#3b5b92", "shape": "hv", "width": 1.5}}]
        title = "Idle nodes offered vs used"
    else:
        traces = [{"type": "scatter", "mode": "lines", "name": "samples/s", "x": [], "y": [],
                   "line": {"color": "#d62728", "shape": "hv"}}]
        title = "Aggregate training throughput"
    return {"data": traces, "layout": {
        "title": {"text": title, "font": {"size": 13}}, "height": 250, "margin": MARGIN,
        "legend": {"orientation": "h", "y": -0.35}, "xaxis": {"visible": False}, "yaxis": {"visible": False},
        "annotations": [{"text": NO_DATA, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                         "showarrow": False, "font": {"size": 15, "color": "#6b7280"}}],
        "uirevision": "timeline"}}


@dash.callback(Output(ids.GRID, "figure"), Output(ids.GRID_KEY, "data"),
               Input(ids.TICK, "n_intervals"), State(ids.GRID_KEY, "data"))
def update_grid(_n, key):
    """Only what changed since the snapshot this browser shows (a full figure if it is unknown).
    The server answers this callback before Dash does (app/gridserve.py), with the same update."""
    return grid_update(key)


def grid_update(key):
    """The shared update from the snapshot `key` names to the current one, as Dash outputs."""
    update = current_update(key)
    if update is None:
        return no_update, no_update
    return update.figure, update.key


@dash.callback(Output(ids.KPI_IDLE, "children"), Output(ids.KPI_HARVESTED, "children"),
               Output(ids.KPI_HARVEST_PCT, "children"), Output(ids.KPI_RATE, "children"),
               Output(ids.KPI_JOBS, "children"), Output(ids.LEGEND, "children"),
               Input(ids.TICK, "n_intervals"))
def update_kpis(_n):
    snap = context.harvester.snapshot
    k = snap.kpis
    if not k:
        return ("–",) * 5 + ("",)
    legend = [_swatch(BUSY_COLOUR, "busy (main scheduler)"), _swatch(IDLE_COLOUR, "idle, unused"),
              _swatch(RESCALE_COLOUR, "rescaling")]
    if snap.config.get("jpa"):
        legend.append(_swatch(PROBE_COLOURS[0], "probing (a lighter shade): no sample at that size yet",
                              ids.LEGEND_PROBING))
    context.cells.cells(snap)       # assigns colour slots in the same order as the grid
    book = context.cells.book
    for j in sorted((j for j in snap.jobs if j["state"] == "running" and j["nodes"] > 0),
                    key=lambda j: -j["nodes"]):
        probing = j["id"] in snap.probing
        colour = (PROBE_COLOURS if probing else JOB_COLOURS)[book.slot(j["id"])]
        label = legend_label(j["id"], j["name"], j["nodes"], probing)
        legend.append(html.A(_swatch(colour, label), href=f'/jobs/{j["id"]}', className="legend-link"))
    return (_with_gpus(k["idle"], k.get("idle_gpus")), _with_gpus(k["harvested"], k.get("harvested_gpus")),
            ratio(k.get("used_node_s", 0.0), k.get("offered_node_s", 0.0)),
            si(k["samples_per_second"]), f'{k["running"]} / {k["queued"]}', legend)


@dash.callback(Output(ids.HELD_BACK, "children"), Input(ids.TICK, "n_intervals"))
def update_held_back(_n):
    """Idle nodes unused while jobs wait for a running slot, in words (empty, and hidden, otherwise)."""
    return held_back(context.harvester.snapshot)


def _with_gpus(nodes: int, gpu_count) -> list:
    """A node count, and the GPUs of those nodes where some node has more than one."""
    shown: list = [f"{nodes:,}"]
    if gpu_count is not None and gpu_count != nodes:
        shown.append(html.Span(f" · {gpus(gpu_count)}", className="kpi-sub"))
    return shown


def _swatch(colour: str, label: str, id_: str = "") -> html.Span:
    extra = {"id": id_} if id_ else {}
    return html.Span([html.Span(className="swatch", style={"background": colour}), label],
                     className="legend-item", **extra)


@dash.callback(Output(ids.TL_NODES, "figure"), Output(ids.TL_RATE, "figure"), Output(ids.TL_KEY, "data"),
               Input(ids.TICK, "n_intervals"), State(ids.TL_KEY, "data"))
def update_timelines(_n, key):
    """Append the timeline points the browser does not have yet (all of them on first load)."""
    hist = context.history
    t0 = hist.first_time()
    fresh = not key or key.get("boot") != context.BOOT or key.get("t0") != t0
    rows = hist.timeline(None if fresh else key.get("t"), TIMELINE_POINTS)
    if not rows and not fresh:
        return no_update, no_update, no_update
    xs = [_ms(r["time"]) for r in rows]
    nodes, rate = Patch(), Patch()
    top = max([key.get("top", 0) if key and not fresh else 0] + [max(r["used"], r["idle"]) for r in rows])
    if fresh:
        nodes["data"][0]["x"] = xs
        nodes["data"][0]["y"] = [r["used"] for r in rows]
        nodes["data"][1]["x"] = xs
        nodes["data"][1]["y"] = [r["idle"] for r in rows]
        rate["data"][0]["x"] = xs
        rate["data"][0]["y"] = [r["samples_per_second"] for r in rows]
    else:
        nodes["data"][0]["x"].extend(xs)
        nodes["data"][0]["y"].extend([r["used"] for r in rows])
        nodes["data"][1]["x"].extend(xs)
        nodes["data"][1]["y"].extend([r["idle"] for r in rows])
        rate["data"][0]["x"].extend(xs)
        rate["data"][0]["y"].extend([r["samples_per_second"] for r in rows])
    if rows:       # axes with titles and units once there is something to draw
        time_axis = TIME_AXIS if context.harvester.capabilities.can_set_speed else LIVE_TIME_AXIS
        nodes["layout"]["annotations"] = []
        nodes["layout"]["xaxis"] = time_axis
        nodes["layout"]["yaxis"] = count_axis("nodes", top)
        rate["layout"]["annotations"] = []
        rate["layout"]["xaxis"] = time_axis
        rate["layout"]["yaxis"] = {"title": {"text": "samples/s"}, "rangemode": "tozero"}
    t_last = rows[-1]["time"] if rows else (None if fresh else key.get("t"))
    return nodes, rate, {"boot": context.BOOT, "t": t_last, "t0": t0, "top": top}


def _ms(t: float) -> int:
    return int(t * 1000)
