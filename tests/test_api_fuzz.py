"""Schema-driven fuzzing of the REST API (schemathesis, bounded, loopback only) against a real
server: no 5xx, and every answer's status, content type and body as /api/openapi.json documents;
the document itself validates as OpenAPI 3."""
from __future__ import annotations

import pytest

from tests.support.server import start_app

schemathesis = pytest.importorskip("schemathesis", reason="make test installs requirements-dev.txt")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402  (schemathesis brings hypothesis)
from openapi_spec_validator import validate  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,  # noqa: E402
                                               status_code_conformance)

EXAMPLES = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("fuzz"), "--fresh", "--racks", "d30,e04",
                     "--start", "2021-02-12T19:30:00Z")
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


@pytest.fixture(scope="module")
def operations(app):
    schema = schemathesis.openapi.from_url(app.url + "/api/openapi.json")
    return {f"{op.method.upper()} {op.path}": op for op in (r.ok() for r in schema.get_all_operations())}


def test_every_operation_is_fuzzed(operations):
    assert len(operations) == 10, sorted(operations)


@pytest.mark.parametrize("name", ["POST /api/token", "GET /api/health", "GET /api/cluster", "GET /api/jobs",
                                  "POST /api/jobs", "GET /api/jobs/{job_id}", "DELETE /api/jobs/{job_id}",
                                  "GET /api/jobs/{job_id}/logs", "POST /api/replay/{command}", "POST /api/nodes/{node}/{command}"])
def test_no_5xx_and_every_answer_as_documented(app, staff, operations, name):
    """Each operation with up to EXAMPLES generated requests (schemathesis's pytest plugin does
    not run under this pytest, so hypothesis drives its strategies here)."""
    @given(case=operations[name].as_strategy())
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def fuzz(case):
        case.call_and_validate(base_url=app.url, headers=staff, checks=CHECKS, timeout=30)
    fuzz()


def test_field_errors_are_worded_for_a_person(app, staff):
    bad = {"name": "", "min_nodes": "abc", "max_nodes": -3, "total_samples": 0, "priority": 5000,
           "curve": {"nodes": [1, "x"], "samples_per_second": [1, 2], "shape": "flat"}, "owner": "bob"}
    status, body = app.request("POST", "/api/jobs", bad, token=staff["Authorization"][7:])
    assert status == 422, body
    assert body["errors"] == {
        "name": "must not be empty", "min_nodes": "must be a whole number, not 'abc'",
        "max_nodes": "must be at least 1", "total_samples": "must be more than 0", "priority": "must be at most 1000",
        "curve": "nodes[1]: must be a whole number, not 'x'", "owner": "is not something a job has"}, body
