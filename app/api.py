"""JSON API on the dashboard's own server. Reads are open; writes need a bearer token from
`POST /api/token` (or the browser's login session), and are validated by the same pydantic
model as the web form.

    POST   /api/token          {"username", "password"} -> {"token", "expires_in"}
    GET    /api/openapi.json   this API as OpenAPI 3.1 (app/openapi.py)
    GET    /api/health
    GET    /api/cluster        [?nodes=0 to leave out the per-node list]; each node with its slots (GPUs)
    GET    /api/jobs           [?state=running&owner=alice&limit=1000&offset=0]; each with the profiler's
                               confidence and its ranks (the slots of its nodes; simulated workers: the
                               GPUs it holds); a page in registration order: count, total, next
    POST   /api/jobs           JobSpec -> 201 job | 401 | 422 {"errors": {field: message}} | 429 (Retry-After:
                               over --user-jobs-per-minute or --user-jobs-per-day)
    GET    /api/jobs/<id>      with its curve, "why", and "profile" (what the profiler learned, or null)
    DELETE /api/jobs/<id>      -> 200 job | 401 | 403 (not yours) | 404 | 409 (already ended)
    POST   /api/jobs/<id>/resubmit  a failed or cancelled job continued as a new one from its checkpoint
                               -> 201 the new job | 401 | 403 | 404 | 409 (not ended so) | 422 (refused)
    GET    /api/jobs/<id>/logs [?lines=40]; the job's owner or staff: each worker's log's last lines
                               (an ended job's: read from its log files)
    GET    /api/jobs/<id>/events [?after=0&limit=100]; its events, oldest first, each with its seq;
                               `last` is the `after` of the next look, `next` the next page
    POST   /api/replay/<pause|resume|speed>    staff only; pause and resume take no body (or an ignored
                                               JSON object), speed {"speed": 1..3600}
    POST   /api/nodes/<name>/<reclaim|release> staff only, live mode with a static node source
    POST   /api/nodes/<name>/clear         staff only: a node held out after a fault of its own (lost), or skipped after failed Slurm pilots, is offered again
    POST   /api/workers/<job>/report           a job's workers, with the job's own token
    GET    /api/usage[.csv]    staff: node-seconds, GPU-seconds and samples [?from=&to=&by=owner|job|account]

A method an /api/ route does not take is a 405 whose Allow lists the ones it does (Dash's
catch-all page route would otherwise answer GET on every path); a path under /api/ that is no
route is a JSON 404; a documented query argument given twice, or out of its range, is a 400.
"""
from __future__ import annotations

import csv
import io
import math
from datetime import datetime, timezone
from typing import Callable, Optional
from urllib.parse import quote, urlencode

import flask
from flask import jsonify, request
from pydantic import ValidationError
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import Map, RequestRedirect, Rule

from core.explain import horizon_of, why
from core.model import LAUNCHER_TORCHRUN, JobState
from core.schemas import JobSpec, field_errors
from core.service import USAGE_BY, Conflict, TooManyRegistrations, Unsupported
from core.settings import SPEED_MAX, SPEED_MIN
from core.snapshot import BUSY, HELD, LOST_PREFIX

from . import context
from .auth import TOKEN_TTL_S
from .format import finite
from .job_list import jobs_page
from .openapi import (EPOCH_MAX, EPOCH_MIN, EVENTS_DEFAULT, EVENTS_MAX, LOG_LINES_DEFAULT, LOG_LINES_MAX,
                      OFFSET_MAX, PAGE_DEFAULT, PAGE_MAX, SEQ_MAX, document as api_document)
from .signin import Refused

STATE_NAMES = {BUSY: "busy", HELD: "harvested"}
JOB_STATES = tuple(s.value for s in JobState)


def _err(status: int, message: str, **extra):
    resp = jsonify({"error": message, **extra})
    resp.status_code = status
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="harvester"'
    return resp


def _job_json(j: dict) -> dict:
    return {k: j[k] for k in ("id", "name", "owner", "state", "nodes", "slots", "ranks", "min_nodes",
                              "max_nodes", "priority",
                              "samples_per_second", "samples_done", "total_samples", "progress", "eta",
                              "submit_time", "start_time", "end_time")} | {"confidence": j.get("confidence")}


bp = flask.Blueprint("api", __name__, url_prefix="/api")


def register(server: flask.Flask) -> None:
    server.register_blueprint(bp)
    server.before_request(_api_methods(server))


def _api_methods(server: flask.Flask) -> Callable[[], Optional[flask.Response]]:
    """A `before_request` that routes /api/ paths against the API's own rules: Dash's catch-all
    GET route matches every path too, so Flask alone would answer OPTIONS and 405 with an Allow
    naming GET on POST-only routes, and GET on them with the dashboard's HTML page."""
    prefix = bp.url_prefix + "/"
    routes = Map([Rule(r.rule, endpoint=r.endpoint, methods=r.methods) for r in server.url_map.iter_rules()
                  if r.rule.startswith(prefix)])

    def answer() -> Optional[flask.Response]:
        if not request.path.startswith(prefix):
            return None
        adapter = routes.bind_to_environ(request.environ)
        try:
            adapter.match(method=request.method)
        except MethodNotAllowed as e:
            allowed = ", ".join(sorted(e.valid_methods or ()))
            resp = _err(405, f"{request.method} is not a method of {request.path}; use {allowed}")
            resp.headers["Allow"] = allowed
            return resp
        except NotFound:
            return _err(404, f"no API route {request.path}; GET /api/openapi.json lists them")
        except RequestRedirect:
            return None
        if request.method == "OPTIONS":
            resp = flask.make_response("", 200)
            resp.headers["Allow"] = ", ".join(sorted(adapter.allowed_methods()))
            return resp
        return None
    return answer


class BadQuery(ValueError):
    """A query argument the document does not allow (given twice, or not one of its values): a 400."""


@bp.errorhandler(BadQuery)
def _bad_query(e: BadQuery) -> flask.Response:
    return _err(400, str(e))


def _arg(name: str) -> Optional[str]:
    """A documented query argument's one value, or None: a repeated one is ambiguous (which
    would count?), so it is refused rather than read as its first."""
    values = request.args.getlist(name)
    if len(values) > 1:
        raise BadQuery(f"{name}: give it once, not {len(values)} times")
    return values[0] if values else None


def _body_object(what: str) -> tuple[Optional[dict], Optional[flask.Response]]:
    """The JSON object a POST sends: (object, None), {} when it sends no body at all, or (None,
    400 response) for anything else (not JSON, a list, a NUL byte), which the document refuses."""
    if not request.get_data(cache=True):
        return {}, None
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return None, _err(400, f"send {what} as a JSON object, or no body")
    return body, None


@bp.post("/token")
def token():
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return _err(400, "send JSON {\"username\": ..., \"password\": ...}")
    try:
        user = context.gate.login(context.users, str(body.get("username", "")), str(body.get("password", "")),
                                  request.remote_addr or "")
    except Refused as e:
        resp = _err(e.status, str(e))
        resp.headers["Retry-After"] = str(e.retry_after)
        return resp
    if user is None:
        return _err(401, "wrong user name or password")
    return jsonify({"token": context.tokens.issue(user), "token_type": "Bearer",
                    "expires_in": TOKEN_TTL_S, "user": user.name, "role": user.role})


@bp.get("/openapi.json")
def openapi():
    return jsonify(api_document())


@bp.get("/health")
def health():
    h = context.harvester
    snap = h.snapshot
    ok = snap.status != "error" and h.problem is None
    store = h.store_problem        # writes failing: kept in memory, retried each flush
    replay = h.capabilities.can_restart
    body = {"status": "store failing" if ok and store else "ok" if ok else "error",
            "mode": "replay" if replay else "live", ("replay" if replay else "harvester"): snap.status,
            "time": snap.time, "seq": snap.seq, "nodes": len(snap.nodes), "jobs": len(snap.jobs),
            "error": h.problem}
    if store:
        body["store"] = store
        ok = False
    if snap.source_status:
        body["source"] = snap.source_status     # a stale source is shown, not an outage
    return jsonify(body), 200 if ok else 503


@bp.get("/cluster")
def cluster():
    snap = context.harvester.snapshot
    body = {"time": snap.time, "status": snap.status, "speed": context.harvester.speed,
            "kpis": snap.kpis, "config": snap.config}
    if snap.source_status:
        body["source"] = snap.source_status
    nodes = _arg("nodes")
    if nodes not in (None, "0", "1"):
        raise BadQuery("nodes: give 0 (no node list) or 1")
    if nodes != "0":
        body["nodes"] = [{"name": n, "state": STATE_NAMES.get(s, "idle"), "job": j, "since": t, "slots": k}
                         for n, s, j, t, k in zip(snap.nodes, snap.state, snap.job_of,
                                                  snap.since or [None] * len(snap.nodes),
                                                  snap.slots or [1] * len(snap.nodes))]
        for row, info in zip(body["nodes"], snap.node_info):
            row["source"] = info
            if row["state"] == "busy" and info.startswith(LOST_PREFIX):
                row["state"] = "lost"         # held out for a fault of its own until a check passes
    return jsonify(body)


def _whole_arg(name: str, default: int, top: int, least: int = 0) -> int:
    """A query argument that is a whole number in [least, top] in ASCII digits (str.isdigit
    also takes "²", which int() refuses, and int() refuses over 4,300 digits), else BadQuery."""
    text = _arg(name)
    if text is None:
        return default
    digits = text.lstrip("0") or text[:1]       # "000" is 0, "" stays empty
    if not (digits.isascii() and digits.isdigit() and len(digits) <= len(str(top))
            and least <= int(digits) <= top):
        raise BadQuery(f"{name}: give a whole number from {least} to {top}")
    return int(digits)


@bp.get("/jobs")
def jobs():
    """Jobs in registration order, a page at a time (`limit`, `offset`; `next` is the next page)."""
    snap = context.harvester.snapshot
    state, owner = _arg("state"), _arg("owner")
    if state is not None and state not in JOB_STATES:
        return _err(422, f"unknown state {state!r}; use one of {', '.join(JOB_STATES)}", states=list(JOB_STATES))
    limit = _whole_arg("limit", PAGE_DEFAULT, PAGE_MAX)
    offset = _whole_arg("offset", 0, OFFSET_MAX)
    match, total = jobs_page(snap, context.history, owner, state, offset, limit)   # ended jobs: the store's
    out = [_job_json(j) for j in match]
    after = offset + len(out)
    nxt = None
    if limit and after < total:        # limit 0 never gets further: no next page to follow
        nxt = "/api/jobs?" + urlencode({**request.args.to_dict(), "offset": after, "limit": limit})
    return jsonify({"jobs": out, "count": len(out), "total": total, "offset": offset, "limit": limit,
                    "next": nxt})


@bp.get("/jobs/<job_id>")
def job(job_id):
    h = context.harvester
    snap = h.snapshot
    job = h.job(job_id)
    info = snap.line(job) if job is not None else None     # an ended job the snapshot no longer lists: as stored
    if info is None or job is None:
        return _err(404, f"no job {job_id}")
    body = _job_json(info)
    body["curve"] = job.curve.to_dict()
    body["scale_up_seconds"], body["scale_down_seconds"] = job.scale_up_seconds, job.scale_down_seconds
    body["launcher"] = job.launcher
    if job.run_as:
        body["run_as"] = job.run_as
    if job.launcher == LAUNCHER_TORCHRUN:
        body["progress_pattern"], body["stop_grace_seconds"] = job.progress_pattern, job.stop_grace_seconds
        if job.samples_per_step:
            body["samples_per_step"] = job.samples_per_step
    st = h.worker_status(job_id) or job.story
    if job.failure:
        body["failure"] = job.failure
    if job.resubmitted_from:
        body["resubmitted_from"] = job.resubmitted_from
    if job.requeues:
        body["requeues"] = job.requeues
    if st:
        body["workers"] = {k: st.get(k) for k in ("generation", "world_size", "nodes", "members", "regrouping",
                                                 "committed_step", "loss", "losses", "metrics", "lost", "last_rescale",
                                                 "generations", "progressing", "restart_count",
                                                 "lost_samples", "last_output")}
    profile = h.profile(job_id)
    body["profile"] = finite(profile)
    span, learned = horizon_of(snap.config, job_id)
    body["why"] = why(job, info["nodes"], snap.kpis.get("idle", 0), snap.kpis.get("harvested", 0),
                      snap.kpis.get("running", 0), snap.config.get("max_jobs", 0),
                      span, snap.config.get("policy", ""), profile=profile, learned=learned,
                      quota=info.get("quota"), node_cap=info.get("node_cap"))
    return jsonify(body)


def _owned_job(job_id: str, what: str):
    """The job, when the logged-in user owns it or is staff: (job, None), else (None, error
    response); `what` words the refusal ("cancel it")."""
    user = context.current_user()
    if user is None:
        return None, _err(401, "log in: send Authorization: Bearer <token from POST /api/token>")
    job = context.harvester.job(job_id)
    if job is None:
        return None, _err(404, f"no job {job_id}")
    if not user.may_cancel(job.owner):
        return None, _err(403, f"job {job_id} belongs to {job.owner or 'the job set'}; only its owner or staff may {what}")
    return job, None


@bp.get("/jobs/<job_id>/logs")
def job_logs(job_id):
    """The last lines of a job's worker logs, rank 0's first: its owner's and staff's to read."""
    job, refused = _owned_job(job_id, "read its logs")
    if refused:
        return refused
    h = context.harvester
    lines = _whole_arg("lines", LOG_LINES_DEFAULT, LOG_LINES_MAX, least=1)
    workers = h.worker_logs(job_id, lines)
    if not workers and job.failure and job.failure.get("tail"):
        workers = {job.failure.get("node") or "worker": job.failure["tail"][-lines:]}
    return jsonify({"job": job_id, "state": job.state.value, "workers": workers})


@bp.get("/jobs/<job_id>/events")
def job_events(job_id):
    """The job's events from the store, oldest first, after the sequence number `after`: a page
    of at most `limit`, and `last` to ask after next time (open to read, as the job page is)."""
    if context.harvester.job(job_id) is None:
        return _err(404, f"no job {job_id}")
    after = _whole_arg("after", 0, SEQ_MAX)
    limit = _whole_arg("limit", EVENTS_DEFAULT, EVENTS_MAX, least=1)
    rows = context.history.job_events_after(job_id, after, limit + 1)
    more, rows = len(rows) > limit, rows[:limit]
    last = rows[-1]["seq"] if rows else after
    nxt = f"/api/jobs/{quote(job_id, safe='')}/events?" + urlencode({"after": last, "limit": limit}) if more else None
    return jsonify({"job": job_id, "events": rows, "count": len(rows), "after": after, "limit": limit,
                    "last": last, "next": nxt})


@bp.post("/jobs")
def submit():
    user = context.current_user()
    if user is None:
        return _err(401, "log in: send Authorization: Bearer <token from POST /api/token>")
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return _err(400, "send the job as a JSON object")
    try:
        spec = JobSpec.model_validate(body)
    except ValidationError as e:
        return _err(422, "invalid job", errors=field_errors(e))
    return _register(lambda: context.harvester.submit(spec, user.name, staff=user.is_staff, unix=user.unix))


def _register(call: Callable, missing: str = "", **extra):
    """Run a registration (a new job, or a resubmitted one) and answer it: 201 with the job, or
    why not (404 `missing`: the job it continues is gone, 409 not here or not now, 422 invalid,
    429 over the owner's registrations per minute or day, 503 not stored)."""
    try:
        job = call()
    except KeyError:
        if not missing:
            raise
        return _err(404, missing)
    except (Conflict, Unsupported) as e:
        return _err(409, str(e))
    except TooManyRegistrations as e:
        resp = _err(429, str(e).partition(": ")[2] or str(e))
        resp.headers["Retry-After"] = str(e.retry_after)
        return resp
    except ValueError as e:
        field, _, msg = str(e).partition(": ")
        return _err(422, "invalid job", errors={field: msg} if msg else {"job": str(e)})
    except RuntimeError as e:
        return _err(503, str(e))
    return _created(job, **extra)


def _created(job, **extra):
    """201 with the registered job as the API shows it, and where to find it."""
    info = context.harvester.snapshot.job(job.id)
    body = _job_json(info) if info else {"id": job.id, "name": job.name, "owner": job.owner, "state": job.state.value}
    resp = jsonify({**body, **extra})
    resp.status_code = 201
    resp.headers["Location"] = f"/api/jobs/{quote(job.id, safe='')}"
    return resp


@bp.post("/jobs/<job_id>/resubmit")
def resubmit(job_id):
    """A failed or cancelled job continued as a new job (its owner's) from its last checkpoint
    and sample count, registered as any job is: the old one's owner or staff."""
    _, refused = _owned_job(job_id, "resubmit it")
    if refused:
        return refused
    _, bad = _body_object("nothing")
    if bad:
        return bad
    user = context.current_user()
    return _register(lambda: context.harvester.resubmit(job_id, user.name, staff=user.is_staff, unix=user.unix),
                     missing=f"no job {job_id}", resubmitted_from=job_id)


@bp.delete("/jobs/<job_id>")
def cancel(job_id):
    _, refused = _owned_job(job_id, "cancel it")
    if refused:
        return refused
    h = context.harvester
    try:
        h.cancel(job_id)
    except ValueError as e:
        return _err(409, str(e))
    except RuntimeError as e:
        return _err(503, str(e))
    info = h.snapshot.job(job_id)
    return jsonify(_job_json(info) if info else {"id": job_id, "state": "cancelled"})


def _not_staff(what: str):
    """The error response for a request that is not a logged-in staff member's, else None."""
    user = context.current_user()
    if user is None:
        return _err(401, "log in first")
    if not user.is_staff:
        return _err(403, f"only staff may {what}")
    return None


@bp.post("/replay/<command>")
def replay(command):
    refused = _not_staff("control the harvester")
    if refused:
        return refused
    h = context.harvester
    if command not in ("pause", "resume", "speed"):
        return _err(404, f"unknown command {command}; use pause, resume or speed")
    body, bad = _body_object('{"speed": ...}' if command == "speed" else "nothing")
    if bad:
        return bad
    speed = body.get("speed")
    if command == "speed" and (isinstance(speed, bool) or not isinstance(speed, (int, float))):
        return _err(422, f"speed: give a number from {SPEED_MIN:g} to {SPEED_MAX:g} (times real time)")
    try:
        if command == "pause":
            h.pause()
        elif command == "resume":
            h.resume()
        else:
            h.set_speed(float(speed))
    except (ValueError, TypeError, OverflowError) as e:
        return _err(422, str(e))
    except Unsupported as e:
        return _err(409, str(e))
    except RuntimeError as e:
        return _err(503, str(e))
    return jsonify({"status": h.snapshot.status, "speed": h.speed})


@bp.post("/workers/<job_id>/report")
def worker_report(job_id):
    """Progress from a job's workers, authenticated by the job's own token (not a user's)."""
    h = context.harvester
    if not h.capabilities.runs_workers:
        return _err(404, "this server runs no workers")
    status = h.worker_report(job_id, request.headers.get("Authorization"), request.get_data())
    if status == 204:
        return "", 204
    return _err(status, {401: "refused: wrong job token", 413: "report too large"}.get(status, "send a JSON object"))


@bp.post("/nodes/<node>/<command>")
def node(node, command):
    """Staff play the node owner on a static source (take a node back, give it again), or clear
    a node held out after a fault of its own (or a Slurm node skipped after failed pilots) so
    that it is offered again at once."""
    refused = _not_staff("reclaim, release or clear nodes")
    if refused:
        return refused
    h = context.harvester
    if command not in ("reclaim", "release", "clear"):
        return _err(404, f"unknown command {command}; use reclaim, release or clear")
    _, bad = _body_object("nothing")
    if bad:
        return bad
    if command == "clear" and not h.capabilities.clears_nodes:
        return _err(409, "this server holds no node out after failures (simulated workers, or a replay)")
    if command != "clear" and not h.capabilities.operates_nodes:
        return _err(409, "this server's node source is not operated by hand")
    try:
        if command == "clear":
            return jsonify({"node": node, "command": command, "cleared": h.clear_node(node)})
        (h.reclaim_node if command == "reclaim" else h.release_node)(node)
    except KeyError:
        return _err(404, f"no node {node}")
    return jsonify({"node": node, "command": command})


def _time_arg(name: str) -> Optional[float]:
    """`from`/`to`: epoch seconds, or an ISO 8601 date-time (UTC when it names no zone)."""
    text = _arg(name)
    if text is None:
        return None
    try:
        t = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise BadQuery(f"{name}: give epoch seconds or an ISO 8601 date-time such as 2021-02-10T00:00:00Z, "
                           f"not {text[:40]!r}") from None
        t = (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()
    if not (math.isfinite(t) and EPOCH_MIN <= t <= EPOCH_MAX):
        raise BadQuery(f"{name}: give a time from year 1 to 9999, not {text[:40]!r}")
    return t


def _usage_report(series: bool = False):
    """The usage report the query asks for: (report, None) or (None, error response)."""
    refused = _not_staff("read usage")
    if refused:
        return None, refused
    start, end, by = _time_arg("from"), _time_arg("to"), _arg("by") or "owner"
    if by not in USAGE_BY:
        raise BadQuery(f"by: give one of {', '.join(USAGE_BY)}, not {by[:40]!r}")
    if start is not None and end is not None and end <= start:
        raise BadQuery("to: give a time after from")
    return context.harvester.usage(start, end, by, context.users.accounts(), series=series), None


@bp.get("/usage")
def usage():
    """Node-seconds, GPU-seconds and samples per owner, job or account, from the store's history."""
    rep, refused = _usage_report()
    return refused or jsonify(rep.to_dict())


def _cell(text: Optional[str]) -> str:
    """A text cell a spreadsheet shows as text: a job's name or an owner starting with = + - @
    would otherwise run as a formula."""
    if text is None:
        return ""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


USAGE_COLUMNS = ("jobs", "node_seconds", "gpu_seconds", "node_hours", "samples", "idle_share")


@bp.get("/usage.csv")
def usage_csv():
    """The same report as CSV, a line per row and a last line `total`, for a spreadsheet."""
    rep, refused = _usage_report()
    if refused:
        return refused
    body = rep.to_dict()
    keys = {"owner": ("owner", "account"), "job": ("job", "name", "owner", "account"), "account": ("account",)}[rep.by]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([*keys, *USAGE_COLUMNS])
    for row in body["rows"]:
        w.writerow([*(_cell(row.get(k)) for k in keys),
                    *("" if row[c] is None else row[c] for c in USAGE_COLUMNS)])
    total = body["total"]
    w.writerow(["total", *[""] * (len(keys) - 1), *("" if total[c] is None else total[c] for c in USAGE_COLUMNS)])
    resp = flask.Response(out.getvalue(), mimetype="text/csv")
    resp.headers["Content-Disposition"] = f'attachment; filename="usage-by-{rep.by}.csv"'
    return resp
