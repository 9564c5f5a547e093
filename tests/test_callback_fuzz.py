"""Issue 57, item 8: Dash's callback route under fuzzing. Every callback the app registers (Dash's
callback_map, as the server lists it at /_dash-dependencies) is driven over real HTTP
with each input of the wrong type (list, object, an integer too large for a float, NaN and
Infinity written in the JSON, a bool, a 1 MB string, nesting 60 deep), with unknown input ids
and outputs, with each envelope field left out, with a body over the size limit, with JSON that
does not parse and with a body that is not JSON. A refused value is a 4xx, nothing is a 5xx,
and every answer comes within REPLY_S; a well-typed request is answered 200 or 204 (Dash's
PreventUpdate) in strict JSON, against a store with hostile numbers (tests/support/hostile.py)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest

from app import callback_inputs
from app.webconfig import MAX_BODY_BYTES
from tests.support.hostile import hostile_app, strict_loads

CALLBACK = "/_dash-update-component"
#: a stall fails the test: no answer within this many seconds is an error of urllib
REPLY_S = 10
#: a well-typed value of each property, for the inputs a case does not set
GOOD = {"n_intervals": 1, "n_clicks": 1, "n_submit": 1, "submit_n_clicks": 1, "page_current": 0, "sort_by": [],
        "pathname": "/", "search": ""}
NEST = 60                      # under app/jsondepth.py's MAX_DEPTH of 64: the callback check sees it
#: raw JSON text for each wrong value (NaN and Infinity as Python's json reads them)
WRONG = {"list": "[1, 2]", "object": '{"x": [1]}', "huge-int": "1" + "0" * 400, "huge-float": "1e400",
         "nan": "NaN", "infinity": "Infinity", "minus-infinity": "-Infinity", "bool": "true",
         "nested": "[" * NEST + "]" * NEST, "nested-object": '{"a":' * NEST + "1" + "}" * NEST}
LONG = '"' + "x" * 1_000_000 + '"'
CLOSED = 0


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    proc, planted = hostile_app(tmp_path_factory.mktemp("callback-fuzz"))
    yield proc, planted
    proc.stop()


@pytest.fixture(scope="module")
def app(hostile):
    return hostile[0]


@pytest.fixture(scope="module")
def callbacks(app) -> list[dict]:
    """Every server-side callback of the app: Dash's callback_map as the server lists it at
    /_dash-dependencies (built in this process instead, the app would meet the pages other test
    modules register at import), {"output", "inputs", "state"} each."""
    with urllib.request.urlopen(app.url + "/_dash-dependencies", timeout=REPLY_S) as r:
        listed = json.load(r)
    out = [{"output": d["output"], "inputs": d["inputs"], "state": d["state"]}
           for d in listed if not d.get("clientside_function")]
    assert len(out) >= 15, [c["output"] for c in out]
    return out


def _post(app, body: bytes, content_type: str = "application/json") -> tuple[int, str]:
    """(status, text); (CLOSED, why) where the server answered 413 and closed the connection
    while urllib, which reads no answer before it has sent the whole body, was still sending."""
    req = urllib.request.Request(app.url + CALLBACK, data=body, method="POST")
    req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=REPLY_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except urllib.error.URLError as e:
        if isinstance(e.reason, (ConnectionResetError, BrokenPipeError)):
            return CLOSED, str(e.reason)
        raise


def _outputs(output: str) -> list[dict]:
    parts = output.strip(".").split("...") if output.startswith("..") else [output]
    return [dict(zip(("id", "property"), p.rsplit(".", 1))) for p in parts]


def _envelope(cb: dict, raw: dict[tuple[str, str], str] | None = None) -> dict:
    """The request the browser would send; a value given in `raw` as a Raw placeholder that
    `_encode` replaces with the text itself (so NaN and 400-digit numbers go out as written)."""
    raw = raw or {}

    def entry(i: dict) -> dict:
        key = (i["id"], i["property"])
        value = Raw(raw[key]) if key in raw else GOOD.get(i["property"])
        return {"id": i["id"], "property": i["property"], "value": value}
    outputs = _outputs(cb["output"])
    first = cb["inputs"][0]
    return {"output": cb["output"], "outputs": outputs if cb["output"].startswith("..") else outputs[0],
            "inputs": [entry(i) for i in cb["inputs"]], "state": [entry(i) for i in cb["state"]],
            "changedPropIds": [f"{first['id']}.{first['property']}"]}


@dataclass(frozen=True)
class Raw:
    """JSON text to send as it is."""

    text: str


def _encode(env: dict) -> bytes:
    raws: list[str] = []

    def placeholder(o: Raw) -> str:
        raws.append(o.text)
        return f"@raw{len(raws) - 1}@"
    text = json.dumps(env, default=placeholder)
    for n, raw in enumerate(raws):
        text = text.replace(f'"@raw{n}@"', raw)
    return text.encode()


def _refused_by_rule(i: dict, raw: str) -> bool:
    rule = callback_inputs.rule_for(i["id"], i["property"])
    try:
        return not rule(json.loads(raw))
    except (ValueError, OverflowError):
        return True


def _label(cb: dict, what: str) -> str:
    return f"{cb['output'][:80]} {what}"


def test_every_callback_of_every_page_is_driven(callbacks):
    """The pages' callbacks and the shell's are all in the list this module drives."""
    outputs = " ".join(c["output"] for c in callbacks)
    for component in ("nav-user", "status-bar", "grid", "jobs-table", "job-head", "rp-speed", "usage-table",
                      "event-log", "_pages_content"):
        assert f"{component}." in outputs, component


def test_well_typed_requests_are_answered_in_strict_json(app, callbacks):
    for cb in callbacks:
        status, text = _post(app, _encode(_envelope(cb)))
        assert status in (200, 204) or 400 <= status < 500, (_label(cb, "good"), status, text[:300])
        if status == 200:
            strict_loads(text)


def test_a_non_finite_number_in_a_callback_answer_is_null(hostile, callbacks):
    """Dash encodes callback answers with Plotly's encoder, which writes null for NaN and
    Infinity: the jobs table showing the job whose progress is NaN, and the one at -Infinity."""
    app, planted = hostile
    table = next(cb for cb in callbacks if cb["output"].startswith("..jobs-table.data"))
    for jid in (planted["nan"], planted["minus_inf"]):
        status, text = _post(app, _encode(_envelope(table, {("jobs-filter-search", "value"): json.dumps(jid)})))
        assert status == 200, text[:300]
        rows = strict_loads(text)["response"]["jobs-table"]["data"]
        assert [r["progress"] for r in rows if f"[{jid}]" in r["link"]] == [None], rows


def test_every_wrong_type_of_every_input_is_a_4xx(app, callbacks):
    bad: list = []
    sent = 0
    for cb in callbacks:
        for i in cb["inputs"] + cb["state"]:
            for name, raw in WRONG.items():
                status, text = _post(app, _encode(_envelope(cb, {(i["id"], i["property"]): raw})))
                sent += 1
                refused = _refused_by_rule(i, raw)
                if status >= 500 or (refused and not 400 <= status < 500):
                    bad.append((_label(cb, f"{i['id']}.{i['property']}={name}"), status, text[:200]))
                elif status == 200:
                    strict_loads(text)
        first = cb["inputs"][0]
        status, text = _post(app, _encode(_envelope(cb, {(first["id"], first["property"]): LONG})))
        if not 400 <= status < 500:
            bad.append((_label(cb, "1 MB string"), status, text[:200]))
    assert sent > 500 and bad == [], bad


def test_unknown_ids_outputs_and_missing_fields_are_4xx(app, callbacks):
    bad: list = []
    for cb in callbacks:
        env = _envelope(cb)
        cases = {"unknown input id": {**env, "inputs": [{**env["inputs"][0], "id": "no-such-component"}]},
                 "unknown input property": {**env, "inputs": [{**env["inputs"][0], "property": "no_such_prop"}]},
                 "pattern id": {**env, "inputs": [{**env["inputs"][0], "id": {"type": "x", "index": 1}}]},
                 "no input id": {**env, "inputs": [{k: v for k, v in env["inputs"][0].items() if k != "id"}]},
                 "unknown output": {**env, "output": "no-such-component.children",
                                    "outputs": {"id": "no-such-component", "property": "children"}},
                 "outputs not matching": {**env, "outputs": [{"id": "x", "property": "y"}] * 7},
                 "inputs as object": {**env, "inputs": {"id": "x"}}}
        for field in ("output", "outputs", "inputs"):
            cases[f"no {field}"] = {k: v for k, v in env.items() if k != field}
        for what, body in cases.items():
            status, text = _post(app, _encode(body))
            if not 400 <= status < 500:
                bad.append((_label(cb, what), status, text[:200]))
        for field in ("state", "changedPropIds"):         # Dash reads both as optional
            status, text = _post(app, _encode({k: v for k, v in env.items() if k != field}))
            if status >= 500:
                bad.append((_label(cb, f"no {field}"), status, text[:200]))
    assert bad == [], bad


def test_malformed_and_oversized_bodies_are_4xx(app, callbacks):
    env = _encode(_envelope(callbacks[0]))
    cases = {"cut short": env[:len(env) // 2], "not json": b"output=x", "empty": b"", "a list": b"[]",
             "a number": b"1", "not utf-8": b'{"output": "\xff\xfe"}', "nul bytes": b"\x00" * 100,
             "5 MB": b'{"output": "' + b"x" * 5_000_000 + b'"}', "5 MB of spaces": env + b" " * 5_000_000,
             "digits over the limit": b'{"output": ' + b"1" * 5000 + b"}",
             "deeper than the limit": b"[" * 5000 + b"]" * 5000}
    bad = []
    for what, body in cases.items():
        status, text = _post(app, body)
        if not (400 <= status < 500 or (status == CLOSED and len(body) > MAX_BODY_BYTES)):
            bad.append((what, status, text[:200]))
    status, text = _post(app, env, content_type="text/plain")
    if not (400 <= status < 500 or status in (200, 204)):
        bad.append(("text/plain", status, text[:200]))
    assert bad == [], bad
    assert app.proc.poll() is None and "Traceback" not in app.output(), app.output()[-3000:]
