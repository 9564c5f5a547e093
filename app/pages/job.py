"""One job: its scaling curve (what the profiler learned, when it is on), nodes and progress over
time, its probes and events, and why it has the nodes it has."""
from __future__ import annotations

import json

import dash
from dash import Input, Output, State, dash_table, dcc, html, no_update

from core.explain import horizon_of, why
from core.model import LAUNCHER_RUNTIME, LAUNCHER_TORCHRUN
from core.service import Conflict

from app import context, ids
from app.charts import LIVE_TIME_AXIS, MARGIN, TIME_AXIS, count_axis, empty_figure
from app.curve import curve_figure, probe_rows, probes_title, profile_line
from app.format import duration, extent, finite, rescale_words, si, sim_time

dash.register_page(__name__, path_template="/jobs/<job_id>", name="Job", title="Job · harvester")


def layout(job_id=None, **_):
    return html.Div([
        dcc.Store(id=ids.JOB_ID, data=job_id),
        html.Div(id=ids.JOB_HEAD),
        html.P(id=ids.JOB_WHY, className="why"),
        html.Div([dcc.ConfirmDialogProvider(
                      html.Button("Cancel job", id=ids.JOB_CANCEL, n_clicks=0, className="button danger",
                                  style={"display": "none"}),
                      id=ids.JOB_CANCEL_CONFIRM,
                      message=f"Cancel job {job_id}? Its workers stop; Resubmit continues it later from "
                              "its last checkpoint as a new job."),
                  html.Span(id=ids.JOB_CANCEL_RESULT),
                  html.Button("Resubmit", id=ids.JOB_RESUBMIT, n_clicks=0, className="button",
                              title="a new job that continues this one from its last checkpoint",
                              style={"display": "none"}),
                  html.Span(id=ids.JOB_RESUBMIT_RESULT)], className="buttons"),
        html.Div([
            dcc.Graph(id=ids.JOB_CURVE, config={"displayModeBar": False}, className="job-graph"),
            dcc.Graph(id=ids.JOB_NODES, config={"displayModeBar": False}, className="job-graph"),
            dcc.Graph(id=ids.JOB_PROGRESS, config={"displayModeBar": False}, className="job-graph"),
            dcc.Graph(id=ids.JOB_LOSS, config={"displayModeBar": False}, className="job-graph",
                      style={"display": "none"}),
        ], className="job-graphs"),
        html.P(id=ids.JOB_PROFILE, className="profile-line", style={"display": "none"}),
        html.Div([
            html.H3("Probes", id=ids.JOB_PROBES_TITLE),
            dash_table.DataTable(id=ids.JOB_PROBES, columns=[{"id": c, "name": c} for c in ("time", "nodes", "kind", "why")],
                                 data=[], page_size=8, style_cell={"fontSize": 13, "padding": "3px 8px",
                                                                   "whiteSpace": "normal", "height": "auto"}),
        ], id=ids.JOB_PROBES_BOX, style={"display": "none"}),
        html.H3("Events"),
        dash_table.DataTable(id=ids.JOB_EVENTS, columns=[{"id": c, "name": c} for c in ("time", "kind", "node", "detail")],
                             data=[], page_size=15, style_table={"overflowX": "auto"},
                             style_cell={"fontSize": 13, "padding": "3px 8px", "whiteSpace": "normal",
                                         "height": "auto", "textAlign": "left", "maxWidth": 640},
                             style_cell_conditional=[{"if": {"column_id": "time"}, "width": 220, "whiteSpace": "nowrap"},
                                                     {"if": {"column_id": "kind"}, "width": 120}]),
    ])


def _pause(seconds: float) -> str:
    """Learned pauses on real workers are fractions of a second."""
    return f"{seconds:.2f} s" if seconds < 1 else duration(seconds)


def _queue_position(snap, job_id):
    queued = sorted((j for j in snap.jobs if j["state"] == "queued"), key=lambda j: j["submit_time"])
    for k, j in enumerate(queued, 1):
        if j["id"] == job_id:
            return k
    return None


@dash.callback(Output(ids.JOB_HEAD, "children"), Output(ids.JOB_WHY, "children"),
               Output(ids.JOB_CURVE, "figure"), Output(ids.JOB_NODES, "figure"),
               Output(ids.JOB_PROGRESS, "figure"), Output(ids.JOB_EVENTS, "data"),
               Output(ids.JOB_CANCEL, "style"), Output(ids.JOB_PROFILE, "children"),
               Output(ids.JOB_PROFILE, "style"), Output(ids.JOB_PROBES, "data"), Output(ids.JOB_PROBES_BOX, "style"),
               Output(ids.JOB_PROBES_TITLE, "children"), Output(ids.JOB_LOSS, "figure"), Output(ids.JOB_LOSS, "style"),
               Output(ids.JOB_RESUBMIT, "style"),
               Input(ids.TICK, "n_intervals"), Input(ids.JOB_ID, "data"))
def update_job(n, job_id):
    if n and n % 2:       # every other second is plenty for one job
        return (no_update,) * 15
    hidden = {"display": "none"}
    h, hist = context.harvester, context.history
    snap = h.snapshot
    job = h.job(job_id) if job_id else None
    info = snap.line(job) if job is not None else None     # an ended job past the snapshot's: as stored
    if job is None or info is None:
        return (html.H2(f"No job {job_id}"), "", _empty(), _empty(), _empty(), [], hidden, "", hidden, [], hidden, "",
                _empty(), hidden, hidden)
    if job.state.finished and job.state.value != info["state"]:
        return (no_update,) * 15     # it ended after this snapshot was taken: the next one agrees
    cfg = snap.config
    profile = finite(h.profile(job_id))
    span, learned = horizon_of(cfg, job_id)
    line = why(job, info["nodes"], snap.kpis["idle"], snap.kpis["harvested"], snap.kpis["running"],
               cfg["max_jobs"], span, cfg["policy"], _queue_position(snap, job_id), profile, learned,
               info.get("quota"), info.get("node_cap"))
    workers = (h.worker_status(job_id) or job.story or {}) if cfg.get("runs_workers") else {}
    end = job.end_time if job.state.finished and job.end_time else snap.time   # its charts stop at its end
    head = html.Div([
        html.H2(f"{job.name or job.id}  ·  {job.id}"),
        html.Div([
            _fact("state", state_words(info)), _fact("owner", job.owner or "job set"),
            _fact("holds now", extent(info["nodes"], info.get("slots"), info.get("ranks", info["nodes"]),
                                      bool(cfg.get("runs_workers"))), ids.JOB_HOLDS),
            _fact("size", f"{job.min_nodes} to {job.max_nodes} nodes"),
            _fact("samples/s", si(info["samples_per_second"])),
            _fact("progress", f'{100 * info["progress"]:.1f} % of {si(job.total_samples)}'),
            _fact("ETA", sim_time(info["eta"]) if info["eta"] else "–"),
            _fact("submitted", sim_time(job.submit_time)),
            *([_fact("launcher", LAUNCHER_TEXT.get(job.launcher, job.launcher))] if job.command else []),
            _fact(("restart cost up / down" if job.launcher == LAUNCHER_TORCHRUN else "grow / shrink pause")
                  + (" (learned)" if profile else ""),
                  f"{_pause(profile['scale_up_seconds'] if profile else job.scale_up_seconds)} / "
                  f"{_pause(profile['scale_down_seconds'] if profile else job.scale_down_seconds)}"),
            *learning_facts(workers),
            *output_facts(job, workers),
        ], className="facts"),
    ])
    user = context.current_user()
    can_cancel = user is not None and user.may_cancel(job.owner) and not job.state.finished
    can_resubmit = user is not None and user.may_cancel(job.owner) and job.state.value in RESUBMITTABLE
    thr = hist.job_throughput(job_id)
    allocs = hist.job_allocations(job_id)
    events = job_log(hist.job_events(job_id), allocs)
    measured = hist.job_curve_points(job_id) if profile is None else []
    shown = {} if profile is not None else hidden
    axis = TIME_AXIS if h.capabilities.can_set_speed else LIVE_TIME_AXIS
    return (head, why_children(line, job), curve_figure(job, info, measured, profile),
            nodes_figure(allocs, end, info, axis),
            progress_figure(thr, end, info, job.total_samples, axis),
            events, {} if can_cancel else hidden, profile_line(profile) if profile else "", shown,
            probe_rows(profile), shown, probes_title(profile),
            loss_figure(workers.get("losses") or [], info), {} if cfg.get("runs_workers") else hidden,
            {} if can_resubmit else hidden)


def learning_facts(workers: dict) -> list:
    """The last loss and metrics rank 0 reported (`done_step(loss=..., **metrics)`)."""
    out = []
    if workers.get("loss") is not None:
        out.append(_fact("loss", f'{workers["loss"]:.4g}', ids.JOB_LOSS + "-now"))
    for name, value in sorted((workers.get("metrics") or {}).items())[:6]:
        out.append(_fact(str(name), f"{value:.4g}"))
    return out


def output_facts(job, workers: dict) -> list:
    """What rank 0 last printed, and whether a torchrun job's progress pattern has matched yet:
    a job that shows no progress says why here first."""
    out = []
    if job.launcher == LAUNCHER_TORCHRUN and job.state.value == "running" and workers \
            and not workers.get("progressing"):
        out.append(_fact("progress", f"pattern {job.progress_pattern} not matched yet", ids.JOB_PATTERN))
    if workers.get("last_output"):
        out.append(_fact("rank 0's last line", workers["last_output"][-160:], ids.JOB_LAST_OUTPUT))
    return out


def why_children(line: str, job) -> list:
    """The why-line; under a failed job's, the last lines of the log that named the failure."""
    tail = (job.failure or {}).get("tail") or []
    return [line, html.Pre("\n".join(tail[-12:]), id=ids.JOB_FAILURE_TAIL, className="failure-tail")] if tail else [line]


def loss_figure(losses: list, info: dict) -> dict:
    """Loss against step, as the job reported it: does it learn?"""
    if not losses:
        return empty_figure("Loss", "no loss reported yet" if info["state"] != "queued" else _not_yet(info))
    steps, values = [p[0] for p in losses], [p[1] for p in losses]
    return {"data": [{"type": "scatter", "mode": "lines+markers", "x": steps, "y": values,
                      "marker": {"size": 4}, "line": {"color": "#b48ead"}, "name": "loss",
                      "hovertemplate": "step %{x}: loss %{y:.4g}<extra></extra>"}],
            "layout": {"title": {"text": "Loss (reported by rank 0)", "font": {"size": 13}}, "height": 280,
                       "margin": MARGIN, "xaxis": {"title": {"text": "step"}, "rangemode": "tozero"},
                       "yaxis": {"title": {"text": "loss"}}}}


#: the states a job may be resubmitted from (continued as a new job from its checkpoint)
RESUBMITTABLE = ("failed", "cancelled")

LAUNCHER_TEXT = {LAUNCHER_RUNTIME: "elastic runtime (regroups in place)",
                 LAUNCHER_TORCHRUN: "restart-based (torchrun)"}


def job_log(events, allocs, limit=200) -> list[dict]:
    """The job's own events and every change of its allocation, newest first."""
    rows = [(e["time"], e["kind"], e["node"] or "", e["detail"] or "") for e in reversed(events)]
    rows += [(a["time"], a["reason"], _changed(a), _change_words(a)) for a in allocs]
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], i), reverse=True)
    return [{"time": sim_time(rows[i][0]), "kind": rows[i][1], "node": rows[i][2], "detail": rows[i][3]}
            for i in order[:limit]]


def _change_words(alloc: dict) -> str:
    """`8 → 32 nodes`, naming the swap when the step also gave nodes back (app.format.rescale_words)."""
    added, removed = (len(json.loads(alloc.get(k) or "[]")) for k in ("added", "removed"))
    return rescale_words(alloc["from_nodes"], alloc["to_nodes"], added, removed)


def _changed(alloc: dict, shown: int = 3) -> str:
    """The nodes a grow took or a shrink gave back: `+2: a01n01 a01n02`, `−1: b02n07`."""
    parts = []
    for sign, key in (("+", "added"), ("−", "removed")):
        names = json.loads(alloc.get(key) or "[]")
        if names:
            parts.append(f"{sign}{len(names)}: " + " ".join(names[:shown]) + (" …" if len(names) > shown else ""))
    return "; ".join(parts)


def state_words(info: dict) -> str:
    """A running job that holds no node is waiting for one (it keeps its place among the running)."""
    return "waiting for nodes" if info["state"] == "running" and not info["nodes"] else info["state"]


def _fact(k: str, v: str, id_: str = "") -> html.Div:
    value = html.Div(v, className="fact-value", **({"id": id_} if id_ else {}))
    return html.Div([html.Div(k, className="fact-key"), value], className="fact")


def _empty():
    return empty_figure("")


def _not_yet(info) -> str:
    return "no data yet: the job is waiting in the queue" if info["state"] == "queued" else "no data yet"


def nodes_figure(allocs, now, info, axis=TIME_AXIS) -> dict:
    xs, ys = [], []
    for a in allocs:
        xs.append(a["time"] * 1000)
        ys.append(a["to_nodes"])
    if not xs:
        return empty_figure("Nodes over time", _not_yet(info))
    xs.append(now * 1000)
    ys.append(info["nodes"])
    return {"data": [{"type": "scatter", "mode": "lines", "x": xs, "y": ys, "line": {"shape": "hv", "color": "#3cb44b"},
                      "fill": "tozeroy", "name": "nodes"}],
            "layout": {"title": {"text": "Nodes over time", "font": {"size": 13}}, "height": 280,
                       "margin": MARGIN, "xaxis": axis, "yaxis": count_axis("nodes", max(ys))}}


def progress_figure(thr, now, info, total, axis=TIME_AXIS) -> dict:
    xs = [t["time"] * 1000 for t in thr if t["samples_done"] is not None]
    ys = [100 * t["samples_done"] / total for t in thr if t["samples_done"] is not None]
    if not xs:
        return empty_figure("Progress", _not_yet(info))
    xs.append(now * 1000)
    ys.append(100 * info["progress"])
    return {"data": [{"type": "scatter", "mode": "lines", "x": xs, "y": ys, "line": {"color": "#d62728"},
                      "name": "progress"}],
            "layout": {"title": {"text": "Progress", "font": {"size": 13}}, "height": 280,
                       "margin": MARGIN, "xaxis": axis,
                       "yaxis": {"range": [0, 100], "title": {"text": "% of its samples done"}}}}


def _refused(job_id: str, verb: str):
    """Why the person looking may not `verb` this job (a red line), or None: they may."""
    user = context.current_user()
    job = context.harvester.job(job_id)
    if user is None:
        return html.Span(f"Log in to {verb}.", className="error")
    if job is None:
        return html.Span(f"No job {job_id}.", className="error")
    if not user.may_cancel(job.owner):
        return html.Span(f"Only its owner or staff may {verb} this job.", className="error")
    return None


@dash.callback(Output(ids.JOB_CANCEL_RESULT, "children"), Input(ids.JOB_CANCEL_CONFIRM, "submit_n_clicks"),
               State(ids.JOB_ID, "data"), prevent_initial_call=True)
def cancel(n_clicks, job_id):
    if not n_clicks:
        return no_update
    refused = _refused(job_id, "cancel")
    if refused is not None:
        return refused
    try:
        context.harvester.cancel(job_id)
    except (ValueError, RuntimeError, KeyError) as e:
        return html.Span(str(e), className="error")
    return html.Span(f"Cancelled {job_id}.", className="ok")


@dash.callback(Output(ids.JOB_RESUBMIT_RESULT, "children"), Input(ids.JOB_RESUBMIT, "n_clicks"),
               State(ids.JOB_ID, "data"), prevent_initial_call=True)
def resubmit(n_clicks, job_id):
    """A failed or cancelled job continued as a new job from its checkpoint: a link to it."""
    if not n_clicks:
        return no_update
    refused = _refused(job_id, "resubmit")
    if refused is not None:
        return refused
    user = context.current_user()
    try:
        new = context.harvester.resubmit(job_id, user.name, staff=user.is_staff, unix=user.unix)
    except KeyError:
        return html.Span(f"No job {job_id}.", className="error")
    except (ValueError, RuntimeError, Conflict) as e:
        return html.Span(str(e), className="error")
    return html.Span(["Resubmitted as ", dcc.Link(new.id, href=f"/jobs/{new.id}", id=ids.JOB_RESUBMIT + "-new"),
                      f", from {100 * new.samples_done / new.total_samples:.1f} % done."], className="ok")
