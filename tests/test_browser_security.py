"""The web tier's browser-facing protections, in a real Chromium against a live server (4
simulated nodes): login form and POST-only logout, cross-origin writes refused, the CSP that the
dashboard runs under with no violation, and job names shown as text in Plotly's hover."""
from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.browser import login, shoot
from tests.support.server import browser_or_skip, start_app
from tests.support.waiting import wait

sync_api = browser_or_skip()
PAGES = ("/", "/jobs", "/allocator", "/replay", "/login")
HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    app = start_app(tmp_path_factory.mktemp("websec"), "--fresh", "--dispatch", "simulated",
                    "--local-nodes", "4", "--tick", "0.1")
    yield app
    app.stop()


class Watched:
    """A page and everything that went wrong on it: CSP violations, page errors, failed callbacks."""

    def __init__(self, page):
        self.page = page
        self.problems: list[str] = []
        page.on("console", lambda m: self.problems.append(f"console: {m.text}")
                if m.type == "error" and "Content Security Policy" in m.text else None)
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on("response", lambda r: self.problems.append(f"{r.status} {r.url}")
                if "/_dash-update-component" in r.url and r.status >= 400 else None)


@pytest.fixture
def staff(browser, server):
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    w = Watched(ctx.new_page())
    login(w.page, server.url, "staff1")
    yield w
    ctx.close()
    assert not w.problems, w.problems


@pytest.fixture
def attacker():
    """Another site on this host (another port): serves a page that posts a form to `target`."""
    pages: dict[str, str] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages.get(self.path, "").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def page_posting_to(target: str) -> str:
        path = f"/p{len(pages)}"
        pages[path] = (f'<form id="f" method="post" action="{target}"><input name="x" value="1"></form>'
                       '<script>document.getElementById("f").submit()</script>')
        return f"http://127.0.0.1:{httpd.server_address[1]}{path}"
    yield page_posting_to
    httpd.shutdown()


def test_cross_origin_form_posts_are_refused(server, staff, attacker):
    page = staff.page
    node = server.get("/api/cluster")[1]["nodes"][0]["name"]
    for path in ("/api/replay/pause", f"/api/nodes/{node}/reclaim"):
        with page.expect_response(lambda r: r.url.endswith(path)) as answer:
            page.goto(attacker(server.url + path))
        assert answer.value.status == 403, (path, answer.value.text())
        assert "another origin" in answer.value.json()["error"]
    _, cluster = server.get("/api/cluster")
    assert cluster["status"] != "paused" and cluster["nodes"][0]["state"] != "busy", cluster["status"]
    # the control: the same cookie, from the dashboard's own origin, is obeyed
    page.goto(server.url + "/replay")
    status = page.evaluate("fetch('/api/replay/pause', {method: 'POST'}).then(r => r.status)")
    assert status == 200
    assert wait(lambda: server.get("/api/cluster")[1]["status"] == "paused", 5.0, fail=False)
    assert page.evaluate("fetch('/api/replay/resume', {method: 'POST'}).then(r => r.status)") == 200


def test_logout_is_a_post_and_a_link_logs_nobody_out(server, staff, attacker):
    page = staff.page
    page.goto(server.url + "/login?logout=1")
    page.goto(server.url + "/jobs")
    page.wait_for_function("() => (document.querySelector('#nav-user')?.innerText || '').includes('staff1')",
                           timeout=10_000)
    with page.expect_response(lambda r: r.url.endswith("/logout")) as answer:
        page.goto(attacker(server.url + "/logout"))
    assert answer.value.status == 403
    page.goto(server.url + "/jobs")
    page.wait_for_function("() => (document.querySelector('#nav-user')?.innerText || '').includes('staff1')",
                           timeout=10_000)
    page.click("#logout")
    page.wait_for_url(re.compile(r".*/login$"), timeout=10_000)
    page.wait_for_function("() => (document.querySelector('#login-result')?.innerText || '').includes('Logged out')",
                           timeout=10_000)
    page.goto(server.url + "/jobs")
    page.wait_for_function("() => (document.querySelector('#nav-user')?.innerText || '').includes('Log in')",
                           timeout=10_000)


def test_every_page_renders_under_the_csp_with_its_headers(server, staff):
    page = staff.page
    responses = []
    page.on("response", lambda r: responses.append(r))
    job = server.request("POST", "/api/jobs", {"name": "csp probe", "min_nodes": 1, "max_nodes": 2,
                                               "total_samples": 1e12, "curve": "1:100, 2:200"},
                         token=server.token("alice"))[1]["id"]
    for path in (*PAGES, f"/jobs/{job}"):
        page.goto(server.url + path)
        page.wait_for_function("() => document.querySelector('#nav-user')?.innerText", timeout=15_000)
    page.goto(server.url + "/")
    page.wait_for_function("() => { const g = document.querySelector('#grid .js-plotly-plot');"
                           " return !!(g && g.data && g.data[0].z); }", timeout=15_000)
    shoot(page, "csp-cluster")
    seen = {r.url.removeprefix(server.url).split("?")[0] for r in responses if r.url.startswith(server.url)}
    assert "/_dash-update-component" in seen and any(s.startswith("/_dash-component-suites/") for s in seen)
    for r in responses:
        if r.url.startswith(server.url):
            missing = [h for h in HEADERS if not r.header_value(h)]
            assert not missing, (r.url, missing)
    csp = responses[0].header_value("Content-Security-Policy")
    assert "'unsafe-eval'" not in csp and "frame-ancestors 'none'" in csp
    server.request("DELETE", f"/api/jobs/{job}", token=server.token("alice"))


@pytest.mark.parametrize("path", [*PAGES, "/api/health", "/api/jobs", "/metrics", "/no-such-page",
                                  "/assets/style.css", "/api/jobs/nope"])
def test_headers_on_every_response(server, path):
    import urllib.request, urllib.error
    try:
        r = urllib.request.urlopen(server.url + path, timeout=10)
    except urllib.error.HTTPError as e:
        r = e
    assert all(r.headers.get(h) for h in HEADERS), (path, dict(r.headers))
    assert r.headers["X-Frame-Options"] == "DENY" and r.headers["X-Content-Type-Options"] == "nosniff"


def test_a_job_name_with_tags_shows_the_tags_in_the_grids_hover(server, staff):
    name = "<b>x</b> & <br>y"
    job = server.request("POST", "/api/jobs", {"name": name, "min_nodes": 1, "max_nodes": 4, "priority": 100,
                                               "total_samples": 1e12, "curve": "1:1000, 4:4000"},
                         token=server.token("alice"))[1]["id"]
    page = staff.page
    page.goto(server.url + "/")
    cell = wait(lambda: page.evaluate(
        "(job) => { const g = document.querySelector('#grid .js-plotly-plot');"
        " if (!g || !g.data || !g.data[0].text) return null;"
        " const t = g.data[0].text; for (let r = 0; r < t.length; r++) for (let c = 0; c < t[r].length; c++)"
        "   if (t[r][c] && t[r][c].includes(job)) return [r, c]; return null; }", job), 15.0)
    x, y = page.evaluate(
        "([r, c]) => { const g = document.querySelector('#grid .js-plotly-plot'), L = g._fullLayout,"
        " box = g.getBoundingClientRect(), xs = g.data[0].x, ys = g.data[0].y;"
        " return [box.left + L._size.l + L.xaxis.d2p(xs ? xs[c] : c), box.top + L._size.t + L.yaxis.d2p(ys ? ys[r] : r)]; }",
        cell)
    page.mouse.move(x, y)
    page.wait_for_selector("#grid .hoverlayer .hovertext", timeout=5_000)
    shown = page.evaluate("() => document.querySelector('#grid .hoverlayer .hovertext').textContent")
    assert name in shown, shown
    assert page.locator("#grid .hoverlayer .hovertext tspan[style*='bold']").count() <= 1   # the node name only
    shoot(page, "hover-escaped")
    server.request("DELETE", f"/api/jobs/{job}", token=server.token("alice"))


def test_a_throttled_login_says_when_to_try_again(server, browser):
    ctx = browser.new_context(viewport={"width": 1000, "height": 500})
    page = ctx.new_page()
    statuses = []
    page.on("response", lambda r: statuses.append(r.status) if r.url.endswith("/login") and
            r.request.method == "POST" else None)
    for _ in range(6):
        page.goto(server.url + "/login")
        page.fill("#login-user", "bob")
        page.fill("#login-password", "not-bob's-password")
        page.click("#login-submit")
        page.wait_for_function("() => document.querySelector('#login-result')?.innerText", timeout=10_000)
    assert statuses == [401] * 5 + [429], statuses
    assert re.search(r"Too many failed logins; try again in \d+ s\.", page.inner_text("#login-result"))
    shoot(page, "login-throttled")
    ctx.close()
