"""Replay: choose the trace window, nodes, job set, speed, policy and T_fwd; start, pause,
resume, restart. Staff only; anyone sees the settings of the run in progress."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import dash
from dash import Input, Output, State, ctx, dcc, html, no_update

from core.errors import SettingsError
from core.settings import DATA, MAX_SLOTS, POLICIES, SPEED_MAX, SPEED_MIN, ReplaySettings, parse_tfwd

from app import context, ids
from app.format import gpus

dash.register_page(__name__, path="/replay", name="Replay", title="Replay · harvester")

#: how the form names each setting in its messages
FORM_NAMES = {"start": "window start", "hours": "hours", "nodes": "first N nodes", "racks": "racks",
              "jobs": "job set", "policy": "policy", "tfwd": "T_fwd", "gpus_per_node": "GPUs per node"}
SPEED_MARKS = {0: "1x", 1: "10x", math.log10(60): "60x", math.log10(600): "600x", math.log10(3600): "3600x"}


def _jobsets() -> list[dict]:
    return [{"label": p.name, "value": str(p)} for p in sorted(DATA.glob("jobs-*.csv"))]


def layout(**_):
    h = context.harvester
    if not h.capabilities.can_restart:
        return html.Div([html.H2("Replay"), html.P(
            "This server runs live: nodes come from a live source and jobs run on real workers. "
            "Start `python -m app` without --dispatch for a replay.", className="why")])
    s = h.settings
    user = context.current_user()
    staff = user is not None and user.is_staff
    row = lambda label, comp, hint="": html.Div(
        [html.Label(label), comp, html.Span(hint, className="hint")], className="form-row")
    return html.Div([
        html.H2("Replay"),
        html.P(id=ids.RP_STATE, className="why"),
        html.Div([
            row("Window start (UTC)", dcc.Input(id=ids.RP_START, type="text", value=s.start or "",
                                                placeholder="2021-02-10T20:00:00Z", className="form-input"),
                "ISO 8601; empty = start of the trace"),
            row("Hours", dcc.Input(id=ids.RP_HOURS, type="number", min=0.1, step=0.1, value=s.hours,
                                   className="form-input"), "empty = to the end of the trace"),
            row("First N nodes", dcc.Input(id=ids.RP_NODES, type="number", min=1, step=1, value=s.nodes,
                                           className="form-input"), "empty = all"),
            row("Racks", dcc.Input(id=ids.RP_RACKS, type="text", value=s.racks or "", placeholder="a01-a10,b03",
                                   className="form-input"), "empty = all"),
            row("GPUs per node", dcc.Input(id=ids.RP_GPUS, type="number", min=1, max=MAX_SLOTS, step=1,
                                           value=s.gpus_per_node, className="form-input"),
                "empty = 6 for the Summit trace, else 1"),
            row("Job set", dcc.Dropdown(id=ids.RP_JOBSET, options=_jobsets(), value=str(s.jobs), clearable=False,
                                        className="form-input")),
            row("Policy", dcc.Dropdown(id=ids.RP_POLICY, options=list(POLICIES), value=s.config.policy,
                                       clearable=False, className="form-input")),
            row("T_fwd (s)", dcc.Input(id=ids.RP_TFWD, type="text", value=str(s.config.tfwd),
                                       className="form-input"),
                "how far ahead the allocator looks: seconds, or auto (learned from the idle fragments)"),
            row("Speed", html.Div(dcc.Slider(id=ids.RP_SPEED, min=0, max=math.log10(SPEED_MAX), step=0.01,
                                             value=math.log10(h.speed), marks=SPEED_MARKS,
                                             updatemode="mouseup", allow_direct_input=False),
                                  className="slider"),
                "simulated seconds per wall second"),
        ], className="form"),
        html.Div([
            html.Button("Start new run", id=ids.RP_NEW, n_clicks=0, className="button", disabled=not staff),
            html.Button("Pause", id=ids.RP_PAUSE, n_clicks=0, className="button", disabled=not staff),
            html.Button("Resume", id=ids.RP_RESUME, n_clicks=0, className="button", disabled=not staff),
            html.Button("Restart", id=ids.RP_RESTART, n_clicks=0, className="button", disabled=not staff),
            html.Button("Apply speed", id=ids.RP_APPLY_SPEED, n_clicks=0, className="button", disabled=not staff),
        ], className="buttons"),
        html.Div("" if staff else "Log in as staff to control the replay.", id=ids.RP_RESULT,
                 className="form-result muted"),
    ])


@dash.callback(Output(ids.RP_STATE, "children"), Input(ids.TICK, "n_intervals"))
def state(_n):
    h = context.harvester
    if not h.capabilities.can_restart:
        return no_update
    snap = h.snapshot
    s = h.settings
    window = (f"from {s.start or 'the start'} " + (f"for {s.hours:g} h" if s.hours else "to the end of the trace"))
    nodes = f"{len(snap.nodes):,} nodes" if snap.nodes else ""
    if snap.nodes and snap.slots and len(set(snap.slots)) == 1:
        nodes += f" × {gpus(snap.slots[0])}"
    err = f" — error: {h.problem}" if h.problem else ""
    return (f"{snap.status} at {h.speed:g}x: {Path(s.trace).name}, {window}, {nodes}, "
            f"{Path(s.jobs).name}, policy {s.config.policy}, T_fwd {_tfwd(s.config.tfwd)}{err}")


@dash.callback(Output(ids.RP_RESULT, "children"),
               Input(ids.RP_NEW, "n_clicks"), Input(ids.RP_PAUSE, "n_clicks"), Input(ids.RP_RESUME, "n_clicks"),
               Input(ids.RP_RESTART, "n_clicks"), Input(ids.RP_APPLY_SPEED, "n_clicks"),
               State(ids.RP_START, "value"), State(ids.RP_HOURS, "value"), State(ids.RP_NODES, "value"),
               State(ids.RP_RACKS, "value"), State(ids.RP_JOBSET, "value"), State(ids.RP_POLICY, "value"),
               State(ids.RP_TFWD, "value"), State(ids.RP_SPEED, "value"), State(ids.RP_GPUS, "value"),
               prevent_initial_call=True)
def command(_new, _pause, _resume, _restart, _speed, start, hours, nodes, racks, jobset, policy, tfwd, speed_log,
            gpus_per_node):
    user = context.current_user()
    if user is None or not user.is_staff:
        return html.Span("Only staff may control the replay.", className="error")
    h = context.harvester
    what = ctx.triggered_id
    speed = round(10 ** (speed_log or 0), 2)
    speed = min(SPEED_MAX, max(SPEED_MIN, speed))
    try:
        if what == ids.RP_PAUSE:
            h.pause()
            return html.Span("Paused.", className="ok")
        if what == ids.RP_RESUME:
            h.resume()
            return html.Span("Resumed.", className="ok")
        if what == ids.RP_APPLY_SPEED:
            h.set_speed(speed)
            return html.Span(f"Speed {speed:g}x.", className="ok")
        if what == ids.RP_RESTART:
            h.restart(speed=speed)
            return html.Span("Restarting from the beginning of the window…", className="ok")
        if what == ids.RP_NEW:
            settings = new_settings(h.settings, start, hours, nodes, racks, jobset, policy, tfwd, gpus_per_node)
            h.restart(settings, speed=speed)
            return html.Span("Loading the new run…", className="ok")
    except SettingsError as e:
        return html.Span(e.render(lambda path: FORM_NAMES.get(path.rsplit(".", 1)[-1], path)), className="error")
    except (ValueError, RuntimeError) as e:
        return html.Span(str(e), className="error")
    return no_update


def _tfwd(tfwd: float | str) -> str:
    return tfwd if isinstance(tfwd, str) else f"{tfwd:g} s"


def new_settings(base: ReplaySettings, start, hours, nodes, racks, jobset, policy, tfwd,
                 gpus_per_node=None) -> ReplaySettings:
    """Replay settings from the form (checked by ReplaySettings itself); raises SettingsError."""
    if jobset not in {o["value"] for o in _jobsets()}:
        raise SettingsError("jobs", "choose one of the job sets in data/")
    try:
        config = replace(base.config, policy=policy, tfwd=parse_tfwd(tfwd) if tfwd else base.config.tfwd)
        return replace(base, jobs=Path(jobset), start=start, hours=float(hours) if hours else None,
                       nodes=int(nodes) if nodes else None, racks=racks, config=config,
                       gpus_per_node=_whole(gpus_per_node))
    except (TypeError, ValueError) as e:
        if isinstance(e, SettingsError):
            raise
        raise SettingsError("", f"a number field holds something else: {e}") from None


def _whole(value):
    """A whole number from a number field (the browser sends 4.0 or 4); anything else is left for
    ReplaySettings to refuse with the field's name."""
    if value in (None, ""):
        return None
    return int(value) if isinstance(value, float) and value.is_integer() else value
