"""Replay: choose the trace window, nodes, job set, speed, policy and T_fwd; start, pause,
resume, restart. Staff only; anyone sees the settings of the run in progress. The whole form is
checked on the server before the running replay is touched, and a new run or a restart is
confirmed first: the demo in progress is never lost to a typo."""
from __future__ import annotations

import math
from pathlib import Path

import dash
from dash import Input, Output, State, ctx, dcc, html, no_update

from core.settings import MAX_SLOTS, POLICIES, SPEED_MAX, SPEED_MIN

from app import context, ids
from app.format import gpus
from app.replay_form import FIELDS, FormErrors, jobsets, parse

dash.register_page(__name__, path="/replay", name="Replay", title="Replay · harvester")

#: the speeds the slider snaps to (any other goes in the number box)
SPEEDS = (1, 10, 60, 600, 3600)
SPEED_MARKS = {math.log10(s): f"{s}x" for s in SPEEDS}
#: the input of each form field, in FIELDS order
INPUTS = {"start": ids.RP_START, "hours": ids.RP_HOURS, "nodes": ids.RP_NODES, "racks": ids.RP_RACKS,
          "gpus": ids.RP_GPUS, "jobs": ids.RP_JOBSET, "policy": ids.RP_POLICY, "tfwd": ids.RP_TFWD,
          "speed": ids.RP_SPEED_BOX}


def _row(label: str, comp, field: str, hint: str = "") -> html.Div:
    return html.Div([html.Label(label, htmlFor=INPUTS[field]), comp, html.Span(hint, className="hint"),
                     html.Div(id=ids.rp_error(field), className="field-error")], className="form-row")


def _text(id_: str, value, placeholder: str = "", numeric: bool = False) -> dcc.Input:
    """Numbers are typed as text so that the server sees what was typed (a browser's number field
    sends nothing for a value outside its range, and blank means 'the default')."""
    return dcc.Input(id=id_, type="text", value="" if value is None else f"{value:g}" if numeric else value,
                     placeholder=placeholder, inputMode="decimal" if numeric else None, className="form-input",
                     debounce=False)


def layout(**_):
    h = context.harvester
    if not h.capabilities.can_restart:
        return html.Div([html.H2("Replay"), html.P(
            "This server runs live: nodes come from a live source and jobs run on real workers, in wall "
            "time. There is no replay to control here.", className="why")])
    s = h.settings
    user = context.current_user()
    staff = user is not None and user.is_staff
    return html.Div([
        html.H2("Replay"),
        html.P(id=ids.RP_STATE, className="why"),
        html.Div([
            _row("Window start (UTC)", _text(ids.RP_START, s.start or "", "2021-02-10T20:00:00Z"), "start",
                 "ISO 8601; empty = start of the trace"),
            _row("Hours", _text(ids.RP_HOURS, s.hours, "all", numeric=True), "hours",
                 "empty = to the end of the trace"),
            _row("First N nodes", _text(ids.RP_NODES, s.nodes, "all", numeric=True), "nodes", "empty = all"),
            _row("Racks", _text(ids.RP_RACKS, s.racks or "", "a01-a10,b03"), "racks", "empty = all"),
            _row("GPUs per node", _text(ids.RP_GPUS, s.gpus_per_node, "6", numeric=True), "gpus",
                 f"1 to {MAX_SLOTS}; empty = 6 for the Summit trace, else 1"),
            _row("Job set", dcc.Dropdown(id=ids.RP_JOBSET, options=jobsets(), value=str(s.jobs), clearable=False,
                                         className="form-input"), "jobs"),
            _row("Policy", dcc.Dropdown(id=ids.RP_POLICY, options=list(POLICIES), value=s.config.policy,
                                        clearable=False, className="form-input"), "policy"),
            _row("T_fwd (s)", _text(ids.RP_TFWD, str(s.config.tfwd)), "tfwd",
                 "how far ahead the allocator looks: seconds, or auto (learned from the idle fragments)"),
            _row("Speed", html.Div([
                html.Div(dcc.Slider(id=ids.RP_SPEED, min=0, max=math.log10(SPEED_MAX), step=None,
                                    value=_snap(h.speed), marks=SPEED_MARKS, updatemode="mouseup",
                                    allow_direct_input=False), className="slider"),
                dcc.Input(id=ids.RP_SPEED_BOX, type="number", value=round(h.speed, 2), min=SPEED_MIN,
                          max=SPEED_MAX, className="form-input speed-box"),
            ], className="speed"), "speed", "simulated seconds per wall second (x)"),
        ], className="form"),
        html.Div([
            html.Button("Start new run", id=ids.RP_NEW, n_clicks=0, className="button", disabled=not staff),
            html.Button("Pause", id=ids.RP_PAUSE, n_clicks=0, className="button", disabled=not staff),
            html.Button("Resume", id=ids.RP_RESUME, n_clicks=0, className="button", disabled=not staff),
            dcc.ConfirmDialogProvider(
                html.Button("Restart", id=ids.RP_RESTART, n_clicks=0, className="button", disabled=not staff),
                id=ids.RP_CONFIRM_RESTART,
                message="Restart this run from the beginning of its window? Its jobs and history are dropped."),
            html.Button("Apply speed", id=ids.RP_APPLY_SPEED, n_clicks=0, className="button", disabled=not staff),
        ], className="buttons"),
        dcc.ConfirmDialog(id=ids.RP_CONFIRM_NEW),
        dcc.Store(id=ids.RP_PENDING),
        html.Div("" if staff else "Log in as staff to control the replay.", id=ids.RP_RESULT,
                 className="form-result muted"),
    ])


def _snap(speed: float) -> float:
    """The slider position nearest a speed."""
    return min(SPEED_MARKS, key=lambda x: abs(x - math.log10(max(speed, SPEED_MIN))))


@dash.callback(Output(ids.RP_SPEED, "value"), Output(ids.RP_SPEED_BOX, "value"),
               Input(ids.RP_SPEED, "value"), Input(ids.RP_SPEED_BOX, "value"), prevent_initial_call=True)
def speed_pair(slider, box):
    """The slider snaps to round speeds and fills the box; a speed typed in the box moves the
    slider to its nearest mark."""
    if ctx.triggered_id == ids.RP_SPEED:
        return no_update, round(10 ** (slider or 0))
    if box is None:
        return no_update, no_update
    return _snap(float(box)), no_update


@dash.callback(Output(ids.RP_STATE, "children"), Output(ids.RP_RESULT, "children", allow_duplicate=True),
               Output(ids.RP_PENDING, "data", allow_duplicate=True),
               Input(ids.TICK, "n_intervals"), State(ids.RP_PENDING, "data"), prevent_initial_call=True)
def state(_n, pending):
    h = context.harvester
    if not h.capabilities.can_restart:
        return no_update, no_update, no_update
    snap = h.snapshot
    s = h.settings
    window = (f"from {s.start or 'the start'} " + (f"for {s.hours:g} h" if s.hours else "to the end of the trace"))
    nodes = f"{len(snap.nodes):,} nodes" if snap.nodes else ""
    if snap.nodes and snap.slots and len(set(snap.slots)) == 1:
        nodes += f" × {gpus(snap.slots[0])}"
    err = f" — error: {h.problem}" if h.problem else ""
    line = (f"{snap.status} at {h.speed:g}x: {Path(s.trace).name}, {window}, {nodes}, "
            f"{Path(s.jobs).name}, policy {s.config.policy}, T_fwd {_tfwd(s.config.tfwd)}{err}")
    if pending and snap.status != "loading":
        done = (html.Span(f"The new run could not start: {h.problem}", className="error") if h.problem
                else html.Span("The new run is running.", className="ok"))
        return line, done, None
    return line, no_update, no_update


ERRORS = [Output(ids.rp_error(f), "children") for f in FIELDS]
FORM = [State(INPUTS[f], "value") for f in FIELDS]


@dash.callback(Output(ids.RP_RESULT, "children"), Output(ids.RP_CONFIRM_NEW, "displayed"),
               Output(ids.RP_CONFIRM_NEW, "message"), Output(ids.RP_PENDING, "data"), *ERRORS,
               Input(ids.RP_NEW, "n_clicks"), Input(ids.RP_CONFIRM_NEW, "submit_n_clicks"),
               Input(ids.RP_PAUSE, "n_clicks"), Input(ids.RP_RESUME, "n_clicks"),
               Input(ids.RP_CONFIRM_RESTART, "submit_n_clicks"), Input(ids.RP_APPLY_SPEED, "n_clicks"),
               *FORM, prevent_initial_call=True)
def command(_new, _confirmed, _pause, _resume, _restart, _speed, *values):
    """Every button of the page. Start new run checks the whole form, then asks; only the
    confirmed, re-checked form replaces the running replay."""
    clear = [""] * len(FIELDS)

    def answer(result, confirm=False, message=no_update, pending=no_update, errors=clear):
        return [result, confirm, message, pending, *errors]

    user = context.current_user()
    if user is None or not user.is_staff:
        return answer(html.Span("Only staff may control the replay.", className="error"))
    h = context.harvester
    what = ctx.triggered_id
    raw = dict(zip(FIELDS, values))
    try:
        if what == ids.RP_PAUSE:
            h.pause()
            return answer(html.Span("Paused.", className="ok"))
        if what == ids.RP_RESUME:
            h.resume()
            return answer(html.Span("Resumed.", className="ok"))
        if what in (ids.RP_APPLY_SPEED, ids.RP_CONFIRM_RESTART):
            speed = _speed_of(raw.get("speed"))
            if what == ids.RP_APPLY_SPEED:
                h.set_speed(speed)
                return answer(html.Span(f"Speed {speed:g}x.", className="ok"))
            h.restart(speed=speed)
            return answer(html.Span("Restarting from the beginning of the window…", className="ok"), pending=1)
        settings, speed = parse(h.settings, raw, h.check)
        if what == ids.RP_NEW:
            return answer(html.Span("Waiting for your confirmation…", className="muted"), confirm=True,
                          message=_describe(settings, speed))
        h.restart(settings, speed=speed)
        return answer(html.Span("Loading the new run…", className="ok"), pending=1)
    except FormErrors as e:
        errors = [e.errors.get(f, "") for f in FIELDS]
        general = e.errors.get("form")
        text = f"Not started: {general}" if general else "Not started: fix the fields marked in red; the current run goes on."
        return answer(html.Span(text, className="error"), errors=errors)
    except (ValueError, RuntimeError) as e:
        return answer(html.Span(str(e), className="error"))


def _speed_of(value) -> float:
    try:
        speed = float(value)
    except (TypeError, ValueError):
        raise FormErrors({"speed": f"type a number of x from {SPEED_MIN:g} to {SPEED_MAX:g}"}) from None
    if not (math.isfinite(speed) and SPEED_MIN <= speed <= SPEED_MAX):
        raise FormErrors({"speed": f"must be from {SPEED_MIN:g}x to {SPEED_MAX:g}x, not {value}"})
    return speed


def _describe(s, speed: float) -> str:
    window = f"from {s.start or 'the start of the trace'}" + (f" for {s.hours:g} h" if s.hours else " to its end")
    nodes = f"the first {s.nodes:,} nodes" if s.nodes else (f"racks {s.racks}" if s.racks else "all nodes")
    return (f"Replace the running replay with a new run {window}, {nodes}, {Path(s.jobs).name}, policy "
            f"{s.config.policy}, at {speed:g}x? The current run's jobs and history are dropped.")


def _tfwd(tfwd: float | str) -> str:
    return tfwd if isinstance(tfwd, str) else f"{tfwd:g} s"
