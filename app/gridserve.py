"""The cluster page's grid update, built and encoded once per pair of snapshots and sent as is
to every viewer that holds the same snapshot.

Each browser on the cluster page asks for the grid once a second with the key of the snapshot it
holds. The update from that snapshot to the current one (a per-cell Patch, or the whole figure
for a new page) is built once per pair and kept in `context.updates`, together with Dash's JSON
answer that carries it. A Flask `before_request` answers the grid callback with that JSON
directly, so a viewer costs neither a diff nor an encoding of its own; it runs after the body
depth, cross-site and callback input checks (registered after them in web.create_app), and the
answer still gets the security headers and compression of every response. The page's Dash
callback (app/pages/cluster.py) stays registered, since the browser's Dash renderer only asks
for outputs it knows a callback of, and gives the same update where this hook is not installed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import flask
from plotly.io.json import to_json_plotly

from core.snapshot import Snapshot

from . import context, ids
from .grid import grid_figure, grid_patch

CALLBACK_PATH = "/_dash-update-component"
#: how Dash names the grid callback's outputs in a request
CALLBACK_OUTPUT = f"..{ids.GRID}.figure...{ids.GRID_KEY}.data.."
#: `since` for a browser that needs the whole figure (no key, or another node list)
FIGURE = "figure"


@dataclass(frozen=True)
class GridUpdate:
    """One update: the figure or Patch, the key the browser keeps, and Dash's answer with both."""

    figure: Any
    key: dict
    body: str


def current_update(key: Optional[dict]) -> Optional[GridUpdate]:
    """The update from the snapshot `key` names to the current one, or None when the browser
    is current (or there is nothing to show yet)."""
    snap = context.harvester.snapshot
    if not snap.nodes:
        return None
    if key and key.get("boot") == context.BOOT and key.get("seq") == snap.seq:
        return None
    machine = context.cells.machine_id(snap.nodes)
    if not key or key.get("machine") != machine:
        since: Any = FIGURE                                # another node list: a new layout
    elif key.get("boot") != context.BOOT or context.cells.get(key.get("seq")) is None:
        since = None          # another process's snapshot, or one no longer kept: whole z and text
    else:
        since = key.get("seq")
    return context.updates.get((snap.seq, machine, since), lambda: _build(snap, machine, since))


def _build(snap: Snapshot, machine: str, since: Any) -> GridUpdate:
    cache = context.cells
    lay = cache.layout(snap.nodes)
    new = cache.cells(snap)
    key = {"boot": context.BOOT, "seq": snap.seq, "machine": machine}
    if since == FIGURE:
        figure: Any = grid_figure(lay, snap.nodes, new)
    else:
        figure = grid_patch(lay, cache.get(since) if since is not None else None, new)
    body = to_json_plotly({"multi": True, "response": {ids.GRID: {"figure": figure}, ids.GRID_KEY: {"data": key}}})
    return GridUpdate(figure, key, body)


def _key_of(payload: dict) -> Optional[dict]:
    """The grid-key the browser sent (its type already checked by app/callback_inputs.py)."""
    for item in payload.get("state") or []:
        if isinstance(item, dict) and item.get("id") == ids.GRID_KEY and item.get("property") == "data":
            value = item.get("value")
            return value if isinstance(value, dict) else None
    return None


def answer_grid_callback() -> Optional[flask.Response]:
    """Flask `before_request`: the grid callback answered from the shared update (204 when the
    browser is current, as Dash answers a callback that changes nothing); anything else passes."""
    request = flask.request
    if request.method != "POST" or not request.path.endswith(CALLBACK_PATH):
        return None
    payload = request.get_json(silent=True)
    if not isinstance(payload, dict) or payload.get("output") != CALLBACK_OUTPUT:
        return None
    update = current_update(_key_of(payload))
    if update is None:           # an empty body, as Dash's: Flask-Compress leaves it alone
        return flask.Response("", status=204)
    return flask.Response(update.body, mimetype="application/json")


def register(server: flask.Flask) -> None:
    server.before_request(answer_grid_callback)
