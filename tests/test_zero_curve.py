"""A curve that is 0 at every size is refused where a job is registered (issue 57: such a job can
never progress, yet it held a running slot on 0 nodes): a 422 naming the reason from the API, the
form's field error, and a job-set line refused at load. A curve 0 at some sizes only is still a job."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from core.jobsets import load_jobset
from core.schemas import JobSpec
from tests.support.server import start_app

REASON = "a curve must have a positive throughput at some size"
SPEC = {"name": "flat", "min_nodes": 1, "max_nodes": 2, "total_samples": 1e9}


def test_the_api_refuses_a_curve_that_is_zero_everywhere(tmp_path):
    app = start_app(tmp_path, "--dispatch", "simulated", "--local-nodes", "2", "--tick", "0.2")
    try:
        token = app.token("staff1")
        for curve in ({"nodes": [1], "samples_per_second": [0]}, {"nodes": [1, 2], "samples_per_second": [0, 0.0]},
                      "1:0, 2:0"):
            status, body = app.request("POST", "/api/jobs", {**SPEC, "curve": curve}, token=token)
            assert status == 422 and REASON in json.dumps(body), (curve, status, body)
        status, body = app.request("POST", "/api/jobs", {**SPEC, "curve": "1:0, 2:10"}, token=token)
        assert status == 201, body
        assert app.get("/api/jobs")[1]["total"] == 1, "nothing was registered for the flat curves"
    finally:
        app.stop()


def test_the_form_and_a_job_set_refuse_it_too(tmp_path):
    with pytest.raises(ValidationError, match=REASON):
        JobSpec.model_validate({**SPEC, "curve": "1:0"})
    sets = tmp_path / "jobs.csv"
    sets.write_text("job,model,submit_time,total_samples,min_nodes,max_nodes,nodes,samples_per_second\n"
                    "J1,m,2021-02-01T00:00:00,1e6,1,2,1;2,0;0\n")
    with pytest.raises(Exception, match=REASON):
        load_jobset(sets)
