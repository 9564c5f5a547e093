"""Schema-driven fuzzing of the REST API against a real server on loopback: schemathesis's own
`run` with every check it has (examples, coverage, fuzzing and stateful phases; bounded,
derandomized, no cache between runs) must find no disagreement between /api/openapi.json and
the server; the document itself validates as OpenAPI 3. The server continues a run whose store
holds jobs with NaN and ±Infinity in their numbers (tests/support/hostile.py), and one more
check (tests/support/schemathesis_hooks.py, issue 57 item 3) requires every JSON answer to be
strict JSON, as a browser's JSON.parse reads it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.files import ROOT
from tests.support.hostile import hostile_app

schemathesis = pytest.importorskip("schemathesis", reason="make test installs requirements-dev.txt")
from openapi_spec_validator import validate  # noqa: E402

#: the exceptions to "every check on every operation", as (check, operation)
EXEMPT = {("use_after_free", "GET /api/jobs/{job_id}"), ("use_after_free", "GET /api/jobs/{job_id}/logs"),
          ("use_after_free", "GET /api/jobs/{job_id}/events")}
#: generated cases per operation and phase: ~1,400 requests in all, 10-30 s
EXAMPLES = 60
OPERATIONS = ["POST /api/token", "GET /api/health", "GET /api/cluster", "GET /api/jobs", "POST /api/jobs",
              "GET /api/jobs/{job_id}", "DELETE /api/jobs/{job_id}", "GET /api/jobs/{job_id}/logs",
              "GET /api/jobs/{job_id}/events", "POST /api/jobs/{job_id}/resubmit",
              "POST /api/replay/pause", "POST /api/replay/resume", "POST /api/replay/speed",
              "POST /api/nodes/{node}/{command}", "GET /api/usage", "GET /api/usage.csv"]
#: The run's settings: every check is on (schemathesis's default; `--checks all` on its command
#: line would also override the two exceptions below). Two checks are told what the document
#: says in words and JSON Schema cannot say: a job's rules across fields (max_nodes >= min_nodes,
#: a pattern with a group, the site's own limits, a curve where no real workers run) make a 422
#: for a schema-valid body, and so does a usage window whose `to` is not after its `from` a 400;
#: and DELETE of a job cancels it, the job staying readable in its final
#: state (use_after_free expects a 404 after any DELETE).
CONFIG = """
headers = {{ Authorization = "Bearer {token}" }}
workers = 1
request-timeout = 30
[cache]
enabled = false
[generation]
max-examples = {examples}
deterministic = true
database = "none"
[[operations]]
include-name = "POST /api/jobs"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "409", "422", "429", "503"]
[[operations]]
include-name = "POST /api/jobs/{{job_id}}/resubmit"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "503"]
[[operations]]
include-name = ["GET /api/usage", "GET /api/usage.csv"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403"]
[[operations]]
include-name = ["GET /api/jobs/{{job_id}}", "GET /api/jobs/{{job_id}}/logs", "GET /api/jobs/{{job_id}}/events"]
checks.use_after_free.enabled = false
"""


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    proc, _ = hostile_app(tmp_path_factory.mktemp("fuzz"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def staff(app) -> dict:
    return {"Authorization": f"Bearer {app.token('staff1')}"}


def test_the_document_is_valid_openapi_3(app):
    status, doc = app.get("/api/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    validate(doc)
    assert doc["components"]["schemas"]["JobSpec"]["required"] == ["name", "min_nodes", "max_nodes", "total_samples"]


@pytest.fixture
def config(staff, tmp_path) -> Path:
    path = tmp_path / "schemathesis.toml"
    path.write_text(CONFIG.format(token=staff["Authorization"][7:], examples=EXAMPLES))
    return path


def test_every_check_runs_on_every_operation_but_the_two_exceptions(app, config):
    """The settings, as schemathesis resolves them per operation and phase: nothing else is off,
    and the checks that need a stateful run or negative data are among them."""
    from schemathesis.checks import CHECKS
    from schemathesis.config import SchemathesisConfig
    schema = schemathesis.openapi.from_url(app.url + "/api/openapi.json", config=SchemathesisConfig.from_path(config))
    off = {(name, op.label) for op in (r.ok() for r in schema.get_all_operations())
           for phase in ("examples", "coverage", "fuzzing", "stateful")
           for name in CHECKS.get_all_names()
           if not schema.config.checks_config_for(operation=op, phase=phase).get_by_name(name=name).enabled}
    assert off == EXEMPT
    assert {"negative_data_rejection", "positive_data_acceptance", "use_after_free", "ensure_resource_availability",
            "ignored_auth", "unsupported_method", "allow_header_conformance",
            "missing_required_header"} <= set(CHECKS.get_all_names())


def test_the_document_and_the_server_agree_under_every_check(app, config, tmp_path):
    """`schemathesis run` in a child process (its pytest plugin does not run under this pytest),
    with the strict-JSON check added by its hooks, reading its JSON report: every operation
    tested, every phase passed, no failure, no error."""
    report = tmp_path / "report.json"
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.support.schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "--no-color",
                          "run", "--report", "json", "--report-json-path", str(report), app.url + "/api/openapi.json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env)
    out = run.stdout + run.stderr
    assert report.exists(), out[-6000:]
    summary = json.loads(report.read_text())
    assert run.returncode == 0 and not summary["failures"] and not summary["errors"], out[-12000:]
    assert summary["operations"]["tested"] == summary["operations"]["total"] == len(OPERATIONS), out[-6000:]
    phases = {name: phase["status"] for name, phase in summary["phases"].items()}
    assert phases == {"examples": "skip", "coverage": "success", "fuzzing": "success", "stateful": "success"}, phases


def test_every_operation_is_in_the_document(app):
    schema = schemathesis.openapi.from_url(app.url + "/api/openapi.json")
    names = sorted(f"{op.method.upper()} {op.path}" for op in (r.ok() for r in schema.get_all_operations()))
    assert names == sorted(OPERATIONS)


def test_field_errors_are_worded_for_a_person(app, staff):
    bad = {"name": "", "min_nodes": "abc", "max_nodes": -3, "total_samples": 0, "priority": 5000,
           "curve": {"nodes": [1, "x"], "samples_per_second": [1, 2], "shape": "flat"}, "owner": "bob"}
    status, body = app.request("POST", "/api/jobs", bad, token=staff["Authorization"][7:])
    assert status == 422, body
    assert body["errors"] == {
        "name": "must not be empty", "min_nodes": "must be a whole number, not 'abc'",
        "max_nodes": "must be at least 1", "total_samples": "must be more than 0", "priority": "must be at most 1000",
        "curve": "nodes[1]: must be a whole number, not 'x'", "owner": "is not something a job has"}, body
