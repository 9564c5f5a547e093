"""No tracebacks and no 5xx from input (issue 17, item 6): JSON nested too deep is a 400 on every
route, and every Dash callback's inputs are checked for type before it runs. Against the real
server; the routes and callbacks are read from the app itself, so a new one is covered too."""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from app import callback_inputs
from app.auth import Users
from app.format import short_time, sim_time
from app.jsondepth import MAX_DEPTH, depth
from tests.support.server import start_app

DEEP = b"[" * 5000 + b"]" * 5000
DEEP_OBJECT = b'{"a":' * 3000 + b"1" + b"}" * 3000


def test_depth_counts_brackets_outside_strings():
    assert depth(b'{"a": [1, {"b": "[[[[[["}]}') == 3
    assert depth(b'"\\"[[[["') == 0 and depth(b"42") == 0 and depth(DEEP) == 5000


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    a = start_app(tmp_path_factory.mktemp("guards"), "--dispatch", "simulated", "--local-nodes", "4",
                  "--tick", "0.1")
    yield a
    a.stop()


def _routes() -> list[tuple[str, str]]:
    """(method, path) of every route of the app, placeholders filled in."""
    from core.service.base import Harvester
    from app.web import create_app
    db = Path(tempfile.mkdtemp()) / "x.db"
    users, _ = Users.demo(db)
    server = create_app(Harvester(db, 0.5), users).server
    out = []
    for rule in server.url_map.iter_rules():
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", "x", rule.rule)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            out.append((method, path))
    return out


def test_deep_json_is_a_400_on_every_route(app):
    token = app.token("staff1")
    routes = _routes()
    assert ("POST", "/api/jobs") in routes and ("POST", "/_dash-update-component") in routes
    assert ("POST", "/api/workers/x/report") in routes and ("POST", "/api/token") in routes
    for method, path in routes:
        for body in (DEEP, DEEP_OBJECT):
            status, answer = app.request(method, path, raw=body, token=token)
            assert status == 400, (method, path, status, answer)
            assert f"nested deeper than {MAX_DEPTH}" in answer["error"]
    status, _ = app.request("POST", "/api/jobs", raw=b"[" * MAX_DEPTH + b"]" * MAX_DEPTH, token=token)
    assert status == 400                       # within the limit: the route's own answer
    assert app.get("/api/health")[0] == 200 and app.proc.poll() is None


def _callbacks(app) -> list[dict]:
    status, deps = app.get("/_dash-dependencies")
    assert status == 200
    return deps


def test_every_callback_input_has_a_rule(app):
    missing = [f"{i['id']}.{i['property']}" for cb in _callbacks(app) for i in cb["inputs"] + cb["state"]
               if callback_inputs.rule_for(i["id"], i["property"]) is None]
    assert missing == []


WRONG = [{"x": 1}, [1, 2], "text", -1, 1.5, 1e308, 2 ** 70, True, [[["deep"]]], {"seq": "x", "boot": 1}]


#: a well-typed value of each property, for the inputs a test does not set
GOOD = {"n_intervals": 1, "n_clicks": 1, "n_submit": 1, "submit_n_clicks": 1, "page_current": 0, "sort_by": [], "pathname": "/",
        "search": ""}


def _payload(cb: dict, values: dict) -> dict:
    def entry(i: dict) -> dict:
        key = (i["id"], i["property"])
        return {"id": i["id"], "property": i["property"],
                "value": values[key] if key in values else GOOD.get(i["property"])}
    outputs = [dict(zip(("id", "property"), o.rsplit(".", 1))) for o in cb["output"].strip(".").split("...")]
    first = cb["inputs"][0]
    return {"output": cb["output"], "outputs": outputs if len(outputs) > 1 else outputs[0],
            "inputs": [entry(i) for i in cb["inputs"]], "state": [entry(i) for i in cb["state"]],
            "changedPropIds": [f"{first['id']}.{first['property']}"]}


def test_no_callback_answers_5xx_to_wrongly_typed_inputs(app):
    """Each input of each callback in turn gets each wrong value (the others None): a 400 from
    the check or the callback's own answer, never a 5xx; well-typed input still works."""
    answered = 0
    for cb in _callbacks(app):
        if cb.get("clientside_function"):
            continue   # runs in the browser, never asks the server
        for i in cb["inputs"] + cb["state"]:
            for value in WRONG:
                status, body = app.request("POST", "/_dash-update-component",
                                           _payload(cb, {(i["id"], i["property"]): value}))
                assert status < 500, (cb["output"], i, value, status, str(body)[:300])
                answered += 1
    assert answered > 200
    status, body = app.request("POST", "/_dash-update-component", _payload(
        {"output": "..jobs-table.data...jobs-table.page_count...jobs-count.children..",
         "inputs": [{"id": "tick", "property": "n_intervals"}, {"id": "jobs-filter-state", "property": "value"},
                    {"id": "jobs-filter-search", "property": "value"}, {"id": "jobs-table", "property": "sort_by"},
                    {"id": "jobs-table", "property": "page_current"}, {"id": "jobs-filter-curve", "property": "value"}],
         "state": []}, {("jobs-table", "page_current"): [1]}))
    assert status == 400 and body["error"] == "jobs-table.page_current: a value of the wrong type or out of range"


def test_grid_key_of_the_wrong_shape_is_refused_and_a_good_one_works(app):
    cb = next(c for c in _callbacks(app) if "grid-key.data" in c["output"])
    for key in ({"boot": "b", "machine": "m", "seq": [1]}, {"seq": 1, "extra": [2]}, 5, "key"):
        status, body = app.request("POST", "/_dash-update-component", _payload(cb, {("grid-key", "data"): key}))
        assert status == 400 and body["error"].startswith("grid-key.data"), body
    status, body = app.request("POST", "/_dash-update-component", _payload(
        cb, {("grid-key", "data"): {"boot": "old", "seq": 3, "machine": "m"}, ("tick", "n_intervals"): 1}))
    assert status == 200 and "grid-key" in body["response"]


def test_an_eta_past_time_t_prints_and_nothing_else_breaks():
    assert sim_time(1e300) == "after 9999" and short_time(float("inf")) == "after 9999"
    assert sim_time(0) == "–" and short_time(1613000000.0) == "02-10 23:33"
