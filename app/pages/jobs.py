"""Jobs: a sortable, filterable table of every job, and the registration form."""
from __future__ import annotations

import dash
from dash import Input, Output, State, dash_table, dcc, html, no_update
from pydantic import ValidationError

from core.schemas import JobSpec, field_errors

from app import context, ids
from app.job_list import CONFIDENCE, JobQuery, list_jobs
from app.format import short_time, si

dash.register_page(__name__, path="/jobs", name="Jobs", title="Jobs · harvester")

PAGE_SIZE = 20
STATES = ("queued", "running", "done", "failed", "cancelled")
COLUMNS = [
    {"id": "link", "name": "job", "presentation": "markdown"},
    {"id": "name", "name": "name"}, {"id": "owner", "name": "owner"}, {"id": "state", "name": "state"},
    {"id": "nodes", "name": "nodes now", "type": "numeric"},
    {"id": "rate", "name": "samples/s", "type": "numeric"},
    {"id": "progress", "name": "progress %", "type": "numeric"},
    {"id": "curve", "name": "curve"},
    {"id": "eta", "name": "ETA"}, {"id": "submitted", "name": "submitted"},
]
#: the table opens on what is happening: running jobs (largest first), then the queue (in the
#: order it is served), then ended jobs (latest first); job_list.STATE_ORDER
DEFAULT_SORT = [{"column_id": "state", "direction": "asc"}]
#: fields only a live harvester's real workers use (a replay's jobs are simulated)
LIVE_ONLY = ("command", "global_batch", "launcher", "progress_pattern", "stop_grace_seconds")
SORT_KEYS = {"link": "id", "name": "name", "owner": "owner", "state": "state", "nodes": "nodes",
             "rate": "samples_per_second", "progress": "progress", "curve": "confidence", "eta": "eta",
             "submitted": "submit_time"}
FIELDS = {  # field: (label, placeholder/default, hint)
    "name": ("Name", "", "what the job trains, e.g. resnet50-imagenet"),
    "min_nodes": ("Min nodes", "1", "smallest size it can run at"),
    "max_nodes": ("Max nodes", "64", "largest size worth giving it"),
    "total_samples": ("Total samples", "1.28e8", "samples to process before it is done"),
    "curve": ("Throughput curve", "1:1200, 8:9000, 32:30000", "nodes:samples/s pairs"),
    "scale_up_seconds": ("Grow pause (s)", "18", "seconds of progress a grow costs"),
    "scale_down_seconds": ("Shrink pause (s)", "12", "seconds of progress a shrink costs"),
    "priority": ("Priority", "1", "weight under the priority objective"),
    "command": ("Command", "python examples/digits_cnn.py --lr 0.05", "live mode: what each node runs"),
    "global_batch": ("Global batch", "256", "live mode: samples per step (runtime jobs)"),
    "launcher": ("Launcher", "runtime", "runtime (imports our elastic runtime) or torchrun (an unmodified script)"),
    "progress_pattern": ("Progress pattern", r"samples=(\d+)", "torchrun: RE2 pattern, group 1 = samples so far"),
    "stop_grace_seconds": ("Stop grace (s)", "30", "torchrun: SIGTERM to SIGKILL, time to checkpoint"),
}
DEFAULTS = {"min_nodes": "1", "max_nodes": "64", "scale_up_seconds": "18", "scale_down_seconds": "12",
            "priority": "1"}


def layout(**_):
    user = context.current_user()
    live = context.harvester.capabilities.runs_workers
    return html.Div([
        html.Div([
            html.H2("Jobs"),
            html.Div([
                dcc.Dropdown(id=ids.JOBS_STATE, options=[{"label": s, "value": s} for s in STATES],
                             multi=True, placeholder="any state", className="filter-state"),
                dcc.Input(id=ids.JOBS_SEARCH, type="text", placeholder="search id, name or owner",
                          debounce=True, className="filter-search"),
                dcc.Dropdown(id=ids.JOBS_CURVE, options=[{"label": f"curve: {c}", "value": c} for c in CONFIDENCE],
                             multi=True, placeholder="any curve", className="filter-curve"),
                html.Span(id=ids.JOBS_COUNT, className="muted"),
            ], className="filters"),
            dash_table.DataTable(
                id=ids.JOBS_TABLE, columns=COLUMNS, data=[], page_current=0, page_size=PAGE_SIZE,
                page_action="custom", sort_action="custom", sort_mode="single",
                sort_by=DEFAULT_SORT, markdown_options={"link_target": "_self"},
                style_cell={"fontFamily": "inherit", "fontSize": 13, "padding": "4px 8px"},
                style_header={"fontWeight": "600"}, style_table={"overflowX": "auto"}),
        ], className="jobs-main"),
        html.Aside([html.H3("Register a job"), _form(user, live)], className="jobs-side"),
    ], className="jobs-layout")


def _form(user, live: bool = True) -> html.Div:
    if user is None:
        return html.Div([dcc.Link("Log in", href="/login"), " to register a job."], className="muted")
    rows = []
    for f, (label, placeholder, hint) in FIELDS.items():
        rows.append(html.Div([
            html.Label(label, htmlFor=ids.field_input(f)),
            dcc.Input(id=ids.field_input(f), type="text", value=DEFAULTS.get(f, ""),
                      placeholder=placeholder, className="form-input"),
            html.Span(hint, className="hint"),
            html.Div(id=ids.field_error(f), className="field-error"),
        ], className="form-row", style=None if live or f not in LIVE_ONLY else {"display": "none"}))
    return html.Div([*rows, html.Button("Register", id=ids.FORM_SUBMIT, n_clicks=0, className="button"),
                     html.Div(id=ids.FORM_RESULT, className="form-result")], id=ids.FORM, className="form")


def table_rows(snap, history, states, text, sort_by, page, size=PAGE_SIZE, curves=None):
    """One page of the table and how many jobs match: the snapshot's jobs and the store's older
    ended ones, filtered, sorted and paged together (app/job_list.py)."""
    sort = (sort_by or DEFAULT_SORT)[0]
    q = JobQuery(states=tuple(states or ()), text=(text or "").strip(), curves=tuple(curves or ()),
                 order=SORT_KEYS.get(sort["column_id"], "state"), descending=sort["direction"] == "desc")
    page_rows, total = list_jobs(snap, history, q, page * size, size)
    out = [{"link": f'[{j["id"]}](/jobs/{j["id"]})', "name": j["name"], "owner": j["owner"] or "job set",
            "state": "waiting for nodes" if j["state"] == "running" and not j["nodes"] else j["state"],
            "nodes": j["nodes"], "rate": si(j["samples_per_second"]),
            "progress": round(100 * j["progress"], 1), "curve": j.get("confidence") or "",
            "eta": short_time(j["eta"]),
            "submitted": short_time(j["submit_time"])} for j in page_rows]
    return out, total


@dash.callback(Output(ids.JOBS_TABLE, "data"), Output(ids.JOBS_TABLE, "page_count"),
               Output(ids.JOBS_COUNT, "children"),
               Input(ids.TICK, "n_intervals"), Input(ids.JOBS_STATE, "value"),
               Input(ids.JOBS_SEARCH, "value"), Input(ids.JOBS_TABLE, "sort_by"),
               Input(ids.JOBS_TABLE, "page_current"), Input(ids.JOBS_CURVE, "value"))
def update_table(_n, states, text, sort_by, page, curves):
    rows, total = table_rows(context.harvester.snapshot, context.history, states, text, sort_by, page or 0,
                             curves=curves)
    pages = max(1, -(-total // PAGE_SIZE))
    return rows, pages, f"{total:,} job{'s' if total != 1 else ''}"


@dash.callback([Output(ids.field_error(f), "children") for f in FIELDS] + [Output(ids.FORM_RESULT, "children")],
               Input(ids.FORM_SUBMIT, "n_clicks"),
               [State(ids.field_input(f), "value") for f in FIELDS], prevent_initial_call=True)
def register(n_clicks, *values):
    """Validate with the API's own rules; store nothing unless every field is right."""
    blank = [""] * len(FIELDS)
    if not n_clicks:
        return [no_update] * (len(FIELDS) + 1)
    user = context.current_user()
    if user is None:
        return blank + [html.Span("Log in to register a job.", className="error")]
    raw = {f: v for f, v in zip(FIELDS, values) if v not in (None, "")}
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as e:
        errs = field_errors(e)
        missing = {f: "required" for f in FIELDS if f not in raw and f in errs}
        errs.update(missing)
        return [errs.get(f, "") for f in FIELDS] + [html.Span("Nothing was registered: fix the marked fields.",
                                                              className="error")]
    try:
        job = context.harvester.submit(spec, user.name, staff=user.is_staff, unix=user.unix)
    except ValueError as e:
        field, _, msg = str(e).partition(": ")
        if field in FIELDS:
            return [msg if f == field else "" for f in FIELDS] + [
                html.Span("Nothing was registered: fix the marked fields.", className="error")]
        return blank + [html.Span(str(e), className="error")]
    except RuntimeError as e:
        return blank + [html.Span(str(e), className="error")]
    return blank + [html.Span(["Registered ", dcc.Link(job.id, href=f"/jobs/{job.id}"), f" ({job.name}). ",
                               where_in_queue(context.harvester.snapshot, job.id)], className="ok")]


def where_in_queue(snap, job_id: str) -> str:
    """What a person who just registered a job wants to know: when it will start."""
    cfg = snap.config
    lane, max_jobs = cfg.get("visitor_slots", 0), cfg.get("max_jobs", 0)
    queued = sorted((j for j in snap.jobs if j["state"] == "queued"), key=lambda j: j["submit_time"])
    mine = next((j for j in queued if j["id"] == job_id), None)
    if mine is None:
        return ""
    running = [j for j in snap.jobs if j["state"] == "running"]
    if lane and mine["owner"]:
        ahead = sum(1 for j in queued if j["owner"] and j["submit_time"] <= mine["submit_time"]) - 1
        free = max_jobs + lane - len(running)
        if ahead < free:
            return (f"Demo lane: registered jobs go ahead of the job set's {len(queued) - 1 - ahead:,} queued; "
                    "it starts at the next step (seconds) and gets nodes first.")
        return f"Demo lane: number {ahead + 1} among registered jobs; it starts when one of them ends."
    position = queued.index(mine) + 1
    return (f"Number {position:,} in the queue; {len(running)} of at most {max_jobs} jobs are running, "
            f"so it starts when {position} of them {'has' if position == 1 else 'have'} ended.")
