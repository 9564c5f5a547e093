"""The REST API described as OpenAPI 3.1 (`GET /api/openapi.json`), its request body generated
from the same pydantic model that checks the form and the API, so the document cannot drift
from the rules; the responses are described by hand, as loosely as the clients may rely on."""
from __future__ import annotations

from typing import Any

from core.model import JobState
from core.schemas import JobSpec
from core.service import USAGE_BY
from core.settings import SPEED_MAX, SPEED_MIN

PAGE_DEFAULT, PAGE_MAX = 1000, 10000      # GET /api/jobs: jobs per page by default, at most
OFFSET_MAX = 2**31 - 1                    # GET /api/jobs: the largest offset (past the last job: an empty page)
LOG_LINES_DEFAULT, LOG_LINES_MAX = 40, 500  # GET /api/jobs/<id>/logs: lines per worker by default, at most
EVENTS_DEFAULT, EVENTS_MAX = 100, 1000     # GET /api/jobs/<id>/events: events per page by default, at most
SEQ_MAX = 2**63 - 1                       # GET /api/jobs/<id>/events: the largest `after` (SQLite's largest row id)
EPOCH_MIN, EPOCH_MAX = -62135596800, 253402300799   # GET /api/usage: from/to, year 1 to 9999 in epoch seconds

REF = "#/components/schemas/{model}"
JSON = "application/json"


def _job_spec_schemas() -> dict[str, Any]:
    spec = JobSpec.model_json_schema(ref_template=REF)
    defs = spec.pop("$defs", {})
    props = spec["properties"]
    # the text forms that the model's "before" validators also take
    props["curve"]["anyOf"].insert(1, {"type": "string", "description": 'nodes:samples/s pairs, "1:1200, 8:9000"'})
    props["command"]["anyOf"].insert(1, {"type": "string", "description": "split as a shell would split it"})
    props["curve"]["description"] = ("samples/s at each node count; required where no real workers run (a replay "
                                     "or the simulated dispatcher: a 422 without it), else the profiler learns it")
    return {"JobSpec": spec, **defs}


def _error(description: str) -> dict:
    return {"description": description, "content": {JSON: {"schema": {"$ref": REF.format(model="Error")}}}}


def _retry(description: str) -> dict:
    return {**_error(description), "headers": {"Retry-After": {"schema": {"type": "integer"},
                                                               "description": "seconds to wait"}}}


def _ok(description: str, model: str, status: str = "200") -> dict:
    return {status: {"description": description, "content": {JSON: {"schema": {"$ref": REF.format(model=model)}}}}}


AUTH_ERRORS = {"401": _error("no login, or a token that is wrong, expired or revoked"),
               "403": _error("not allowed for this user, or a write from another origin")}
BAD_BODY = {"400": _error("the body is not the JSON object asked for"),
            "413": {"description": "the body is over 1 MiB"}}
#: a POST that needs no body: none, or a JSON object that it ignores (anything else is a 400)
NO_BODY = {"required": False, "description": "none needed; a JSON object is taken and ignored",
           "content": {JSON: {"schema": {"type": "object"}}}}


def document(version: str = "1") -> dict:
    job_id = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
    secured = [{"bearer": []}]
    schemas = {
        **_job_spec_schemas(),
        "Error": {"type": "object", "required": ["error"],
                  "properties": {"error": {"type": "string"},
                                 "errors": {"type": "object", "additionalProperties": {"type": "string"},
                                            "description": "one message per field at fault"}}},
        "Credentials": {"type": "object", "required": ["username", "password"],
                        "properties": {"username": {"type": "string"}, "password": {"type": "string"}}},
        "Token": {"type": "object", "required": ["token", "token_type", "expires_in", "user", "role"],
                  "properties": {"token": {"type": "string"}, "token_type": {"const": "Bearer"},
                                 "expires_in": {"type": "integer"}, "user": {"type": "string"},
                                 "role": {"enum": ["staff", "user"]}}},
        "Job": {"type": "object", "required": ["id", "name", "owner", "state"],
                "properties": {"id": {"type": "string"}, "name": {"type": "string"}, "owner": {"type": "string"},
                               "state": {"type": "string"}, "nodes": {"type": ["integer", "null"]},
                               "ranks": {"type": ["integer", "null"]},
                               "progress": {"type": ["number", "null"]},
                               "run_as": {"type": "string",
                                          "description": "one job: the Unix account its command runs as, where "
                                                         "the site maps logins (absent: the harvester's own)"},
                               "failure": {"anyOf": [{"$ref": REF.format(model="Failure")}, {"type": "null"}],
                                           "description": "one failed job: why it failed (absent otherwise)"},
                               "resubmitted_from": {"type": "string",
                                                    "description": "the failed or cancelled job it continues "
                                                                   "(absent: none)"},
                               "requeues": {"type": "integer",
                                            "description": "one job: times a failure of its nodes only sent it "
                                                           "back to the queue (absent: none)"}}},
        "Failure": {"type": "object", "required": ["kind", "message"],
                    "properties": {"kind": {"type": "string",
                                            "description": 'what went wrong: "command_not_found", "exception", '
                                                           '"out_of_memory", "rendezvous", "exit_status", ...'},
                                   "node": {"type": ["string", "null"], "description": "where (null: no one node)"},
                                   "message": {"type": "string"},
                                   "hint": {"type": "string", "description": "what to do about it"},
                                   "tail": {"type": "array", "items": {"type": "string"},
                                            "description": "that worker's log's last lines"},
                                   "address": {"type": "string",
                                               "description": "rendezvous: the host:port that could not be reached"}}},
        "Logs": {"type": "object", "required": ["job", "state", "workers"],
                 "properties": {"job": {"type": "string"}, "state": {"type": "string"},
                                "workers": {"type": "object",
                                            "additionalProperties": {"type": "array", "items": {"type": "string"}},
                                            "description": "each worker's log's last lines, rank 0's worker first"}}},
        "Event": {"type": "object", "required": ["seq", "time", "kind"],
                  "properties": {"seq": {"type": "integer", "description": "its sequence number: increasing, "
                                                                           "the `after` of the next look"},
                                 "time": {"type": "number", "description": "epoch seconds (a replay: its clock)"},
                                 "kind": {"type": "string", "description": 'e.g. "job_submit", "probe", '
                                                                           '"job_rescaled", "job_trouble", '
                                                                           '"node_leave", "job_done", "job_failed"'},
                                 "node": {"type": ["string", "null"]}, "detail": {"type": ["string", "null"]}}},
        "Events": {"type": "object", "required": ["job", "events", "count", "after", "limit", "last", "next"],
                   "properties": {"job": {"type": "string"},
                                  "events": {"type": "array", "items": {"$ref": REF.format(model="Event")}},
                                  "count": {"type": "integer"}, "after": {"type": "integer"},
                                  "limit": {"type": "integer"},
                                  "last": {"type": "integer", "description": "the last event's seq (`after` when "
                                                                             "none came): ask again after it"},
                                  "next": {"type": ["string", "null"], "description":
                                           "the next page's URL while more events are stored; null on the last"}}},
        "NodeCommand": {"type": "object", "required": ["node", "command"],
                        "properties": {"node": {"type": "string"},
                                       "command": {"enum": ["reclaim", "release", "clear"]},
                                       "cleared": {"type": "boolean",
                                                   "description": "clear: whether the node was held out "
                                                                  "or being skipped"}}},
        "JobList": {"type": "object", "required": ["jobs"],
                    "properties": {"jobs": {"type": "array", "items": {"$ref": REF.format(model="Job")}},
                                   "count": {"type": "integer"}, "total": {"type": "integer"},
                                   "offset": {"type": "integer"}, "limit": {"type": "integer"},
                                   "next": {"type": ["string", "null"], "description":
                                            "the next page's URL; null on the last, and with limit 0"}}},
        "Health": {"type": "object", "required": ["status"],
                   "properties": {"status": {"enum": ["ok", "error", "store failing"]}, "replay": {"type": "string"},
                                  "store": {"type": "object", "description": "present while the store is failing"}}},
        "Cluster": {"type": "object", "required": ["kpis"],
                    "properties": {"kpis": {"type": "object"}, "nodes": {"type": "array"}}},
        "Status": {"type": "object"},
        "UsageTotals": {"type": "object",
                        "required": ["jobs", "node_seconds", "gpu_seconds", "node_hours", "samples", "idle_share"],
                        "properties": {"jobs": {"type": "integer"}, "node_seconds": {"type": "number"},
                                       "gpu_seconds": {"type": "number"}, "node_hours": {"type": "number"},
                                       "samples": {"type": ["number", "null"],
                                                   "description": "null: not a finite number (every answer is "
                                                                  "strict JSON)"},
                                       "idle_node_seconds": {"type": "number",
                                                             "description": "total only: node-seconds idle in the window"},
                                       "idle_share": {"type": ["number", "null"],
                                                      "description": "of the idle node-seconds in the window "
                                                                     "(null: none were idle)"},
                                       "owner": {"type": "string"}, "job": {"type": "string"},
                                       "name": {"type": "string"},
                                       "account": {"type": ["string", "null"],
                                                   "description": "the users file's account of the owner, "
                                                                  "as it is now (null: none)"}}},
        "Usage": {"type": "object", "required": ["from", "to", "by", "rows", "total"],
                  "properties": {"from": {"type": "number"}, "to": {"type": "number",
                                                                    "description": "at most the last save"},
                                 "by": {"enum": list(USAGE_BY)},
                                 "rows": {"type": "array", "items": {"$ref": REF.format(model="UsageTotals")}},
                                 "total": {"$ref": REF.format(model="UsageTotals")}}},
    }
    when = {"anyOf": [{"type": "number", "minimum": EPOCH_MIN, "maximum": EPOCH_MAX},
                      {"type": "string", "format": "date-time"}]}
    usage_params = [
        {"name": "from", "in": "query", "schema": when,
         "description": "epoch seconds or ISO 8601 (UTC without a zone); default: the first record"},
        {"name": "to", "in": "query", "schema": when,
         "description": "after from; default, and at most: the store's last save"},
        {"name": "by", "in": "query", "schema": {"enum": list(USAGE_BY)}, "description": "default owner"}]
    usage_errors = {"400": _error("from or to is not a time, to is not after from, by is not one of its values, or "
                                  "a parameter is given twice"),
                    "401": AUTH_ERRORS["401"], "403": _error("only staff read usage")}
    paths = {
        "/api/token": {"post": {
            "summary": "a bearer token for a user (7 days, or until the password changes)",
            "requestBody": {"required": True, "content": {JSON: {"schema": {"$ref": REF.format(model="Credentials")}}}},
            "responses": {**_ok("the token", "Token"), **BAD_BODY, "401": _error("wrong user name or password"),
                          "403": AUTH_ERRORS["403"],
                          "429": _retry("too many failed logins for this user or address"),
                          "503": _retry("every password check slot is busy")}}},
        "/api/health": {"get": {"summary": "is the harvester running",
                                "responses": {**_ok("running", "Health"),
                                              "503": {"description": "stopped on an error, or the store is failing",
                                                      "content": {JSON: {"schema": {"$ref": REF.format(model="Health")}}}}}}},
        "/api/cluster": {"get": {
            "summary": "KPIs, controller settings and every node",
            "parameters": [{"name": "nodes", "in": "query", "schema": {"enum": ["0", "1"]},
                            "description": "0: leave out the per-node list"}],
            "responses": {**_ok("the cluster", "Cluster"), "400": _error("nodes is not 0 or 1, or given twice")}}},
        "/api/jobs": {
            "get": {"summary": "every job", "parameters": [
                {"name": "state", "in": "query", "schema": {"enum": [s.value for s in JobState]}},
                {"name": "owner", "in": "query", "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": PAGE_MAX},
                 "description": f"jobs per page (default {PAGE_DEFAULT})"},
                {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": OFFSET_MAX},
                 "description": "jobs to skip (past the last one: an empty page)"}],
                "responses": {**_ok("the jobs, a page at a time", "JobList"),
                              "400": _error("limit or offset is not a whole number in range, or a "
                                            "parameter is given twice"),
                              "422": _error("an unknown state (`states` lists them)")}},
            "post": {"summary": "register a job", "security": secured,
                     "requestBody": {"required": True, "content": {JSON: {"schema": {"$ref": REF.format(model="JobSpec")}}}},
                     "responses": {**_ok("registered (Location: its URL)", "Job", "201"), **BAD_BODY, **AUTH_ERRORS,
                                   "422": _error("refused: `errors` says why, per field (a rule across fields "
                                                 "such as max_nodes at least min_nodes, a progress_pattern "
                                                 "RE2 compiles with a group, a curve positive at some size, no "
                                                 "curve where no real workers run, a job too large for this site, "
                                                 "too many jobs of this user, or a command this user may not run "
                                                 "here); nothing stored"),
                                   "409": _error("the replay has ended: nothing would run the job"),
                                   "429": _retry("this user registered their most jobs per minute or per day "
                                                 "(cancelled ones count too); nothing stored"),
                                   "503": _error("the harvester is not running, or the store is failing")}}},
        "/api/jobs/{job_id}": {
            "parameters": [job_id],
            "get": {"summary": "one job with its curve and why it holds what it holds",
                    "responses": {**_ok("the job", "Job"), "404": _error("no such job")}},
            "delete": {"summary": "cancel a job (its owner, or staff)", "security": secured,
                       "description": "The job is stopped, not forgotten: GET still answers it, in state "
                                      "`cancelled`, and a second DELETE is a 409.",
                       "responses": {**_ok("cancelled", "Job"), **AUTH_ERRORS, "404": _error("no such job"),
                                     "409": _error("the job has already ended"),
                                     "503": _error("the harvester is not running")}}},
        "/api/jobs/{job_id}/resubmit": {
            "parameters": [job_id],
            "post": {"summary": "continue a failed or cancelled job as a new one from its last checkpoint (its "
                                "owner, or staff)", "security": secured, "requestBody": NO_BODY,
                     "description": "The new job (a new id, the old one's owner and fields, `resubmitted_from` "
                                    "naming the old one) starts from a copy of the old one's checkpoint folder at "
                                    "the samples that checkpoint holds, and is registered as any job is: the same "
                                    "rules and quotas, nothing stored when refused.",
                     "responses": {**_ok("the new job (Location: its URL)", "Job", "201"), **BAD_BODY,
                                   **AUTH_ERRORS, "404": _error("no such job"),
                                   "409": _error("the job has not failed nor been cancelled, its checkpoint "
                                                 "cannot be copied, or the replay has ended"),
                                   "422": _error("refused as a new registration would be (`errors` says why: "
                                                 "too many jobs of its owner, a command no longer allowed, ...)"),
                                   "429": _retry("its owner registered their most jobs per minute or per day"),
                                   "503": _error("the harvester is not running, or the store is failing")}}},
        "/api/jobs/{job_id}/logs": {
            "parameters": [job_id],
            "get": {"summary": "the last lines of each of the job's worker logs (its owner, or staff)",
                    "security": secured,
                    "parameters": [{"name": "lines", "in": "query",
                                    "schema": {"type": "integer", "minimum": 1, "maximum": LOG_LINES_MAX},
                                    "description": f"lines per worker (default {LOG_LINES_DEFAULT})"}],
                    "responses": {**_ok("the logs, rank 0's worker first", "Logs"),
                                  "400": _error(f"lines is not a whole number from 1 to {LOG_LINES_MAX}, "
                                                "or given twice"),
                                  "401": AUTH_ERRORS["401"],
                                  "403": _error("the job is someone else's (only its owner and staff read its logs)"),
                                  "404": _error("no such job")}}},
        "/api/jobs/{job_id}/events": {
            "parameters": [job_id],
            "get": {"summary": "the job's events, oldest first, a page at a time",
                    "description": "Its registration, probes, regroups, troubles, lost nodes and its end, as the "
                                   "store keeps them (within a second or two of when they happen). Follow a job "
                                   "by asking again with `after` set to the answer's `last`.",
                    "parameters": [{"name": "after", "in": "query",
                                    "schema": {"type": "integer", "minimum": 0, "maximum": SEQ_MAX},
                                    "description": "only events with a seq above this (default 0: from the first)"},
                                   {"name": "limit", "in": "query",
                                    "schema": {"type": "integer", "minimum": 1, "maximum": EVENTS_MAX},
                                    "description": f"events per page (default {EVENTS_DEFAULT})"}],
                    "responses": {**_ok("the events", "Events"),
                                  "400": _error(f"after or limit is not a whole number in range (limit 1 to "
                                                f"{EVENTS_MAX}), or a parameter is given twice"),
                                  "404": _error("no such job")}}},
        **{f"/api/replay/{command}": {"post": {
            "summary": summary, "security": secured, "requestBody": NO_BODY,
            "responses": {**_ok("done", "Status"), **BAD_BODY, **AUTH_ERRORS,
                          "409": _error("not possible on this server now"),
                          "503": _error("the harvester is not running")}}}
           for command, summary in (("pause", "pause the harvester; a replay's clock stops (staff)"),
                                    ("resume", "resume the harvester after a pause (staff)"))},
        "/api/replay/speed": {"post": {
            "summary": "set the replay's speed, in simulated seconds per wall second (staff)", "security": secured,
            "requestBody": {"required": True, "content": {JSON: {"schema": {
                "type": "object", "required": ["speed"],
                "properties": {"speed": {"type": "number", "minimum": SPEED_MIN, "maximum": SPEED_MAX}}}}}},
            "responses": {**_ok("done", "Status"), **BAD_BODY, **AUTH_ERRORS,
                          "409": _error("not possible on this server (a live one runs in wall time)"),
                          "422": _error("no speed, or one that is not a number in range"),
                          "503": _error("the harvester is not running")}}},
        "/api/usage": {"get": {
            "summary": "node-seconds, GPU-seconds and samples per owner, job or account (staff)",
            "description": "From the store's history: a node counts for a job from the allocation that added it to "
                           "the one that removed it (shrink, reclaim, end). Rows with usage in the window only.",
            "security": secured, "parameters": usage_params,
            "responses": {**_ok("the report", "Usage"), **usage_errors}}},
        "/api/usage.csv": {"get": {
            "summary": "the same report as CSV, a line per row and a last line `total` (staff)",
            "security": secured, "parameters": usage_params,
            "responses": {"200": {"description": "the report", "content": {"text/csv": {"schema": {"type": "string"}}}},
                          **usage_errors}}},
        "/api/nodes/{node}/{command}": {"post": {
            "summary": "take a node back, or give it again (staff, live mode with a static node list); "
                       "clear a node held out after a fault of its own, or a Slurm node skipped after "
                       "failed pilots (staff)",
            "security": secured,
            "parameters": [{"name": "node", "in": "path", "required": True, "schema": {"type": "string"}},
                           {"name": "command", "in": "path", "required": True,
                            "schema": {"enum": ["reclaim", "release", "clear"]}}],
            "requestBody": NO_BODY,
            "responses": {**_ok("done", "NodeCommand"), **BAD_BODY, **AUTH_ERRORS,
                          "404": _error("no such node or command"),
                          "409": _error("this server's nodes are not operated by hand, or skip none after failures")}}},
    }
    return {"openapi": "3.1.0",
            "info": {"title": "Idle-node harvester API", "version": version,
                     "description": "Reads are open; writes need `Authorization: Bearer <token from POST /api/token>`."},
            "paths": paths,
            "components": {"schemas": schemas,
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}}
