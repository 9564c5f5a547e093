"""Issue 57, item 3: no NaN or Infinity leaves the server. A real server continues a run whose
store holds jobs with NaN and ±Infinity in their progress, totals, rate, failure and training
story (tests/support/hostile.py); every JSON answer of the API and of Dash's own routes parses
as a browser's JSON.parse would, with each non-finite number null, and the log says so once per
route. The provider itself (app/strictjson.py) on a bare Flask app: nested values, values made
by its `default`, clean data unchanged."""
from __future__ import annotations

import dataclasses
import json
import logging
import urllib.request

import flask
import pytest

from tests.support.hostile import hostile_app, strict_loads

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    app, planted = hostile_app(tmp_path_factory.mktemp("strict-json"))
    yield app, planted
    app.stop()


def _get(app, path: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(app.url + path)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _strict(app, path: str, token: str | None = None):
    status, text = _get(app, path, token)
    try:
        return status, strict_loads(text)
    except ValueError as e:
        pytest.fail(f"{path} ({status}) is not strict JSON: {e}: {text[:300]}")


def test_every_api_answer_about_hostile_jobs_is_strict_json_with_nulls(hostile):
    app, planted = hostile
    staff = app.token("staff1")
    _, listing = _strict(app, "/api/jobs?limit=1000")
    by_id = {j["id"]: j for j in listing["jobs"]}
    assert by_id[planted["nan"]]["progress"] is None and by_id[planted["nan"]]["total_samples"] is None
    assert by_id[planted["minus_inf"]]["progress"] is None and by_id[planted["minus_inf"]]["samples_done"] is None
    status, one = _strict(app, f"/api/jobs/{planted['nan']}")
    assert status == 200 and one["progress"] is None
    assert one["workers"]["losses"] == [[1, None], [2, None]] and one["workers"]["loss"] is None, one["workers"]
    status, failed = _strict(app, f"/api/jobs/{planted['minus_inf']}")
    assert status == 200 and failed["failure"]["at"] is None and failed["failure"]["reason"] == "exception"
    for jid in planted.values():
        for tail in ("", "/logs", "/events"):
            assert _strict(app, f"/api/jobs/{jid}{tail}", staff)[0] == 200, (jid, tail)
    for path in ("/api/health", "/api/cluster", "/api/usage", "/api/usage?by=job", "/api/openapi.json",
                 "/api/jobs?state=failed", "/api/nope", "/_dash-dependencies", "/_dash-layout"):
        status, _ = _strict(app, path, staff)
        assert status < 500, path
    assert _strict(app, "/api/usage?by=job", staff)[0] == 200


def test_the_log_says_once_per_route(hostile):
    app, planted = hostile
    for _ in range(3):
        _strict(app, "/api/jobs")
        _strict(app, f"/api/jobs/{planted['nan']}")
    lines = [ln for ln in app.output().splitlines() if "non-finite number in the JSON answer" in ln]
    assert len([ln for ln in lines if "/api/jobs " in ln + " "]) == 1, lines
    assert len(lines) <= 8, lines
    assert "Traceback" not in app.output()


@dataclasses.dataclass
class Point:
    x: float
    y: float


def test_the_provider_sends_null_for_every_non_finite_number(caplog):
    from app.strictjson import install
    server = flask.Flask(__name__)
    install(server)
    clean = {"a": 1.5, "b": [1, "NaN", None], "c": {"d": True}}
    server.add_url_rule("/clean", "clean", lambda: flask.jsonify(clean))
    server.add_url_rule("/bad", "bad", lambda: flask.jsonify(
        {"a": NAN, "b": [INF, 1.0, (-INF,)], "c": {"d": {"e": NAN}}, "p": Point(NAN, 2.0)}))
    client = server.test_client()
    assert strict_loads(client.get("/clean").get_data(as_text=True)) == clean
    with caplog.at_level(logging.WARNING, logger="app.strictjson"):
        answers = [client.get("/bad") for _ in range(3)]
    assert {a.status_code for a in answers} == {200}
    assert strict_loads(answers[0].get_data(as_text=True)) == {
        "a": None, "b": [None, 1.0, [None]], "c": {"d": {"e": None}}, "p": {"x": None, "y": 2.0}}
    assert len(caplog.records) == 1 and "/bad" in caplog.records[0].getMessage()
    with server.app_context():
        assert json.loads(server.json.dumps({"x": INF})) == {"x": None}


def test_the_app_uses_the_strict_provider(tmp_path):
    from app.auth import Users
    from app.strictjson import StrictProvider
    from app.web import create_app
    from core.service.base import Harvester
    users, _ = Users.demo(tmp_path / "x.db")
    server = create_app(Harvester(tmp_path / "x.db", 0.5), users).server
    assert isinstance(server.json, StrictProvider)
