"""Allocator: the horizon in use, solver runs, the solve-time histogram, the last decision as a
diff, the event log."""
from __future__ import annotations

import json

import dash
from dash import Input, Output, dash_table, dcc, html, no_update

from app import context, ids
from app.charts import MARGIN, count_axis, empty_figure, fit_top, histogram
from app.format import rescale_words, sim_time
from core.horizon import MIN_STANDS

dash.register_page(__name__, path="/allocator", name="Allocator", title="Allocator · harvester")

EVENTS_PAGE = 25
WEIGHTS = {"priority": "; each job's term weighted by its priority",
           "efficiency": "; each job's term divided by its throughput on one node",
           "fairshare": "; each job's term weighted by its owner's fair-share factor, 2^(-use/share)"}
_CELL = {"fontSize": 13, "padding": "3px 8px", "fontFamily": "inherit"}


def layout(**_):
    return html.Div([
        html.H2("Allocator"),
        html.P(id=ids.HORIZON_PLAIN, className="lead"),
        html.P(id=ids.HORIZON, className="muted"),
        html.Div([
            html.Div([html.H3("Last decision"),
                      dash_table.DataTable(id=ids.DECISIONS, columns=[
                          {"id": c, "name": n} for c, n in (("job", "job"), ("change", "from → to"),
                                                            ("reason", "why"), ("nodes", "nodes added / removed"))],
                          data=[], style_cell=_CELL, style_cell_conditional=[
                              {"if": {"column_id": "nodes"}, "maxWidth": 380, "overflow": "hidden",
                               "textOverflow": "ellipsis"}])], className="half"),
            html.Div([dcc.Graph(id=ids.SOLVE_HIST, config={"displayModeBar": False})], className="half"),
        ], className="row"),
        html.H3("Solver runs"),
        dash_table.DataTable(id=ids.SOLVER_RUNS, columns=[{"id": c, "name": n} for c, n in (
            ("time", "time"), ("policy", "policy"), ("solver", "solver"), ("status", "status"),
            ("objective", "objective"), ("size", "jobs × nodes"), ("solve_ms", "solve ms"))],
            data=[], style_cell=_CELL),
        html.P(id=ids.OBJECTIVE_HINT, className="hint"),
        html.H3("Event log"),
        dash_table.DataTable(id=ids.EVENT_LOG, columns=[{"id": c, "name": c} for c in
                                                        ("id", "time", "kind", "node", "job", "detail")],
                             data=[], page_current=0, page_size=EVENTS_PAGE, page_action="custom",
                             style_cell=_CELL),
    ])


def objective_text(config: dict) -> tuple[str, str]:
    """The unit of the solver runs' objective and what it is: samples over T_fwd with a fixed
    horizon, samples per second net of amortised pauses with `--tfwd auto` (core.objective)."""
    weighted = WEIGHTS.get(config.get("objective", "throughput"), "")
    unit = "weighted samples" if weighted else "samples"
    if isinstance(config.get("tfwd", 10.0), str):
        return f"{unit}/s", (f"Objective ({unit}/s): the throughput the chosen sizes train at, less each grow or "
                             "shrink pause's lost samples spread over its job's horizon (negative when rescaling "
                             f"costs more than it gains within the horizon{weighted}).")
    return unit, (f"Objective ({unit}): what the chosen sizes would train over the next T_fwd seconds, less "
                  "the samples lost to the grow and shrink pauses they cause (negative when rescaling costs "
                  f"more than T_fwd gains{weighted}).")


def order_text(config: dict) -> str:
    """Which end of a cohort placement fills jobs from, and what it learned that from."""
    o = config.get("reclaim_order") or {}
    n, mean, direction = o.get("reclaims", 0), o.get("mean_position"), o.get("direction", 0)
    if not n or mean is None:
        seen = "no reclaim has taken part of a cohort yet"
    else:
        seen = f"{n:,} reclaims took part of a cohort, the nodes taken at {mean:.2f} of it on average"
    if direction == 0:
        return f" The main scheduler's order within a cohort is not known yet ({seen}), so jobs fill from its first node."
    ends = ("first", "last") if direction > 0 else ("last", "first")
    return (f" The main scheduler takes a cohort's {ends[0]} nodes first ({seen}; 0 is its first node, 1 its "
            f"last), so jobs fill from its {ends[1]} node.")


def plain_horizon(config: dict) -> str:
    """The horizon in one plain sentence first, for whoever opens the page without the paper: the
    technical account (horizon_text) follows it."""
    tfwd = config.get("tfwd", 10.0)
    h = config.get("horizon") or {}
    pays = "Jobs change size when the change pays off within"
    why = (". A grow or shrink pauses the job, so it is made only when the faster training over that time "
           "makes up for the pause.")
    if not isinstance(tfwd, str):
        return f"{pays} {tfwd:,.0f} s, a fixed horizon{why}"
    seconds = h.get("tfwd", 10.0)
    if h.get("learned"):
        return f"{pays} ~{seconds:,.0f} s, the time allocations usually stand{why}"
    if h.get("bound"):
        return f"{pays} ~{seconds:,.0f} s, the time allocations have stood so far (still learning){why}"
    return (f"{pays} {seconds:,.0f} s for now, until enough allocations have changed to learn how long they "
            f"usually stand{why}")


def horizon_text(config: dict) -> str:
    """What the allocator looks ahead with, and (tfwd auto) what it learned that from."""
    return _horizon_text(config) + order_text(config)


def _horizon_text(config: dict) -> str:
    tfwd = config.get("tfwd", 10.0)
    h = config.get("horizon") or {}
    if not isinstance(tfwd, str):
        return f"Horizon: T_fwd {tfwd:g} s, fixed (--tfwd auto learns it from how long allocations stand)."
    median = h.get("median_s")
    life = h.get("node_life_s")
    nodes = (f" Placement: {h.get('fragments', 0):,} idle fragments ended, {h.get('nodes', 0):,} nodes idle now"
             + (f"; median fragment {median:,.0f} s" if median is not None else "")
             + (f", an idle node expected to stay {life:,.0f} s" if life is not None else "") + ".")
    if not h.get("learned") and h.get("bound"):
        return (f"Horizon: learned (--tfwd auto), at least {h['tfwd']:,.0f} s so far: the median time an allocation "
                f"stands, each of the {h.get('standing', 0):,} standing now counted as if it changed now; "
                f"{h.get('stands', 0):,} have changed (the median itself is used once {MIN_STANDS} have and it "
                f"lies within what has been seen)." + nodes)
    if not h.get("learned"):
        return (f"Horizon: learned (--tfwd auto); {h.get('tfwd', 10.0):g} s until {MIN_STANDS} allocations "
                f"have changed ({h.get('stands', 0):,} so far)." + nodes)
    return (f"Horizon: learned (--tfwd auto), {h['tfwd']:,.0f} s: the median time a job's allocation stands "
            f"before it changes, from {h.get('stands', 0):,} that changed and {h.get('standing', 0):,} standing "
            f"now (censored)." + nodes)


@dash.callback(Output(ids.DECISIONS, "data"), Output(ids.SOLVER_RUNS, "data"), Output(ids.SOLVE_HIST, "figure"),
               Output(ids.HORIZON, "children"), Output(ids.OBJECTIVE_HINT, "children"),
               Output(ids.SOLVER_RUNS, "tooltip_header"), Output(ids.HORIZON_PLAIN, "children"),
               Input(ids.TICK, "n_intervals"))
def update(n):
    if n and n % 2:
        return (no_update,) * 7
    hist = context.history
    config = context.harvester.snapshot.config
    unit, hint = objective_text(config)
    decisions = []
    for d in hist.last_decisions():
        added, removed = json.loads(d["added"] or "[]"), json.loads(d["removed"] or "[]")
        parts = ([f"+{len(added)}: " + " ".join(added[:6]) + (" …" if len(added) > 6 else "")] if added else []) + \
                ([f"−{len(removed)}: " + " ".join(removed[:6]) + (" …" if len(removed) > 6 else "")] if removed else [])
        decisions.append({"job": d["job"],
                          "change": rescale_words(d["from_nodes"], d["to_nodes"], len(added), len(removed)),
                          "reason": d["reason"], "nodes": "; ".join(parts)})
    runs = [{"time": sim_time(r["time"]), "policy": r["policy"], "solver": r["solver"], "status": r["status"],
             "objective": f'{r["objective"]:,.0f} {unit}' if r["objective"] is not None else "–",
             "size": f'{r["jobs"]} × {r["nodes"]}', "solve_ms": round(r["solve_ms"], 2)}
            for r in hist.solver_runs(20)]
    return (decisions, runs, solve_figure(hist.solve_times()), horizon_text(config), hint,
            {"objective": hint}, plain_horizon(config))


def solve_figure(times: list[float]) -> dict:
    """How long the solver takes: whole runs per bin of solve time, on linear axes that end a
    little above the 95th percentile (the few slower runs counted in the last bar, and said)."""
    if not times:
        return empty_figure("Solve time", height=260)
    top = fit_top(times)
    centres, counts, width = histogram(times, top=top)
    over = sum(1 for t in times if t > top)
    title = f"Solve time, last {len(times):,} runs"
    if over:
        title += f" ({over:,} slower than {top:g} ms, up to {max(times):,.0f} ms, in the last bar)"
    return {"data": [{"type": "bar", "x": centres, "y": counts, "width": width, "marker": {"color": "#5e81ac"},
                      "hovertemplate": "%{y} runs near %{x:.2f} ms<extra></extra>"}],
            "layout": {"title": {"text": title, "font": {"size": 13}},
                       "height": 260, "margin": MARGIN, "bargap": 0.05,
                       "xaxis": {"title": {"text": "solve time (ms)"}, "range": [0, top]},
                       "yaxis": count_axis("solver runs", max(counts))}}


@dash.callback(Output(ids.EVENT_LOG, "data"), Output(ids.EVENT_LOG, "page_count"),
               Input(ids.TICK, "n_intervals"), Input(ids.EVENT_LOG, "page_current"))
def events(n, page):
    rows, total = context.history.events_page(page or 0, EVENTS_PAGE)
    for r in rows:
        r["time"] = sim_time(r["time"])
    return rows, max(1, -(-total // EVENTS_PAGE))
