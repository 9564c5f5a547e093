"""What each Dash callback input may hold, checked for every callback request before any
callback runs: a wrongly typed value (a list for a page number, a number for a grid key, an
integer too large for a float) is a 400 naming the input, never a 500 inside a callback; so is
a request whose inputs and state are not those of the server-side callback its output names
(an unknown component id would otherwise reach the callback under another's rule). Every input
and state of every callback must have a rule here (tests/test_input_guards.py checks it), so a
new callback cannot forget; tests/test_callback_fuzz.py drives every callback with all of it."""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping, Optional

import dash
import flask

from . import ids

Rule = Callable[[Any], bool]
MAX_TEXT = 10_000
#: the largest integer a number field can hold: a browser's JSON.stringify writes larger numbers
#: with an exponent (a float); a larger one in JSON is made by hand, and too large for a float
MAX_INT = 10 ** 21


def _int(v: Any, lo: int = 0, hi: int = 2 ** 53) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _finite(v: Any) -> bool:
    """A number a browser sends: a finite float, or an integer within MAX_INT (math.isfinite
    of a larger one raises OverflowError)."""
    if isinstance(v, float):
        return math.isfinite(v)
    return _int(v, -MAX_INT, MAX_INT)


def count(v: Any) -> bool:
    """n_clicks, n_intervals, n_submit, submit_n_clicks."""
    return v is None or _int(v)


def page(v: Any) -> bool:
    return v is None or _int(v, 0, 1_000_000)


def text(v: Any) -> bool:
    return v is None or (isinstance(v, str) and len(v) <= MAX_TEXT)


def field(v: Any) -> bool:
    """A form field: text, or a number where the input is numeric (its callback parses it)."""
    return text(v) or _finite(v)


def words(v: Any) -> bool:
    """A multi-choice dropdown: one choice or a list of them."""
    return text(v) or (isinstance(v, list) and len(v) <= 100 and all(isinstance(x, str) and len(x) <= 100 for x in v))


def sort_by(v: Any) -> bool:
    return v is None or (isinstance(v, list) and len(v) <= 20 and all(
        isinstance(s, dict) and isinstance(s.get("column_id"), str) and s.get("direction") in ("asc", "desc")
        for s in v))


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, str)) or _finite(v)


def _record(**rules: Rule) -> Rule:
    """A dcc.Store the page itself writes: None, or a dict with these keys (each optional) and
    any other key holding a plain value."""
    def check(v: Any) -> bool:
        return v is None or (isinstance(v, dict) and len(v) <= 20 and
                             all(rules.get(k, _scalar)(x) for k, x in v.items()))
    return check


def path(v: Any) -> bool:
    """A location's path: "/..." (Dash's router takes nothing else)."""
    return isinstance(v, str) and v.startswith("/") and len(v) <= 2000


def _number(v: Any) -> bool:
    return v is None or _finite(v)


def _between(lo: float, hi: float) -> Rule:
    return lambda v: _number(v) and (v is None or lo <= v <= hi)


BY_PROPERTY: dict[str, Rule] = {"n_clicks": count, "n_intervals": count, "n_submit": count, "submit_n_clicks": count,
                                "page_current": page, "sort_by": sort_by, "pathname": path, "value": field}
BY_INPUT: dict[tuple[str, str], Rule] = {
    (ids.GRID_KEY, "data"): _record(boot=text, seq=lambda v: _int(v), machine=text),
    (ids.TL_KEY, "data"): _record(boot=text, t0=_number, t=_number),
    (ids.JOB_ID, "data"): text,
    (ids.RP_PENDING, "data"): count,
    (ids.RP_SPEED, "value"): _between(-1, 5),                       # log10 of the speed
    (ids.RP_SPEED_BOX, "value"): _between(0, 1e9),                  # snapped to the nearest mark                                # 1 while a new run loads
    (ids.JOBS_STATE, "value"): words,
    (ids.JOBS_CURVE, "value"): words,
    (ids.JOBS_SEARCH, "value"): text,
    (ids.LOGIN_USER, "value"): text,
    (ids.LOGIN_PASSWORD, "value"): text,
    ("_pages_location", "search"): text,                          # Dash pages' router
    ("_pages_store", "data"): lambda v: v is None or isinstance(v, dict),
}


def rule_for(component: str, prop: str) -> Rule | None:
    return BY_INPUT.get((component, prop)) or (BY_PROPERTY.get(prop) if prop != "data" else None)


def _entries(payload: dict) -> tuple[list, list] | str:
    """The request's inputs and its state, each flattened (a wildcard input sends a list), or
    why they cannot be read."""
    out = []
    for part in ("inputs", "state"):
        items = payload.get(part, [])
        if not isinstance(items, list):
            return f"{part}: send a list"
        flat: list = []
        for item in items:
            flat += item if isinstance(item, list) else [item]
        out.append(flat)
    return out[0], out[1]


def _not_its_callbacks(payload: dict, inputs: list, state: list, callbacks: Mapping[str, dict]) -> Optional[str]:
    """Why the inputs and state are not those of the server-side callback `output` names (a
    callback with wildcard ids is left to the rules: its ids are made in the browser)."""
    output = payload.get("output")
    cb = callbacks.get(output) if isinstance(output, str) else None
    if cb is None or cb.get("callback") is None:
        return "no such callback on this server"
    if "{" not in output and _sent_outputs(payload.get("outputs")) != _outputs_of(output):
        return f"outputs: not those of the callback of {output[:200]}"
    for part, sent in (("inputs", inputs), ("state", state)):
        want = [(i["id"], i["property"]) for i in cb.get(part, [])]
        if any(not isinstance(cid, str) for cid, _ in want):
            return None
        if [(e.get("id"), e["property"]) for e in sent] != want:
            return f"{part}: not those of the callback of {output[:200]}"
    return None


def _outputs_of(output: str) -> list[tuple[str, str]]:
    """A callback's outputs from Dash's key for it ("id.prop", or "..id.prop...id.prop.."),
    without the "@hash" of an output that allows duplicates (the browser sends it or not)."""
    parts = output[2:-2].split("...") if output.startswith("..") else [output]
    return [(cid, prop.split("@")[0]) for cid, prop in (part.rsplit(".", 1) for part in parts if "." in part)]


def _sent_outputs(outputs: Any) -> Optional[list[tuple[Any, Any]]]:
    items = outputs if isinstance(outputs, list) else [outputs]
    if not all(isinstance(o, dict) for o in items):
        return None
    return [(o.get("id"), o["property"].split("@")[0] if isinstance(o.get("property"), str) else None)
            for o in items]


def problem(payload: Any, callbacks: Optional[Mapping[str, dict]] = None) -> str | None:
    """Why a callback request's inputs are refused, or None; with `callbacks` (Dash's
    callback_map), also inputs and state that are not the named callback's own."""
    if not isinstance(payload, dict):
        return "send a JSON object"
    entries = _entries(payload)
    if isinstance(entries, str):
        return entries
    for item in entries[0] + entries[1]:
        if not isinstance(item, dict) or not isinstance(item.get("property"), str):
            return "every input needs an id and a property"
        cid = item.get("id")
        cid = cid if isinstance(cid, str) else json.dumps(cid, sort_keys=True)
        rule = rule_for(cid, item["property"])
        if rule is None:
            return f"{cid}.{item['property']}: no such callback input"
        if not rule(item.get("value")):
            return f"{cid}.{item['property']}: a value of the wrong type or out of range"
    return None if callbacks is None else _not_its_callbacks(payload, *entries, callbacks)


def check_callback_inputs(callbacks: Optional[Mapping[str, dict]] = None):
    """Flask `before_request` for Dash's callback route."""
    request = flask.request
    if request.method != "POST" or not request.path.endswith("/_dash-update-component"):
        return None
    why = problem(request.get_json(silent=True), callbacks)
    if why is None:
        return None
    resp = flask.jsonify({"error": why})
    resp.status_code = 400
    return resp


def register(app: dash.Dash) -> None:
    """After Dash's own setup hook, which fills app.callback_map at the first request."""
    app.server.before_request(lambda: check_callback_inputs(app.callback_map))
