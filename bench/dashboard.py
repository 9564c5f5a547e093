"""Dashboard benchmark: what one live grid update costs at Summit scale (4,734 nodes), and how long
a new visitor waits for the cluster page.

    python -m bench.dashboard [--json] [--updates 50] [--speed 60] [--loads 5] [--profile] [--quick]

1. It starts the real app (`python -m app --fresh --speed S`, tests.server.start_app) in a temporary
   directory, loads the cluster page once in Chromium and captures the grid callback request
   (`POST /_dash-update-component`, outputs grid.figure and grid-key.data, input tick.n_intervals,
   state grid-key.data). It then replays that request `--updates` times, once a second, over one
   keep-alive connection with a browser's Accept-Encoding, each time sending the grid-key the
   previous response returned, in two chains:

   - "browser": the key goes through what JSON.parse/JSON.stringify do to it in a browser (a
     JavaScript number is a double, so an integer above 2**53 comes back rounded): exactly what
     a real page sends;
   - "diff": the key exactly as the server returned it, so every update is a diff against the
     previous one (the path the grid is designed for).

   Each is timed as the HTTP round trip on loopback (server time); the payload is the response
   body in KB, raw (decoded) and as sent (Content-Encoding the server chose), plus its gzip -6
   size. The browser chain goes first after each new snapshot, so it also pays the one build of
   that snapshot's cells (CellCache.cells), as a real page's grid or KPI callback does. Worst
   cases, over HTTP: an unknown snapshot (key null: the whole figure) and the key of another
   server process on the same machine (what a page open across a restart sends back: the whole
   z + text, the same branch as more than PATCH_LIMIT changed cells). Every key sent is one a
   browser can hold, so it passes the callback input rules (app/callback_inputs.py).
2. First render: a fresh browser context per load, goto("/") until #grid's .main-svg is visible
   and the heatmap has its data (z rows and a drawn heatmap image); median over `--loads`.
3. In-process, against a live Harvester built in this process (the app's create_app, so
   app.context is set as in the server): app.pages.cluster.grid_update timed alone, the JSON
   encoding Dash does (plotly's to_json), and the whole Dash dispatch through Flask's test client
   (encoding and compression included), for both chains and a real > PATCH_LIMIT diff. Updates
   are shared per pair of snapshots (app/gridupdates.py): where both chains hold the same
   snapshot, the browser chain builds the update and the diff chain gets it ready-made, as a
   second viewer does.

`--quick` (3 updates, 1 load, 3 worst-case repeats; ~30 s) checks that every step still works
(tests/test_bench_dashboard.py), not how fast. The server is stopped by PID at the end, also
on error. A table goes to stdout, progress to stderr; with --json the last stdout line is one
JSON object (update_ms_p50, update_ms_p95, update_kb, first_render_s, ... ; `update_*` is what a
browser gets, `diff_*` the exact-key chain).
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import gzip
import http.client
import io
import json
import math
import os
import pstats
import sys
import tempfile
import time
import zlib
from decimal import Decimal
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

import numpy as np

from app.grid import PATCH_LIMIT, Cells
from tests.support.server import CHROMIUM, CHROMIUM_ARGS, start_app, write_users

GOAL_UPDATE_MS = 100.0
GOAL_UPDATE_KB = 150.0
GOAL_FIRST_RENDER_S = 2.0
CALLBACK = "/_dash-update-component"
#: what Chromium sends (and so what the server compresses for)
ACCEPT_ENCODING = "gzip, deflate, br, zstd"
JS_SAFE = 2 ** 53
WORST_REPEATS = 10
QUICK_UPDATES = 3
QUICK_REPEATS = 3

#: true once the grid shows data: the figure has z rows, the SVG is laid out, the heatmap is drawn
RENDERED_JS = """() => {
  const gd = document.querySelector('#grid .js-plotly-plot');
  if (!gd || !gd.data || !gd.data[0] || !gd.data[0].z || !gd.data[0].z.length) return false;
  const svg = gd.querySelector('.main-svg');
  if (!svg || !svg.getBoundingClientRect().height) return false;
  if (!gd.querySelector('.hm image')) return false;
  return performance.now();
}"""


def log(msg: str) -> None:
    print(f"[bench.dashboard] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def js_roundtrip(value: Any) -> Any:
    """What a browser sends back for a JSON value it received: integers are doubles in JS, and
    JSON.stringify writes a double's shortest digits padded with zeros."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if abs(value) <= JS_SAFE else int(Decimal(repr(float(value))))
    if isinstance(value, dict):
        return {k: js_roundtrip(v) for k, v in value.items()}
    if isinstance(value, list):
        return [js_roundtrip(v) for v in value]
    return value


def decode(body: bytes, encoding: Optional[str]) -> bytes:
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    if encoding == "br":
        import brotli
        return brotli.decompress(body)
    if encoding == "zstd":
        try:
            from backports import zstd
        except ImportError:  # Python 3.14+
            from compression import zstd  # type: ignore[no-redef]
        return zstd.decompress(body)
    raise ValueError(f"unknown Content-Encoding {encoding}")


def kind_of(resp: Optional[dict]) -> tuple[str, int]:
    """What a grid response carries: 'none' (204), 'figure' (whole figure), 'z+text' (whole z and
    text) or 'cells' (per-cell patch), with the number of cells patched."""
    if resp is None:
        return "none", 0
    fig = resp["response"].get("grid", {}).get("figure")
    if fig is None:
        return "none", 0
    if isinstance(fig, dict) and "operations" in fig:
        ops = fig["operations"]
        if any(op["location"] == ["data", 0, "z"] for op in ops):
            return "z+text", 0
        return "cells", sum(1 for op in ops if op["location"][:3] == ["data", 0, "z"])
    return "figure", 0


class Client:
    """One keep-alive HTTP/1.1 connection, as a browser keeps one to its server."""

    def __init__(self, url: str) -> None:
        u = urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)

    def post(self, path: str, payload: dict) -> dict:
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "Accept-Encoding": ACCEPT_ENCODING}
        for attempt in (0, 1):
            try:
                t0 = time.perf_counter()
                self.conn.request("POST", path, body=body, headers=headers)
                r = self.conn.getresponse()
                wire = r.read()
                ms = (time.perf_counter() - t0) * 1000.0
                break
            except (http.client.HTTPException, ConnectionError):
                if attempt:
                    raise
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        if r.status not in (200, 204):
            raise RuntimeError(f"{path}: HTTP {r.status}: {wire[:500]!r}")
        enc = r.getheader("Content-Encoding")
        raw = decode(wire, enc)
        return {"ms": ms, "status": r.status, "raw": len(raw), "wire": len(wire), "encoding": enc or "identity",
                "gzip": len(gzip.compress(raw, 6)) if raw else 0, "server_timing": r.getheader("Server-Timing"),
                "json": json.loads(raw) if raw else None}

    def close(self) -> None:
        self.conn.close()


# ---- the browser ------------------------------------------------------------------------------
def capture_request(browser, url: str, watch_s: float = 4.0) -> tuple[dict, list[tuple[str, int]]]:
    """The grid callback request a real page sends (its first one, on load), and what kind of
    grid responses (kind, decoded bytes) that page received while it was watched."""
    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        seen: list[dict] = []
        responses = []

        def is_grid(req) -> Optional[dict]:
            if CALLBACK not in req.url or req.method != "POST":
                return None
            try:
                body = json.loads(req.post_data or "{}")
            except json.JSONDecodeError:
                return None
            outs = {(o["id"], o["property"]) for o in body.get("outputs", []) if isinstance(o, dict)}
            return body if outs == {("grid", "figure"), ("grid-key", "data")} else None

        def on_request(req):
            body = is_grid(req)
            if body is not None:
                seen.append(body)

        def on_response(resp):
            if is_grid(resp.request) is not None:
                responses.append(resp)
        page.on("request", on_request)
        page.on("response", on_response)
        page.goto(url + "/")
        page.wait_for_function(RENDERED_JS, polling="raf", timeout=60000)
        page.wait_for_timeout(watch_s * 1000)
        page.remove_listener("response", on_response)
        if not seen:
            raise RuntimeError("the page sent no grid callback request")
        kinds = []
        for resp in list(responses):
            try:
                data = resp.body()
            except Exception:
                continue
            kinds.append((kind_of(json.loads(data) if data else None)[0], len(data)))
        return seen[0], kinds
    finally:
        ctx.close()


def first_render(browser, url: str, loads: int) -> list[dict]:
    """Fresh context per load (nothing cached): seconds from goto to a drawn grid with data."""
    out = []
    for k in range(loads):
        ctx = browser.new_context()
        try:
            page = ctx.new_page()
            sizes = {"callback_kb": 0.0, "all_kb": 0.0}

            def on_finished(req, sizes=sizes):
                try:
                    n = req.sizes()["responseBodySize"] / 1024.0
                except Exception:
                    return
                sizes["all_kb"] += n
                if CALLBACK in req.url or "_dash-layout" in req.url:
                    sizes["callback_kb"] += n
            page.on("requestfinished", on_finished)
            t0 = time.perf_counter()
            page.goto(url + "/", wait_until="commit")
            perf_ms = page.wait_for_function(RENDERED_JS, polling="raf", timeout=60000).json_value()
            wall = time.perf_counter() - t0
            out.append({"wall_s": wall, "perf_s": perf_ms / 1000.0, **sizes})
            log(f"first render {k + 1}/{loads}: {wall:.2f} s (performance.now {perf_ms / 1000:.2f} s)")
        finally:
            ctx.close()
    return out


# ---- HTTP updates -----------------------------------------------------------------------------
def request_for(template: dict, n: int, key: Any) -> dict:
    body = copy.deepcopy(template)
    body["inputs"][0]["value"] = n
    body["changedPropIds"] = ["tick.n_intervals"]
    if "parsedChangedPropsIds" in body:
        body["parsedChangedPropsIds"] = ["tick.n_intervals"]
    body["state"][0]["value"] = key
    return body


def http_updates(client: Client, template: dict, updates: int, interval: float) -> dict[str, list[dict]]:
    """`updates` + 1 requests per chain, one a second (the first, from the page's own key, is a
    warm-up and is dropped)."""
    start_key = template["state"][0]["value"]
    keys = {"browser": start_key, "diff": start_key}
    runs: dict[str, list[dict]] = {"browser": [], "diff": []}
    t0 = time.monotonic()
    for i in range(updates + 1):
        time.sleep(max(0.0, t0 + i * interval - time.monotonic()))
        for chain in ("browser", "diff"):
            r = client.post(CALLBACK, request_for(template, 1000 + i, keys[chain]))
            r["kind"], r["cells"] = kind_of(r["json"])
            if r["json"] is not None:
                new_key = r["json"]["response"]["grid-key"]["data"]
                keys[chain] = js_roundtrip(new_key) if chain == "browser" else new_key
            r.pop("json")
            if i:
                runs[chain].append(r)
        if i and i % 10 == 0:
            b, d = runs["browser"][-1], runs["diff"][-1]
            log(f"update {i}/{updates}: browser {b['ms']:.1f} ms {b['raw'] / 1024:.1f} KB ({b['kind']}), "
                f"diff {d['ms']:.1f} ms {d['raw'] / 1024:.1f} KB ({d['kind']}, {d['cells']} cells)")
    runs["exact_key"] = keys["diff"]
    return runs


def other_boot(key: dict) -> dict:
    """The same snapshot's key as another server process wrote it (its boot differs): what a
    page kept open across a restart sends, and the server cannot diff against."""
    boot = key["boot"]
    return {**key, "boot": "0" * len(boot) if boot != "0" * len(boot) else "1" * len(boot)}


def http_worst(client: Client, template: dict, exact_key: dict, repeats: int) -> dict[str, list[dict]]:
    cases = {"figure": None, "z+text": other_boot(exact_key)}
    out: dict[str, list[dict]] = {}
    for name, key in cases.items():
        out[name] = []
        for k in range(repeats):
            r = client.post(CALLBACK, request_for(template, 5000 + k, key))
            r["kind"], _ = kind_of(r.pop("json"))
            if r["kind"] != name:
                raise AssertionError(f"worst case {name}: the server sent {r['kind']}")
            out[name].append(r)
            time.sleep(0.25)
        log(f"worst case {name}: {pct([r['ms'] for r in out[name]], 50):.1f} ms, "
            f"{out[name][0]['raw'] / 1024:.1f} KB")
    return out


def run_server(workdir: Path, speed: float, updates: int, loads: int, repeats: int) -> dict:
    from playwright.sync_api import sync_playwright

    log(f"starting the app (--fresh --speed {speed:g}) ...")
    app = start_app(workdir / "server", "--fresh", "--speed", str(speed))
    log(f"app on {app.url} (pid {app.proc.pid})")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                template, page_kinds = capture_request(browser, app.url)
                log(f"captured the grid callback request: {json.dumps(template)[:300]}")
                log("grid responses the real page got: " + ", ".join(f"{k} {n / 1024:.1f} KB" for k, n in page_kinds))
                load_before = os.getloadavg()[0]
                renders = first_render(browser, app.url, loads)
                load_after = os.getloadavg()[0]
            finally:
                browser.close()
        client = Client(app.url)
        try:
            log(f"{updates} updates, one a second, two chains (browser key, exact key) ...")
            runs = http_updates(client, template, updates, 1.0)
            worst = http_worst(client, template, runs.pop("exact_key"), repeats)
        finally:
            client.close()
    finally:
        rc = app.stop()
        log(f"app stopped (pid {app.proc.pid}, exit {rc})")
    return {"template": template, "page_kinds": page_kinds, "renders": renders, "runs": runs, "worst": worst,
            "loadavg": (load_before, load_after)}


# ---- in process -------------------------------------------------------------------------------
def _cluster_module():
    root = str(Path(__file__).resolve().parent.parent / "app" / "pages" / "cluster.py")
    for m in list(sys.modules.values()):
        if getattr(m, "__file__", None) == root:
            return m
    import app.pages.cluster as m
    return m


def run_inprocess(workdir: Path, speed: float, updates: int, profile: bool, repeats: int) -> dict:
    from dash._utils import to_json

    from app import context
    from app.__main__ import build_parser, settings_from
    from app.auth import Users
    from app.web import create_app
    from core.assemble import build

    workdir.mkdir(parents=True, exist_ok=True)
    args = build_parser().parse_args(["--db", str(workdir / "harvest.db"), "--speed", str(speed),
                                      "--fresh", "--tick", "0.5"])
    log("in-process: opening a Harvester ...")
    h = build(settings_from(args))
    h.open()
    try:
        dash_app = create_app(h, Users.load(write_users(workdir / "users.json")))
        test = dash_app.server.test_client()
        cluster = _cluster_module()
        grid_update = cluster.grid_update

        def encode(out) -> bytes:
            return to_json({"multi": True, "response": {"grid": {"figure": out[0]},
                                                        "grid-key": {"data": out[1]}}}).encode()

        def one(key) -> dict:
            t0 = time.perf_counter()
            out = grid_update(key)
            t1 = time.perf_counter()
            body = b"" if _is_no_update(out[1]) else encode(out)
            t2 = time.perf_counter()
            kind = kind_of(json.loads(body))[0] if body else "none"
            return {"compute_ms": (t1 - t0) * 1000, "json_ms": (t2 - t1) * 1000, "raw": len(body),
                    "kind": kind, "key": out[1]}

        def dispatch(key, n) -> float:
            payload = json.dumps({"output": "..grid.figure...grid-key.data..",
                                  "outputs": [{"id": "grid", "property": "figure"},
                                              {"id": "grid-key", "property": "data"}],
                                  "inputs": [{"id": "tick", "property": "n_intervals", "value": n}],
                                  "changedPropIds": ["tick.n_intervals"],
                                  "state": [{"id": "grid-key", "property": "data", "value": key}]})
            t0 = time.perf_counter()
            r = test.post(CALLBACK, data=payload, headers={"Content-Type": "application/json",
                                                           "Accept-Encoding": ACCEPT_ENCODING})
            r.get_data()
            ms = (time.perf_counter() - t0) * 1000
            if r.status_code not in (200, 204):
                raise RuntimeError(f"in-process dispatch: HTTP {r.status_code}")
            return ms

        first = one(None)
        keys = {"browser": js_roundtrip(first["key"]), "diff": first["key"]}
        runs: dict[str, list[dict]] = {"browser": [], "diff": []}
        log(f"in-process: {updates} updates, one a second ...")
        t0 = time.monotonic()
        for i in range(1, updates + 1):
            time.sleep(max(0.0, t0 + i - time.monotonic()))
            for chain in ("browser", "diff"):
                key = keys[chain]
                r = one(key)
                if not _is_no_update(r["key"]):
                    keys[chain] = js_roundtrip(r["key"]) if chain == "browser" else r["key"]
                # the same request once more through Dash + Flask (a no-op diff when the key is
                # now current for the diff chain, so dispatch the key we had, not the new one)
                r["dispatch_ms"] = dispatch(key, i)
                r.pop("key")
                runs[chain].append(r)
            if i % 10 == 0:
                b, d = runs["browser"][-1], runs["diff"][-1]
                log(f"in-process {i}/{updates}: browser compute {b['compute_ms']:.1f} + json {b['json_ms']:.1f} ms,"
                    f" diff compute {d['compute_ms']:.1f} + json {d['json_ms']:.1f} ms")

        # worst cases: whole figure, and a real diff of more than PATCH_LIMIT cells
        snap = h.snapshot
        cache = context.cells
        lay = cache.layout(snap.nodes)
        new = cache.cells(snap)
        codes = new.codes.copy()
        flip = np.arange(0, len(codes), max(1, len(codes) // (PATCH_LIMIT + 100)))[:PATCH_LIMIT + 100]
        codes[flip] = np.where(codes[flip] == 0, 1, 0)
        old = Cells(new.seq - 10 ** 6, codes, new.text)
        from app.grid import grid_figure, grid_patch
        worst: dict[str, list[dict]] = {"figure": [], "z+text": []}
        for _ in range(repeats):
            t0 = time.perf_counter()
            fig = grid_figure(lay, snap.nodes, new)
            t1 = time.perf_counter()
            body = encode((fig, {}))
            t2 = time.perf_counter()
            worst["figure"].append({"compute_ms": (t1 - t0) * 1000, "json_ms": (t2 - t1) * 1000, "raw": len(body)})
            t0 = time.perf_counter()
            patch = grid_patch(lay, old, new)
            t1 = time.perf_counter()
            body = encode((patch, {}))
            t2 = time.perf_counter()
            assert kind_of(json.loads(body))[0] == "z+text"
            worst["z+text"].append({"compute_ms": (t1 - t0) * 1000, "json_ms": (t2 - t1) * 1000, "raw": len(body)})
        # what a new snapshot costs to turn into cells (once per snapshot, shared by all browsers)
        from app.grid import ColourBook, cells_of
        book = ColourBook()
        cells_ms = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            cells_of(snap, book)
            cells_ms.append((time.perf_counter() - t0) * 1000)

        prof_text = None
        if profile:
            prof_text = profile_calls(grid_update, encode, keys, h)
        return {"runs": runs, "worst": worst, "cells_of_ms": cells_ms, "profile": prof_text}
    finally:
        h.close()
        log("in-process: Harvester closed")


def _is_no_update(v) -> bool:
    from dash._no_update import NoUpdate
    return NoUpdate.is_no_update(v)


def profile_calls(grid_update, encode, keys, h) -> str:
    """cProfile of browser-chain updates (what a real page triggers) and exact-key diffs."""
    out = io.StringIO()
    for chain in ("browser", "diff"):
        prof = cProfile.Profile()
        key = keys[chain]
        for _ in range(10):
            time.sleep(0.55)   # a new snapshot each time
            prof.enable()
            fig, new_key = grid_update(key)
            if not _is_no_update(new_key):
                encode((fig, new_key))
                key = js_roundtrip(new_key) if chain == "browser" else new_key
            prof.disable()
        out.write(f"\n==== cProfile, 10 {chain}-chain updates (grid_update + Dash JSON encoding) ====\n")
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    return out.getvalue()


# ---- report -----------------------------------------------------------------------------------
def summarize(server: dict, inproc: Optional[dict]) -> dict:
    runs, worst, renders = server["runs"], server["worst"], server["renders"]
    b, d = runs["browser"], runs["diff"]
    kinds = {}
    for r in b:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    dkinds = {}
    for r in d:
        dkinds[r["kind"]] = dkinds.get(r["kind"], 0) + 1

    def ms(rs, q):
        return round(pct([r["ms"] for r in rs], q), 2)

    def kb(rs, field="raw", q=50):
        return round(pct([r[field] / 1024 for r in rs], q), 2)

    s = {
        "nodes": 4734, "updates": len(b), "worst_repeats": len(worst["figure"]),
        "update_ms_p50": ms(b, 50), "update_ms_p95": ms(b, 95),
        "update_kb": kb(b), "update_kb_p95": kb(b, q=95),
        "update_wire_kb": kb(b, "wire"), "update_gzip_kb": kb(b, "gzip"),
        "update_encoding": "/".join(sorted({r["encoding"] for r in b + d})), "update_kinds": kinds,
        "diff_ms_p50": ms(d, 50), "diff_ms_p95": ms(d, 95),
        "diff_kb": kb(d), "diff_kb_p95": kb(d, q=95), "diff_wire_kb": kb(d, "wire"), "diff_gzip_kb": kb(d, "gzip"),
        "diff_kinds": dkinds, "diff_cells_p50": round(pct([r["cells"] for r in d], 50), 1),
        "diff_cells_max": max((r["cells"] for r in d), default=0),
        "full_ms": ms(worst["figure"], 50), "full_ms_p95": ms(worst["figure"], 95),
        "full_kb": kb(worst["figure"]), "full_wire_kb": kb(worst["figure"], "wire"),
        "full_gzip_kb": kb(worst["figure"], "gzip"),
        "ztext_ms": ms(worst["z+text"], 50), "ztext_ms_p95": ms(worst["z+text"], 95),
        "ztext_kb": kb(worst["z+text"]), "ztext_wire_kb": kb(worst["z+text"], "wire"),
        "ztext_gzip_kb": kb(worst["z+text"], "gzip"),
        "server_timing": next((r["server_timing"] for r in b + d if r["server_timing"]), None),
        "first_render_s": round(pct([r["wall_s"] for r in renders], 50), 3),
        "first_render_max_s": round(max(r["wall_s"] for r in renders), 3),
        "first_render_perf_s": round(pct([r["perf_s"] for r in renders], 50), 3),
        "first_render_loads": len(renders),
        "first_render_dash_wire_kb": round(pct([r["callback_kb"] for r in renders], 50), 1),
        "first_render_all_wire_kb": round(pct([r["all_kb"] for r in renders], 50), 1),
        "grid_key_sent": server["template"]["state"][0]["value"],
        "real_page_grid_responses": [k for k, _ in server["page_kinds"]],
        "loadavg_1m_first_render": [round(x, 2) for x in server["loadavg"]], "cpus": os.cpu_count(),
    }
    if inproc:
        ib, idf, iw = inproc["runs"]["browser"], inproc["runs"]["diff"], inproc["worst"]
        for name, rs in (("update", ib), ("diff", idf)):
            for field in ("compute", "json", "dispatch"):
                for q in (50, 95):
                    s[f"inproc_{name}_{field}_ms_p{q}"] = round(pct([r[field + "_ms"] for r in rs], q), 2)
        for name, case in (("full", "figure"), ("ztext", "z+text")):
            for field in ("compute", "json"):
                s[f"inproc_{name}_{field}_ms"] = round(pct([r[field + "_ms"] for r in iw[case]], 50), 2)
        s.update({
            "inproc_ztext_kb": round(pct([r["raw"] / 1024 for r in iw["z+text"]], 50), 2),
            "cells_of_ms_p50": round(pct(inproc["cells_of_ms"], 50), 2),
        })
    return s


def table(s: dict) -> str:
    def ok(v, goal):
        return "-" if goal is None or v is None or (isinstance(v, float) and math.isnan(v)) else (
            "yes" if v <= goal else "NO")

    def n(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)

    kinds = ", ".join(f"{v} {k}" for k, v in sorted(s["update_kinds"].items()))
    dkinds = ", ".join(f"{v} {k}" for k, v in sorted(s["diff_kinds"].items()))
    enc = s["update_encoding"]
    rows = [("metric", "p50", "p95", "goal", "ok?"),
            (f"grid update as a browser sends it, HTTP ms ({kinds})", n(s["update_ms_p50"]), n(s["update_ms_p95"]),
             f"<= {GOAL_UPDATE_MS:g} ms", ok(s["update_ms_p95"], GOAL_UPDATE_MS)),
            ("  payload KB (response body, decoded)", n(s["update_kb"]), n(s["update_kb_p95"]),
             f"<= {GOAL_UPDATE_KB:g} KB", ok(s["update_kb"], GOAL_UPDATE_KB)),
            (f"  on the wire KB ({enc}) / gzip -6 KB", f"{s['update_wire_kb']:.1f} / {s['update_gzip_kb']:.1f}",
             "", "", ""),
            (f"grid update, exact key (diff path), HTTP ms ({dkinds})", n(s["diff_ms_p50"]), n(s["diff_ms_p95"]),
             f"<= {GOAL_UPDATE_MS:g} ms", ok(s["diff_ms_p95"], GOAL_UPDATE_MS)),
            (f"  payload KB (cells changed p50 {s['diff_cells_p50']:g}, max {s['diff_cells_max']})",
             n(s["diff_kb"], "{:.2f}"), n(s["diff_kb_p95"], "{:.2f}"), f"<= {GOAL_UPDATE_KB:g} KB",
             ok(s["diff_kb"], GOAL_UPDATE_KB)),
            (f"  on the wire KB ({enc}) / gzip -6 KB", f"{s['diff_wire_kb']:.2f} / {s['diff_gzip_kb']:.2f}",
             "", "", ""),
            (f"worst: unknown snapshot, whole figure, HTTP ms (x{s['worst_repeats']})", n(s["full_ms"]),
             n(s["full_ms_p95"]), f"<= {GOAL_UPDATE_MS:g} ms", ok(s["full_ms_p95"], GOAL_UPDATE_MS)),
            (f"  payload KB (wire {s['full_wire_kb']:.1f}, gzip {s['full_gzip_kb']:.1f})", n(s["full_kb"]), "",
             f"<= {GOAL_UPDATE_KB:g} KB", ok(s["full_kb"], GOAL_UPDATE_KB)),
            (f"worst: whole z+text (> {PATCH_LIMIT} cells), HTTP ms (x{s['worst_repeats']})", n(s["ztext_ms"]),
             n(s["ztext_ms_p95"]), f"<= {GOAL_UPDATE_MS:g} ms", ok(s["ztext_ms_p95"], GOAL_UPDATE_MS)),
            (f"  payload KB (wire {s['ztext_wire_kb']:.1f}, gzip {s['ztext_gzip_kb']:.1f})", n(s["ztext_kb"]), "",
             f"<= {GOAL_UPDATE_KB:g} KB", ok(s["ztext_kb"], GOAL_UPDATE_KB))]
    if "inproc_update_compute_ms_p50" in s:
        rows += [
            ("in-process, browser key: grid_update ms", n(s["inproc_update_compute_ms_p50"], "{:.2f}"),
             n(s["inproc_update_compute_ms_p95"], "{:.2f}"), "", ""),
            ("  + Dash JSON encoding ms", n(s["inproc_update_json_ms_p50"], "{:.2f}"),
             n(s["inproc_update_json_ms_p95"], "{:.2f}"), "", ""),
            ("  whole Dash dispatch (Flask test client, compressed) ms", n(s["inproc_update_dispatch_ms_p50"]),
             n(s["inproc_update_dispatch_ms_p95"]), "", ""),
            ("in-process, exact key (diff): grid_update ms", n(s["inproc_diff_compute_ms_p50"], "{:.2f}"),
             n(s["inproc_diff_compute_ms_p95"], "{:.2f}"), "", ""),
            ("  + Dash JSON encoding ms", n(s["inproc_diff_json_ms_p50"], "{:.2f}"),
             n(s["inproc_diff_json_ms_p95"], "{:.2f}"), "", ""),
            ("  whole Dash dispatch (Flask test client, compressed) ms", n(s["inproc_diff_dispatch_ms_p50"]),
             n(s["inproc_diff_dispatch_ms_p95"]), "", ""),
            ("in-process: grid_figure + JSON ms", f"{s['inproc_full_compute_ms']:.1f} + {s['inproc_full_json_ms']:.1f}",
             "", "", ""),
            (f"in-process: real {PATCH_LIMIT + 100}-cell diff (z+text) + JSON ms",
             f"{s['inproc_ztext_compute_ms']:.1f} + {s['inproc_ztext_json_ms']:.1f}", "", "", ""),
            ("in-process: cells_of (once per snapshot) ms", n(s["cells_of_ms_p50"]), "", "", ""),
        ]
    rows.append((f"first render of / in Chromium, s (median/max of {s['first_render_loads']}; "
                 f"perf.now {s['first_render_perf_s']:.2f})", n(s["first_render_s"], "{:.2f}"),
                 n(s["first_render_max_s"], "{:.2f}"), f"<= {GOAL_FIRST_RENDER_S:g} s",
                 ok(s["first_render_s"], GOAL_FIRST_RENDER_S)))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON on the last line")
    ap.add_argument("--updates", type=int, default=50, help="grid updates to time, one a second")
    ap.add_argument("--speed", type=float, default=60.0, help="replay speed of the app (sim s per wall s)")
    ap.add_argument("--loads", type=int, default=5, help="first-render page loads (fresh context each)")
    ap.add_argument("--no-inprocess", action="store_true", help="skip the in-process timing of grid_update")
    ap.add_argument("--profile", action="store_true", help="cProfile in-process updates, print to stderr")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_UPDATES} updates, 1 load, {QUICK_REPEATS} worst-case repeats: does every step work")
    args = ap.parse_args(argv)
    if args.updates < 1 or args.loads < 1:
        ap.error("--updates and --loads must be at least 1")
    updates, loads, repeats = (QUICK_UPDATES, 1, QUICK_REPEATS) if args.quick else (args.updates, args.loads,
                                                                                    WORST_REPEATS)
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        server = run_server(Path(tmp), args.speed, updates, loads, repeats)
        inproc = None if args.no_inprocess else run_inprocess(Path(tmp) / "inproc", args.speed, updates,
                                                              args.profile, repeats)
    s = summarize(server, inproc)
    if inproc and inproc["profile"]:
        print(inproc["profile"], file=sys.stderr)
    print(f"Cluster page, Summit ({s['nodes']:,} nodes), replay at {args.speed:g}x, {s['updates']} updates one a "
          f"second over loopback; the page sent grid-key {json.dumps(s['grid_key_sent'])}")
    print(table(s))
    real = s["real_page_grid_responses"]
    print(f"Server-Timing header: {s['server_timing'] or 'none (Dash sends it only in debug mode)'}; "
          f"first render moved {s['first_render_all_wire_kb']:.0f} KB on the wire, "
          f"{s['first_render_dash_wire_kb']:.1f} KB of it Dash layout/callbacks; 1-min load average before/after "
          f"the loads {s['loadavg_1m_first_render'][0]:.2f}/{s['loadavg_1m_first_render'][1]:.2f} "
          f"on {s['cpus']} CPUs (the render is CPU-bound in Chromium)")
    print(f"a real Chromium page on / got these grid responses: {', '.join(real) or 'none'}")
    if s["update_kinds"].get("figure"):
        print(f"note: {s['update_kinds']['figure']} of {s['updates']} browser updates were whole figures: the "
              f"grid-key a browser sends back does not match the server's (an integer above 2**53 does not "
              f"survive a JavaScript number), so the diff path is never used by a real page")
    if args.json:
        print(json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
