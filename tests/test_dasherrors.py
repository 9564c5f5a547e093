"""Issue 47, row 9: malformed requests to Dash's own routes (fuzzed callback envelopes, made-up
component files) answer 400/404, never 500, with at most one log line each and no traceback;
an error in this project's own code keeps its traceback."""
from __future__ import annotations

import json
import random
import urllib.error
import urllib.request

import pytest

from app.dasherrors import _raised_in_ours
from tests.support.server import start_app

JUNK = [None, 1, "x", [], {}, [1], [{}], [{"id": 1}], {"a": 1}, True, [{"id": "x", "property": "y"}]]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("dash-errors"), "--fresh", "--dispatch", "simulated", "--local-nodes", "2")
    yield proc
    proc.stop()


def _status(app, method: str, path: str, body: bytes | None = None) -> int:
    req = urllib.request.Request(app.url + path, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_made_up_component_files_are_404(app):
    for path in ("/_dash-component-suites/dash/x.js", "/_dash-component-suites/nope/x.js",
                 "/_dash-component-suites/dash/dcc/x.js"):
        assert _status(app, "GET", path) == 404, path


def test_fuzzed_callback_envelopes_are_400_with_one_log_line_and_no_traceback(app):
    with urllib.request.urlopen(app.url + "/_dash-dependencies", timeout=10) as r:
        deps = json.load(r)
    rnd = random.Random(47)
    before = app.output()
    codes: dict[int, int] = {}
    sent = 0
    for body in (b"{}", b'{"output": 5}', b'{"output":"x..y","outputs":{},"inputs":[],"changedPropIds":[]}'):
        s = _status(app, "POST", "/_dash-update-component", body)
        codes[s] = codes.get(s, 0) + 1
        sent += 1
    for _ in range(200):
        d = rnd.choice(deps)
        env = {"output": d["output"], "outputs": rnd.choice([d["output"], rnd.choice(JUNK)]),
               "inputs": rnd.choice([[{"id": i["id"], "property": i["property"], "value": rnd.choice(JUNK)}
                                      for i in d["inputs"]], rnd.choice(JUNK)]),
               "state": rnd.choice([[], rnd.choice(JUNK)]), "changedPropIds": rnd.choice([[], rnd.choice(JUNK)])}
        for key in list(env):
            if rnd.random() < 0.15:
                del env[key]
        s = _status(app, "POST", "/_dash-update-component", json.dumps(env).encode())
        codes[s] = codes.get(s, 0) + 1
        sent += 1
    assert not [c for c in codes if c >= 500], codes
    log = app.output()[len(before):]
    assert "Traceback" not in log
    assert log.count("\n") <= sent, log[-2000:]


def test_an_error_in_this_projects_code_is_told_apart():
    try:
        raise ValueError("ours")
    except ValueError as e:
        assert _raised_in_ours(e)
    try:
        json.loads("{")
    except ValueError as e:
        assert _raised_in_ours(e)          # raised below this frame, which is ours
        assert not _raised_in_ours(e.with_traceback(e.__traceback__.tb_next))
