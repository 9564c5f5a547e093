"""One grid update per pair of snapshots, shared by every viewer that holds the same snapshot
(issue 17, item 8): built once, the same object for every asker, a bounded number kept,
viewers at different snapshots each brought exactly to the current one, and the server sending
every viewer of a snapshot the same already-encoded answer."""
from __future__ import annotations

import copy
import json
import threading
import time
from types import SimpleNamespace

import dash
import flask
import pytest
from flask_compress import Compress

from app import context, gridserve, ids
from app.grid import CellCache
from app.gridserve import CALLBACK_PATH
from app.gridupdates import UpdateCache
from core.snapshot import BUSY, HELD, IDLE, Snapshot
from tests.support.files import ROOT

NAMES = tuple(f"a01n{i:02d}" for i in range(1, 19)) + tuple(f"a02n{i:02d}" for i in range(1, 19))


def test_the_same_pair_is_built_once_and_is_the_same_object():
    cache: UpdateCache = UpdateCache(keep=4)
    first = cache.get((2, "m", 1), lambda: {"ops": [1, 2]})
    again = cache.get((2, "m", 1), lambda: pytest.fail("built twice"))
    assert again is first and cache.builds == 1


def test_the_cache_keeps_only_the_most_recent_pairs():
    cache: UpdateCache = UpdateCache(keep=3)
    for seq in range(10):
        cache.get((seq, "m", seq - 1), lambda seq=seq: [seq])
    assert len(cache) == 3 and cache.builds == 10
    cache.get((7, "m", 6), lambda: pytest.fail("a kept pair built again"))
    cache.get((0, "m", -1), lambda: [0])
    assert cache.builds == 11 and len(cache) == 3, "an evicted pair is built again, and the size holds"


def test_concurrent_viewers_of_one_pair_share_one_build():
    cache: UpdateCache = UpdateCache()
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return object()

    got = []
    threads = [threading.Thread(target=lambda: got.append(cache.get((5, "m", 4), slow))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 8 and all(g is got[0] for g in got)


def test_a_failed_build_is_not_kept():
    cache: UpdateCache = UpdateCache()

    def broken():
        raise RuntimeError("no")
    with pytest.raises(RuntimeError):
        cache.get((1, "m", 0), broken)
    assert len(cache) == 0 and cache.get((1, "m", 0), lambda: "ok") == "ok"


def _snap(seq: int, held: set[int], busy: set[int]) -> Snapshot:
    state = tuple(HELD if i in held else BUSY if i in busy else IDLE for i in range(len(NAMES)))
    job_of = tuple("J1" if i in held else None for i in range(len(NAMES)))
    jobs = ({"id": "J1", "name": "resnet", "state": "running", "nodes": len(held)},) if held else ()
    return Snapshot(1000.0 + seq, seq, "running", NAMES, state, job_of, jobs, {},
                    tuple([1000.0] * len(NAMES)))


def _apply(fig: dict, patch) -> dict:
    """What Dash's renderer does with the grid's Patch (assignments only)."""
    fig = copy.deepcopy(fig)
    for op in patch.to_plotly_json()["operations"]:
        assert op["operation"] == "Assign"
        *path, last = op["location"]
        target = fig
        for k in path:
            target = target[k]
        target[last] = op["params"]["value"]
    return fig


@pytest.fixture
def viewers(monkeypatch):
    """grid_update against a harvester whose snapshot the test sets, with empty caches."""
    dash.Dash(__name__, use_pages=True, pages_folder=str(ROOT / "app" / "pages"))
    from app.pages.cluster import grid_update
    harvester = SimpleNamespace(snapshot=None)
    monkeypatch.setattr(context, "harvester", harvester)
    monkeypatch.setattr(context, "cells", CellCache())
    monkeypatch.setattr(context, "updates", UpdateCache())
    return harvester, grid_update


def test_viewers_at_different_snapshots_each_get_their_own_correct_update(viewers):
    harvester, grid_update = viewers
    figures, keys = {}, {}
    for seq, held, busy in ((1, set(), {0, 1}), (2, {2, 3}, {0}), (3, {2, 3, 4, 20}, {0, 30})):
        harvester.snapshot = _snap(seq, held, busy)
        figures[seq], keys[seq] = grid_update(None)       # a page loaded at this snapshot
    assert keys[3]["seq"] == 3
    harvester.snapshot = _snap(4, {4, 20, 21}, {0, 1, 30})
    now, _ = grid_update(None)
    builds = context.updates.builds

    from_1, key_a = grid_update(keys[1])
    from_2, key_b = grid_update(keys[2])
    assert key_a == key_b == {**keys[1], "seq": 4}
    assert from_1 is not from_2
    assert _apply(figures[1], from_1)["data"][0] == now["data"][0]
    assert _apply(figures[2], from_2)["data"][0] == now["data"][0]
    assert from_1.to_plotly_json()["operations"] != from_2.to_plotly_json()["operations"]

    again, key_c = grid_update(dict(keys[1]))             # another viewer holding snapshot 1
    assert again is from_1 and key_c == key_a
    assert context.updates.builds == builds + 2, "one build per pair, not per viewer"
    unknown = [grid_update({**keys[1], "seq": seq})[0] for seq in (10 ** 6, 10 ** 6 + 1)]
    assert unknown[0] is unknown[1], "snapshots the server does not keep share one whole resend"
    assert _apply(figures[1], unknown[0])["data"][0] == now["data"][0]
    assert grid_update(key_a) == (dash.no_update, dash.no_update), "a current viewer gets nothing"


def _grid_request(key) -> dict:
    return {"output": f"..{ids.GRID}.figure...{ids.GRID_KEY}.data..",
            "outputs": [{"id": ids.GRID, "property": "figure"}, {"id": ids.GRID_KEY, "property": "data"}],
            "inputs": [{"id": ids.TICK, "property": "n_intervals", "value": 3}],
            "changedPropIds": [f"{ids.TICK}.n_intervals"],
            "state": [{"id": ids.GRID_KEY, "property": "data", "value": key}]}


def test_the_server_sends_every_viewer_of_a_snapshot_the_same_encoded_answer(viewers):
    harvester, grid_update = viewers
    server = flask.Flask(__name__)
    gridserve.register(server)
    Compress(server)                    # as Dash's compress=True
    client = server.test_client()
    harvester.snapshot = _snap(1, set(), {0})
    first = client.post(CALLBACK_PATH, json=_grid_request(None))
    key = json.loads(first.data)["response"][ids.GRID_KEY]["data"]
    assert first.status_code == 200 and first.mimetype == "application/json"
    assert json.loads(first.data)["response"][ids.GRID]["figure"]["data"][0]["type"] == "heatmap"
    current = client.post(CALLBACK_PATH, json=_grid_request(key), headers={"Accept-Encoding": "zstd, gzip"})
    assert current.status_code == 204 and current.data == b"", "current: nothing to send"
    assert "Content-Encoding" not in current.headers, "an empty answer is not compressed into a non-empty one"

    harvester.snapshot = _snap(2, {2, 3}, {0})
    answers = [client.post(CALLBACK_PATH, json=_grid_request(dict(key))) for _ in range(3)]
    shared = context.updates.get((2, key["machine"], 1), lambda: pytest.fail("not built by the first viewer"))
    assert all(a.status_code == 200 and a.get_data(as_text=True) == shared.body for a in answers)
    body = json.loads(answers[0].data)["response"]
    assert body[ids.GRID_KEY]["data"] == {**key, "seq": 2}
    assert body[ids.GRID]["figure"]["operations"] == json.loads(
        json.dumps(shared.figure.to_plotly_json()["operations"])), "the answer carries the shared Patch"
    assert grid_update(key) == (shared.figure, shared.key), "Dash's own callback gives the same update"
    other = client.post(CALLBACK_PATH, json={**_grid_request(None), "output": "status-bar.children"})
    assert other.status_code == 404, "another callback is left to Dash"
