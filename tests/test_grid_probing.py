"""The grid's probing cells (app/grid.py): a lighter shade per job colour, a hover line that says
so, and patches that touch only the probing job's cells."""
from __future__ import annotations

from app.grid import (C_JOB0, C_PROBE0, JOB_COLOURS, N_CODES, PROBE_COLOURS, CellCache, ColourBook, cells_of,
                      colourscale, grid_patch, lighter)
from core.snapshot import BUSY, HELD, Snapshot


NAMES = [f"a01n{i:02d}" for i in range(1, 7)]


def snapshot(seq: int, probing=frozenset(), rescaling=frozenset()) -> Snapshot:
    jobs = ({"id": "J1", "name": "bert", "state": "running", "nodes": 3},
            {"id": "J2", "name": "vgg", "state": "running", "nodes": 2})
    return Snapshot(1000.0 + seq, seq, "running", tuple(NAMES), (BUSY, HELD, HELD, HELD, HELD, HELD),
                    (None, "J1", "J1", "J1", "J2", "J2"), jobs, {}, (1000.0,) * 6, frozenset(rescaling),
                    probing=frozenset(probing))


def test_probing_nodes_take_a_lighter_shade_and_say_so():
    book = ColourBook()
    c = cells_of(snapshot(1, probing={"J1"}), book)
    slot1, slot2 = book.slot("J1"), book.slot("J2")
    assert c.codes.tolist()[1:] == [C_PROBE0 + slot1] * 3 + [C_JOB0 + slot2] * 2
    assert all("probing: no sample at 3 nodes yet" in t and "bert (J1)" in t for t in c.text[1:4])
    assert not any("probing" in t for t in c.text[4:])
    # rescaling says more than probing: the job is paused, not measuring
    r = cells_of(snapshot(2, probing={"J1"}, rescaling={"J1"}), book)
    assert all(t.startswith("rescaling") for t in r.text[1:4])


def test_every_code_has_its_colour_and_a_probe_shade_is_lighter():
    scale = colourscale()
    assert len(scale) == 2 * N_CODES == 2 * (C_PROBE0 + len(JOB_COLOURS))
    assert [scale[2 * (C_PROBE0 + k)][1] for k in range(len(JOB_COLOURS))] == list(PROBE_COLOURS)
    for base, shade in zip(JOB_COLOURS, PROBE_COLOURS):
        assert sum(int(shade[k:k + 2], 16) for k in (1, 3, 5)) > sum(int(base[k:k + 2], 16) for k in (1, 3, 5))
    assert lighter("#000000", 0.5) == "#808080" and lighter("#1f77b4", 0.0) == "#1f77b4"


def test_a_probe_starting_patches_only_that_jobs_cells():
    cache = CellCache()
    lay = cache.layout(tuple(NAMES))
    before, during = cache.cells(snapshot(1)), cache.cells(snapshot(2, probing={"J2"}))
    ops = grid_patch(lay, before, during).to_plotly_json()["operations"]
    cells = {tuple(o["location"][3:]) for o in ops}
    assert len(ops) == 4 and cells == {(int(lay.row[i]), int(lay.col[i])) for i in (4, 5)}
