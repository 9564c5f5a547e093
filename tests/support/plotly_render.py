"""Draw one Plotly figure (a dict, as a page's callback returns it) in the browser, with the
plotly.js the dashboard serves, at a given size, and measure what it drew: no server needed."""
from __future__ import annotations

import json
from pathlib import Path

import plotly

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

#: the bounding boxes (x, y, width, height) of the parts of a chart that must not overlap
PARTS_JS = """() => {
  const box = sel => [...document.querySelectorAll(sel)].map(e => {
    const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })
    .filter(b => b[2] > 0 && b[3] > 0);
  return {legend: box('.legend .bg'), xtitle: box('.g-xtitle text'), ytitle: box('.g-ytitle text'),
          title: box('.g-gtitle text'), xticks: box('.xaxislayer-above .xtick text'),
          plot: box('.nsewdrag'), annotations: box('.annotation-text-g')};
}"""


def draw(page, figure: dict, width: int, height: int | None = None) -> dict:
    """Render `figure` into a `width` px wide div on `page`; the bounding boxes of its parts."""
    page.set_content(f'<html><body style="margin:0"><div id="g" style="width:{width}px"></div></body></html>')
    page.add_script_tag(path=str(PLOTLY_JS))
    layout = dict(figure.get("layout", {}), width=width, **({"height": height} if height else {}))
    page.evaluate("([data, layout]) => Plotly.newPlot('g', data, layout, {displayModeBar: false})",
                  [json.loads(json.dumps(figure.get("data", []))), json.loads(json.dumps(layout))])
    return page.evaluate(PARTS_JS)


def overlap(a: list[float], b: list[float]) -> bool:
    """Whether two boxes (x, y, width, height) share any area."""
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]
