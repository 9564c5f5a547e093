"""The node grid: layout as the machine is built, colours, and that every update brings a
browser's figure exactly to the current snapshot (applying the Patch operations as Dash does)."""
from __future__ import annotations

import copy
import gzip
import json
import random

import numpy as np
import pytest

from app.grid import (C_BUSY, C_IDLE, C_JOB0, C_RESCALE, PATCH_LIMIT, CellCache, ColourBook, cells_of,
                      grid_figure, grid_patch, make_layout)
from core.replay import DEFAULT_NODE_LIST
from core.snapshot import BUSY, HELD, IDLE, Snapshot
from core.sources.trace import read_node_list
from tests.support.files import ROOT
from tests.support.waiting import wait


def apply_patch(fig: dict, patch) -> dict:
    """Dash's client-side Patch semantics for the operations the grid uses."""
    fig = copy.deepcopy(fig)
    for op in patch.to_plotly_json()["operations"]:
        *path, last = op["location"]
        target = fig
        for k in path:
            target = target[k]
        if op["operation"] == "Assign":
            target[last] = op["params"]["value"]
        elif op["operation"] == "Extend":
            target[last].extend(op["params"]["value"])
        else:
            raise AssertionError(f"unexpected operation {op['operation']}")
    return fig


def snap(names, state, job_of, seq, since=None, rescaling=()):
    jobs = tuple({"id": j, "name": f"model-{j}", "state": "running"} for j in sorted({x for x in job_of if x}))
    return Snapshot(1000.0 + seq, seq, "running", tuple(names), tuple(state), tuple(job_of), jobs, {},
                    tuple(since or [1000.0] * len(names)), frozenset(rescaling))


def test_summit_layout_is_racks_as_built_and_wide():
    names = read_node_list(DEFAULT_NODE_LIST)
    assert len(names) == 4734
    lay = make_layout(names)
    assert lay.kind == "racks"
    cells = set(zip(lay.row.tolist(), lay.col.tolist()))
    assert len(cells) == 4734, "two nodes share a cell"
    assert lay.cols > 2 * lay.rows, "a wall-screen grid is wider than tall"
    i, j = names.index("a01n01"), names.index("a01n18")
    assert lay.row[i] == lay.row[names.index("a01n02")] and lay.col[i] + 1 == lay.col[names.index("a01n02")]
    assert lay.row[j] > lay.row[i], "a rack's nodes stack in its own block"
    assert lay.col[names.index("a02n01")] > lay.col[i] + 2, "racks sit side by side with a gap"
    assert lay.row[names.index("b01n01")] > lay.row[j], "row letters are bands"
    assert [s for s in lay.labels if s] == sorted({n[0] for n in names})


def test_other_names_fall_back_to_a_compact_grid():
    names = [f"node-{i}" for i in range(100)]
    lay = make_layout(names)
    assert lay.kind == "compact"
    assert len(set(zip(lay.row.tolist(), lay.col.tolist()))) == 100
    assert lay.rows * lay.cols >= 100 and lay.cols >= lay.rows


def test_cells_colour_busy_idle_job_and_rescaling():
    names = ["a01n01", "a01n02", "a01n03", "a01n04"]
    s = snap(names, [BUSY, IDLE, HELD, HELD], [None, None, "J1", "J2"], 1, rescaling={"J2"})
    book = ColourBook()
    c = cells_of(s, book)
    assert c.codes.tolist() == [C_BUSY, C_IDLE, C_JOB0 + book.slot("J1"), C_RESCALE]
    assert "busy" in c.text[0] and "idle" in c.text[1] and "model-J1" in c.text[2] and "rescaling" in c.text[3]


def test_colour_book_never_gives_two_running_jobs_one_colour():
    book = ColourBook()
    live = [f"J{i}" for i in range(10)]
    slots = {book.slot(j) for j in live}
    assert len(slots) == 10
    book.release_except(set(live[5:]))
    new = [book.slot(f"K{i}") for i in range(5)]
    assert not set(new) & {book.slot(j) for j in live[5:]}
    assert book.slot("J7") == book.slot("J7")


@pytest.mark.parametrize("changes", [0, 1, 25, PATCH_LIMIT + 1, 4000])
def test_patch_brings_the_figure_exactly_to_the_new_snapshot(changes):
    rng = random.Random(changes)
    names = read_node_list(DEFAULT_NODE_LIST)
    cache = CellCache()
    lay = cache.layout(tuple(names))
    state = [rng.choice([BUSY, BUSY, IDLE]) for _ in names]
    owner = [None] * len(names)
    for i, s in enumerate(state):
        if s == IDLE and rng.random() < 0.5:
            state[i], owner[i] = HELD, f"J{rng.randrange(8)}"
    old = snap(names, state, owner, 1)
    fig = grid_figure(lay, names, cache.cells(old))
    state2, owner2, since2 = list(state), list(owner), [1000.0] * len(names)
    for i in rng.sample(range(len(names)), changes):
        state2[i] = rng.choice([BUSY, IDLE, HELD])
        owner2[i] = f"J{rng.randrange(12)}" if state2[i] == HELD else None
        since2[i] = 2000.0
    new = snap(names, state2, owner2, 2, since2)
    patch = grid_patch(lay, cache.get(1), cache.cells(new))
    got = apply_patch(fig, patch)
    want = grid_figure(lay, names, cache.cells(new))
    assert got["data"][0]["z"] == want["data"][0]["z"]
    assert got["data"][0]["text"] == want["data"][0]["text"]
    ops = patch.to_plotly_json()["operations"]
    body = json.dumps(patch.to_plotly_json()).encode()
    if changes <= PATCH_LIMIT:
        assert len(ops) <= 2 * changes, "only changed cells are sent"
        assert len(body) < 150_000
    assert len(gzip.compress(body)) < 150_000, "the server compresses responses (Dash compress=True)"


def test_unknown_browser_state_gets_whole_z_and_text():
    names = [f"r{r:02d}n{n:02d}" for r in range(3) for n in range(4)]
    cache = CellCache()
    lay = cache.layout(tuple(names))
    s = snap(names, [IDLE] * 12, [None] * 12, 5)
    ops = grid_patch(lay, None, cache.cells(s)).to_plotly_json()["operations"]
    assert [o["location"] for o in ops] == [["data", 0, "z"], ["data", 0, "text"]]
    z = np.array(ops[0]["params"]["value"], dtype=float)
    assert np.nansum(z == C_IDLE) == 12


def _as_javascript_keeps_it(value):
    """What a browser sends back: every JSON number becomes a double."""
    if isinstance(value, dict):
        return {k: _as_javascript_keeps_it(v) for k, v in value.items()}
    if isinstance(value, int) and not isinstance(value, bool):
        return int(float(value))
    return value


def test_a_browser_key_leads_to_a_patch_not_a_whole_figure(tmp_path, small_trace, small_jobs):
    """Regression: a 64-bit hash in the key was rounded by JavaScript, so every update was a
    whole figure. The key must survive the browser's number type."""
    import dash
    from dash import Patch

    from app import context
    from core.assemble import build
    from core.settings import HarvesterSettings
    dash.Dash(__name__, use_pages=True, pages_folder=str(ROOT / "app" / "pages"))
    from app.pages.cluster import grid_update
    h = build(HarvesterSettings.parse({"db": tmp_path / "g.db", "speed": 3600, "tick_s": 0.05, "replay": {
        "trace": small_trace, "jobs": small_jobs, "hours": 10, "config": {"tfwd": 600}}}))
    h.open()
    context.harvester = h
    try:
        fig, key = grid_update(None)
        assert isinstance(fig, dict) and fig["data"][0]["type"] == "heatmap"
        seq = key["seq"]
        wait(lambda: h.snapshot.seq > seq, 10.0, "a newer snapshot", period=0.02)
        update, key2 = grid_update(_as_javascript_keeps_it(key))
        assert isinstance(update, Patch) and key2["seq"] > seq
    finally:
        h.close()
        context.harvester = None
