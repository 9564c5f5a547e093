"""The job page's scaling-curve chart and the line under it: the given curve when the profiler
is off, and what the profiler learned (measured points, fit and band, cap, probes) when it is on."""
from __future__ import annotations

import math
from typing import Optional

from .charts import count_step
from .format import duration, plotly_text, si, sim_time

GIVEN_COLOUR, FIT_COLOUR, BAND_COLOUR = "#5e81ac", "#3b5b92", "rgba(94, 129, 172, 0.22)"
MEASURED_COLOUR, USER_COLOUR, PROBE_COLOUR, NOW_COLOUR, CAP_COLOUR = (
    "#d08770", "#8c9440", "#b48ead", "#bf616a", "#4c566a")
#: the y axis stops at this much above the highest mean, measured or given point, so that a
#: wide band early on does not squash the curve; the band is cut at the top of the chart then
Y_HEADROOM = 1.3
#: names of the traces (the browser tests look for them)
BAND, FIT, MEASURED = "fit band (±2 sd, ~95 %)", "fit (in use up to the cap)", "measured"
GIVEN, PROBES = "given by the user", "probes"


def curve_figure(job, info: dict, measured: list[dict], profile: Optional[dict]) -> dict:
    """The profile's picture when there is one, else the curve the allocator uses as given."""
    if profile is None:
        return given_figure(job, info, measured)
    return learned_figure(job, info, profile)


#: px from the top of a curve chart to its legend: the title's line above it
TITLE_PX = 28


def _layout(job, title: str, shapes: list, annotations: list, y_top: Optional[float] = None) -> dict:
    """The title pinned to the top, the legend under it and above the plot (Plotly makes room for
    it there however many rows it wraps to; below the plot it ran into the "nodes" axis title).
    The learned chart is taller, for its longer legend."""
    yaxis = {"title": {"text": "samples/s"}}
    height = 280
    if y_top:
        yaxis["range"] = [0, y_top]
        height = 350
    return {"title": {"text": title, "font": {"size": 13}, "yref": "container", "y": 1, "yanchor": "top",
                      "pad": {"t": 8}},
            "height": height, "margin": {"l": 55, "r": 10, "t": TITLE_PX + 4, "b": 40},
            "legend": {"orientation": "h", "yref": "container", "yanchor": "top", "y": 1 - TITLE_PX / height,
                       "x": 0, "font": {"size": 11}},
            "xaxis": {"title": {"text": "nodes"}, "tick0": 0, "dtick": count_step(max(job.max_nodes, *job.curve.nodes)),
                      "tickformat": ",d"}, "yaxis": yaxis, "annotations": annotations,
            "shapes": [{"type": "rect", "xref": "x", "yref": "paper", "x0": 0, "x1": job.min_nodes,
                        "y0": 0, "y1": 1, "fillcolor": "#eceff4", "line": {"width": 0}, "layer": "below"},
                       *shapes]}


def given_figure(job, info: dict, measured: list[dict]) -> dict:
    """The curve the allocator uses, the measured points, and where the job is now."""
    top = max(job.max_nodes, max(job.curve.nodes))
    xs = list(range(0, top + 1, max(1, top // 200)))
    if xs[-1] != top:
        xs.append(top)
    data = [{"type": "scatter", "mode": "lines", "name": "curve in use", "x": xs,
             "y": [job.curve(x) if x >= job.min_nodes else 0 for x in xs], "line": {"color": GIVEN_COLOUR}},
            {"type": "scatter", "mode": "markers", "name": "given points", "x": list(job.curve.nodes),
             "y": list(job.curve.samples_per_second), "marker": {"color": GIVEN_COLOUR, "size": 7}}]
    if measured:
        data.append({"type": "scatter", "mode": "markers", "name": "measured",
                     "x": [m["nodes"] for m in measured], "y": [m["samples_per_second"] for m in measured],
                     "marker": {"color": MEASURED_COLOUR, "size": 9, "symbol": "diamond"}})
    n = info["nodes"]
    if n:
        data.append({"type": "scatter", "mode": "markers", "name": f"now: {_nodes(n)}", "x": [n],
                     "y": [job.curve(n)], "marker": {"color": NOW_COLOUR, "size": 14, "symbol": "star"}})
    return {"data": data, "layout": _layout(job, "Scaling curve", [], [])}


def _marker_size(weight: float) -> float:
    """Area grows with a point's weight (how many sample windows back it), within 6..22 px."""
    return max(6.0, min(22.0, 5.0 + 4.0 * math.sqrt(max(weight, 0.0))))


def _rate_at(profile: dict, n: int) -> Optional[float]:
    """The measured rate at `n` where there is one, else the fit's mean."""
    for m in profile["measured"]:
        if m["nodes"] == n:
            return m["samples_per_second"]
    fit = profile["fit"]
    if n in fit["nodes"]:
        return fit["mean"][fit["nodes"].index(n)]
    return None


def learned_figure(job, info: dict, profile: dict) -> dict:
    """Measured points sized by weight, the fit with its band, the user's curve if any, the
    evidence cap, the probes and the current size."""
    fit, measured, given = profile["fit"], profile["measured"], profile["given"]
    ns = fit["nodes"]
    data = [
        {"type": "scatter", "mode": "lines", "name": "band low", "x": ns, "y": fit["lo"], "showlegend": False,
         "hoverinfo": "skip", "line": {"width": 0, "color": BAND_COLOUR}},
        {"type": "scatter", "mode": "lines", "name": BAND, "x": ns, "y": fit["hi"], "fill": "tonexty",
         "fillcolor": BAND_COLOUR, "line": {"width": 0, "color": BAND_COLOUR}, "hoverinfo": "skip"},
        {"type": "scatter", "mode": "lines", "name": FIT, "x": ns, "y": fit["mean"],
         "customdata": [[lo, hi] for lo, hi in zip(fit["lo"], fit["hi"])],
         "hovertemplate": "%{x} nodes: fit %{y:,.0f} samples/s<br>band %{customdata[0]:,.0f}"
                          " – %{customdata[1]:,.0f}<extra></extra>",
         "line": {"color": FIT_COLOUR, "width": 2}},
    ]
    if given:
        data.append({"type": "scatter", "mode": "lines+markers", "name": GIVEN, "x": given["nodes"],
                     "y": given["samples_per_second"], "line": {"color": USER_COLOUR, "dash": "dash", "width": 1.5},
                     "marker": {"color": USER_COLOUR, "size": 7, "symbol": "square"},
                     "hovertemplate": "%{x} nodes: given %{y:,.0f} samples/s<extra></extra>"})
    if measured:
        data.append({"type": "scatter", "mode": "markers", "name": MEASURED,
                     "x": [m["nodes"] for m in measured], "y": [m["samples_per_second"] for m in measured],
                     "customdata": [[m["weight"], m["sd_pct"]] for m in measured],
                     "hovertemplate": "%{x} nodes: %{y:,.0f} samples/s<br>weight %{customdata[0]:.1f}"
                                      " · sd %{customdata[1]:.1f} %<extra></extra>",
                     "marker": {"color": MEASURED_COLOUR, "size": [_marker_size(m["weight"]) for m in measured],
                                "symbol": "diamond", "line": {"width": 1, "color": "#ffffff"}}})
    probes = [p for p in profile["probes"] if _rate_at(profile, p["nodes"]) is not None]
    if probes:
        data.append({"type": "scatter", "mode": "markers", "name": PROBES,
                     "x": [p["nodes"] for p in probes], "y": [_rate_at(profile, p["nodes"]) for p in probes],
                     "text": [f'{sim_time(p["time"])}<br>{_wrap(plotly_text(p["why"]))}' for p in probes],
                     "hovertemplate": "%{x} nodes, probe<br>%{text}<extra></extra>",
                     "marker": {"color": "rgba(0,0,0,0)", "size": 16, "symbol": "circle",
                                "line": {"width": 2, "color": PROBE_COLOUR}}})
    n = info["nodes"]
    if n:
        label = f"now: {_nodes(n)}" + (" (probing)" if profile.get("probing") else "")
        data.append({"type": "scatter", "mode": "markers", "name": label, "x": [n], "y": [_rate_at(profile, n)],
                     "marker": {"color": NOW_COLOUR, "size": 14, "symbol": "star"}})
    tops = [*fit["mean"], *(m["samples_per_second"] for m in measured), *(given["samples_per_second"] if given else ())]
    y_top = Y_HEADROOM * max(tops) if tops and max(tops) > 0 else None
    cap = profile["cap"]
    shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": cap, "x1": cap, "y0": 0, "y1": 1,
               "line": {"color": CAP_COLOUR, "width": 1.5, "dash": "dot"}}]
    right = cap >= 0.6 * max(ns or [cap])
    annotations = [{"x": cap, "xref": "x", "y": 1, "yref": "paper", "text": f"evidence cap {cap}",
                    "showarrow": False, "xanchor": "right" if right else "left", "xshift": -4 if right else 4,
                    "yanchor": "top", "font": {"size": 11, "color": CAP_COLOUR}, "bgcolor": "rgba(255,255,255,0.8)"}]
    return {"data": data, "layout": _layout(job, "Scaling curve (learned)", shapes, annotations, y_top)}


def _wrap(text: str, width: int = 70) -> str:
    """Hover boxes do not wrap by themselves: break the probe's reason into lines."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "<br>".join([*lines, line] if line else lines)


def _number(x: Optional[float]) -> str:
    """Model parameters span many decades (kappa 1e-6, sigma 0.003): three significant digits."""
    if x is None:
        return "–"
    return "0" if x == 0 else f"{x:.3g}"


def profile_line(profile: dict) -> str:
    """Learned rescale costs (and from how many pauses), the model and its parameters, the peak,
    confidence and uncertainty, in one line."""
    fit, pauses = profile["fit"], profile["pauses"]
    costs = (f'learned rescale cost: grow {_seconds(profile["scale_up_seconds"])} '
             f'({_pauses(pauses.get("up", 0))}), shrink {_seconds(profile["scale_down_seconds"])} '
             f'({_pauses(pauses.get("down", 0))})')
    model = str(fit.get("model", "")).upper()
    params = f'σ {_number(fit.get("sigma"))}, κ {_number(fit.get("kappa"))}'
    if fit.get("lam") is not None:
        params += f', λ {si(fit["lam"])} samples/s per node'
    peak = fit.get("peak")
    top = fit["nodes"][-1] if fit.get("nodes") else None
    peak_text = (f"fastest at {_nodes(peak)}" + (" (still rising at its largest size)" if peak == top else "")
                 if peak else "no peak")
    spread = profile.get("uncertainty_pct")
    conf = f'confidence {profile["confidence"]}' + (f" (±{spread:.1f} % up to the cap)" if spread is not None else "")
    parts = [costs, f"{model} model: {params}", peak_text, f'evidence cap {profile["cap"]}', conf]
    if profile.get("probing"):
        parts.append(f'probing: no sample at {_nodes(profile["size"])} yet')
    return " · ".join(parts)


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _seconds(x: Optional[float]) -> str:
    """Learned pauses are fractions of a second on real workers and tens of seconds in replay."""
    if x is None or x < 0:
        return "–"
    if x < 1:
        return f"{x:.2f} s"
    return f"{x:.1f} s" if x < 120 else duration(x)


def _pauses(k: int) -> str:
    if k == 0:
        return "no pause measured yet"
    return f"{k} pause{'s' if k != 1 else ''} measured"


#: how the table names each kind of run at a size the job had no sample at
KINDS = {"probe": "probe", "climb": "climb past the cap", "back": "back after a probe", "try": "allocator's choice"}


def probes_title(profile: Optional[dict]) -> str:
    k = len(profile["probes"]) if profile else 0
    return f"Probes and untried sizes ({k})" if k else "Probes: none so far"


def probe_rows(profile: Optional[dict]) -> list[dict]:
    """The job's probes and first runs at untried sizes, newest first."""
    if not profile:
        return []
    return [{"time": sim_time(p["time"]), "nodes": p["nodes"], "kind": KINDS.get(p.get("kind"), p.get("kind")),
             "why": p["why"]} for p in reversed(profile["probes"])]
