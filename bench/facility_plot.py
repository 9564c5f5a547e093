"""bench.facility's plot: the main jobs' start-delay CDF without and with the harvester, and the
slice's idle nodes against those pilots held and jobs used (see bench/facility.py)."""
from __future__ import annotations

from pathlib import Path

from bench.facility_report import delays_ms
from bench.facility_slice import Slice
from bench.facility_slurm import PassResult, log


def idle_over_time(sl: Slice) -> tuple[list[float], list[int]]:
    """The slice's idle node count as a step function of seconds after the clock started."""
    state = {n: st == "idle" for t, n, st in sl.lines if t < sl.start}
    xs, ys = [0.0], [sum(state.values())]
    for t, n, st in sl.lines:
        if t >= sl.start:
            state[n] = st == "idle"
            xs.append(t - sl.start)
            ys.append(sum(state.values()))
    xs.append(sl.window_s)
    ys.append(ys[-1])
    return xs, ys


def plot(sl: Slice, without: PassResult, with_: PassResult, r: dict, path: Path) -> Path:
    """Two panels: the main jobs' start delay CDF without and with the harvester, and the idle
    nodes of the slice against those pilots held and jobs used. An HTML file (plotly), and a PNG
    of it where Playwright and Chromium are installed (make test installs both)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "main-job start delay (trace time -> running)",
        f"idle nodes and what the harvester held ({r['nodes']} nodes, Slurm {r['slurm']})"))
    for name, res, colour in (("without the harvester", without, "#7f7f7f"), ("with the harvester", with_, "#d62728")):
        d = sorted(delays_ms(sl, res).values())
        fig.add_trace(go.Scatter(x=[v / 1000 for v in d], y=[(i + 1) / len(d) for i in range(len(d))],
                                 mode="lines", line_shape="hv", name=name, line_color=colour), 1, 1)
    xs, ys = idle_over_time(sl)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv", name="idle in the trace",
                             line_color="#000000", line_width=1), 1, 2)
    t = [x for x, _, _ in with_.samples]
    fig.add_trace(go.Scatter(x=t, y=[h for _, h, _ in with_.samples], mode="lines", name="held by pilots",
                             line_color="#1f77b4"), 1, 2)
    fig.add_trace(go.Scatter(x=t, y=[u for _, _, u in with_.samples], mode="lines", name="used by jobs",
                             line_color="#2ca02c", line_dash="dot"), 1, 2)
    fig.update_xaxes(title_text="seconds", row=1, col=1)
    fig.update_yaxes(title_text="share of main jobs", row=1, col=1)
    fig.update_xaxes(title_text=f"seconds of the played window (x{sl.compress:g})", row=1, col=2)
    fig.update_yaxes(title_text="nodes", row=1, col=2)
    fig.update_layout(width=1300, height=480, template="plotly_white", margin=dict(l=60, r=20, t=50, b=50))
    html = path.with_suffix(".html")
    fig.write_html(html, include_plotlyjs=True)
    try:
        from playwright.sync_api import sync_playwright
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"])
            page = b.new_page(viewport={"width": 1300, "height": 480})
            page.goto(html.resolve().as_uri())
            page.wait_for_selector(".main-svg")
            page.screenshot(path=str(path.with_suffix(".png")))
            b.close()
        return path.with_suffix(".png")
    except Exception as e:                 # no Playwright or Chromium here: the HTML stands
        log(f"no PNG ({e}); the plot is {html}")
        return html

