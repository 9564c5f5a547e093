"""What each Dash callback input may hold, checked for every callback request before any
callback runs: a wrongly typed value (a list for a page number, a number for a grid key) is a
400 naming the input, never a 500 inside a callback. Every input and state of every callback
must have a rule here (tests/test_callback_inputs.py checks it), so a new callback cannot forget."""
from __future__ import annotations

import json
import math
from typing import Any, Callable

import flask

from . import ids

Rule = Callable[[Any], bool]
MAX_TEXT = 10_000


def _int(v: Any, lo: int = 0, hi: int = 2 ** 53) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def count(v: Any) -> bool:
    """n_clicks, n_intervals, n_submit, submit_n_clicks."""
    return v is None or _int(v)


def page(v: Any) -> bool:
    return v is None or _int(v, 0, 1_000_000)


def text(v: Any) -> bool:
    return v is None or (isinstance(v, str) and len(v) <= MAX_TEXT)


def field(v: Any) -> bool:
    """A form field: text, or a number where the input is numeric (its callback parses it)."""
    return text(v) or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def words(v: Any) -> bool:
    """A multi-choice dropdown: one choice or a list of them."""
    return text(v) or (isinstance(v, list) and len(v) <= 100 and all(isinstance(x, str) and len(x) <= 100 for x in v))


def sort_by(v: Any) -> bool:
    return v is None or (isinstance(v, list) and len(v) <= 20 and all(
        isinstance(s, dict) and isinstance(s.get("column_id"), str) and s.get("direction") in ("asc", "desc")
        for s in v))


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v))


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
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


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


def problem(payload: Any) -> str | None:
    """Why a callback request's inputs are refused, or None."""
    if not isinstance(payload, dict):
        return "send a JSON object"
    entries = []
    for part in ("inputs", "state"):
        items = payload.get(part, [])
        if not isinstance(items, list):
            return f"{part}: send a list"
        for item in items:
            entries += item if isinstance(item, list) else [item]
    for item in entries:
        if not isinstance(item, dict) or not isinstance(item.get("property"), str):
            return "every input needs an id and a property"
        cid = item.get("id")
        cid = cid if isinstance(cid, str) else json.dumps(cid, sort_keys=True)
        rule = rule_for(cid, item["property"])
        if rule is None:
            return f"{cid}.{item['property']}: no such callback input"
        if not rule(item.get("value")):
            return f"{cid}.{item['property']}: a value of the wrong type or out of range"
    return None


def check_callback_inputs():
    """Flask `before_request` for Dash's callback route."""
    request = flask.request
    if request.method != "POST" or not request.path.endswith("/_dash-update-component"):
        return None
    why = problem(request.get_json(silent=True))
    if why is None:
        return None
    resp = flask.jsonify({"error": why})
    resp.status_code = 400
    return resp


def register(server: flask.Flask) -> None:
    server.before_request(check_callback_inputs)
