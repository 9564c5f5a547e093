"""What protects a browser's session: writes from other origins are refused (CSRF), and every
response carries the security headers (a CSP that Dash runs under, no framing, no sniffing).

A write (any method but GET/HEAD/OPTIONS) whose `Origin`, or else `Referer`, names another
host:port than the request's `Host` gets 403; so does a write that carries the session cookie but
neither header. Clients without cookies (curl, the Python client, workers) send neither and pass:
they authenticate with a bearer token, which another site cannot make a browser send.
"""
from __future__ import annotations

from typing import Optional
from urllib.parse import urlsplit

import dash
import flask

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
STATIC_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def csrf_refusal(request: flask.Request, session_cookie: str) -> Optional[str]:
    """Why this request is refused as a cross-site write, or None."""
    if request.method in SAFE_METHODS:
        return None
    host = (request.host or "").lower()
    for header in ("Origin", "Referer"):
        value = request.headers.get(header)
        if value is not None:
            if urlsplit(value).netloc.lower() == host:
                return None
            return f"refused: a write from another origin ({header}: {value[:100]})"
    if session_cookie in request.cookies:
        return "refused: a write with this site's session cookie must say where it comes from (Origin or Referer)"
    return None


def content_security_policy(app: dash.Dash) -> str:
    """Scripts only from this server plus Dash's own inline ones (by hash); Plotly needs inline
    styles and data: images."""
    scripts = " ".join(["'self'", *app.csp_hashes()])
    return "; ".join([
        "default-src 'self'", f"script-src {scripts}", "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:", "font-src 'self' data:", "connect-src 'self'",
        "object-src 'none'", "base-uri 'self'", "form-action 'self'", "frame-ancestors 'none'"])


def protect(app: dash.Dash) -> None:
    server = app.server
    csp: list[str] = []        # computed at the first response, once every page's callbacks exist

    @server.before_request
    def refuse_cross_site_writes():
        why = csrf_refusal(flask.request, server.config["SESSION_COOKIE_NAME"])
        if why:
            return flask.jsonify({"error": why}), 403
        return None

    @server.after_request
    def security_headers(resp: flask.Response) -> flask.Response:
        if not csp:
            csp.append(content_security_policy(app))
        resp.headers.setdefault("Content-Security-Policy", csp[0])
        for name, value in STATIC_HEADERS.items():
            resp.headers.setdefault(name, value)
        return resp
