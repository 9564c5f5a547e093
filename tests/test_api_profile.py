"""The profiler's view through the JSON API, against a real `python -m app` replaying the Summit
trace with `--curves learned` (the allocator is told no curve; the Job Profiling Advisor learns
each one from the simulated jobs' throughput): GET /api/jobs/<id> carries "profile", GET
/api/jobs a confidence word per job, and with the profiler off the profile is null.

The replay starts at 2021-02-10T20:20Z, a minute before the ImageNet job set's first jobs
arrive, at 3600x: within seconds of wall time jobs run, are measured at several sizes and the
first probes are made.
"""
from __future__ import annotations

import json
import urllib.request

import pytest

from tests.support.server import start_app
from tests.support.waiting import wait

START = "2021-02-10T20:20:00Z"
WORDS = {"prior", "given", "low", "medium", "high"}
MEASURED_KEYS = {"nodes", "samples_per_second", "weight", "count", "sd_pct"}
FIT_KEYS = {"nodes", "mean", "lo", "hi", "band_sd", "model", "lam", "sigma", "kappa", "peak", "noise_pct"}
PROFILE_KEYS = {"measured", "fit", "cap", "given", "probe", "probes", "scale_up_seconds", "scale_down_seconds",
                "pauses", "confidence", "uncertainty_pct", "size", "probing"}
JOB_FIELDS = {"id", "name", "owner", "state", "nodes", "min_nodes", "max_nodes", "priority", "samples_per_second",
              "samples_done", "total_samples", "progress", "eta", "submit_time", "start_time", "end_time"}


def strict_get(app, path: str):
    """GET and parse as a browser would: NaN or Infinity in the body fails the test."""
    def refuse(word):
        raise AssertionError(f"{path} answered a bare {word}, which JSON.parse refuses")
    with urllib.request.urlopen(app.url + path, timeout=30) as r:
        return r.status, json.loads(r.read().decode(), parse_constant=refuse)


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    app = start_app(tmp_path_factory.mktemp("profile-api"), "--fresh", "--curves", "learned",
                    "--start", START, "--speed", "3600", "--queue", "priority")
    yield app
    assert app.stop() == 0, app.output()[-3000:]


def profiles(app) -> dict[str, dict]:
    """Every started job's profile, by job id."""
    out = {}
    for j in strict_get(app, "/api/jobs")[1]["jobs"]:
        if j["start_time"] is not None:
            out[j["id"]] = strict_get(app, f"/api/jobs/{j['id']}")[1]["profile"]
    return out


def test_a_measured_job_has_its_profile(learned):
    status, cluster = strict_get(learned, "/api/cluster?nodes=0")
    assert status == 200 and cluster["config"]["jpa"] is True, cluster
    found = wait(lambda: {k: p for k, p in profiles(learned).items() if p and len(p["measured"]) >= 2}, 40,
                 period=0.25, fail=False)
    assert found, f"no job was measured at two sizes in 40 s at 3600x:\n{learned.output()[-2000:]}"
    job_id, p = next(iter(found.items()))
    status, job = strict_get(learned, f"/api/jobs/{job_id}")
    assert status == 200
    assert JOB_FIELDS | {"curve", "why", "scale_up_seconds", "scale_down_seconds", "confidence"} <= set(job)
    assert set(p) == PROFILE_KEYS, set(p) ^ PROFILE_KEYS

    for m in p["measured"]:
        assert set(m) == MEASURED_KEYS
        assert 1 <= m["nodes"] <= job["max_nodes"] and m["samples_per_second"] > 0
        assert m["weight"] > 0 and m["count"] >= 1
        assert (m["sd_pct"] is None) == (m["count"] < 2) and (m["sd_pct"] is None or m["sd_pct"] >= 0)
    sizes = [m["nodes"] for m in p["measured"]]
    assert sizes == sorted(set(sizes)), "one point per size, by size"

    fit = p["fit"]
    assert set(fit) == FIT_KEYS
    assert fit["nodes"] == list(range(1, len(fit["nodes"]) + 1)) and fit["nodes"][-1] <= job["max_nodes"]
    assert len(fit["mean"]) == len(fit["lo"]) == len(fit["hi"]) == len(fit["nodes"])
    assert all(0 < lo <= hi for lo, hi in zip(fit["lo"], fit["hi"]))
    assert all(m > 0 for m in fit["mean"])
    assert fit["model"] == "usl" and fit["lam"] > 0 and fit["sigma"] >= 0 and fit["kappa"] >= 0
    assert 1 <= fit["peak"]

    assert job["min_nodes"] <= p["cap"] <= job["max_nodes"]
    assert p["given"] is None, "--curves learned tells the profiler no curve"
    assert p["confidence"] in WORDS - {"prior", "given"}, "measured at two sizes"
    assert p["uncertainty_pct"] >= 0
    assert set(p["pauses"]) == {"up", "down"} and all(k >= 0 for k in p["pauses"].values())
    assert p["scale_up_seconds"] > 0 and p["scale_down_seconds"] > 0
    assert isinstance(p["probing"], bool) and p["size"] >= 0


def test_probes_are_listed_with_their_reason(learned):
    with_probes = wait(lambda: {k: p for k, p in profiles(learned).items() if p and p["probes"]}, 40,
                       period=0.25, fail=False)
    assert with_probes, "no job was probed in 40 s at 3600x"
    for job_id, p in with_probes.items():
        job = strict_get(learned, f"/api/jobs/{job_id}")[1]
        times = [x["time"] for x in p["probes"]]
        assert times == sorted(times) and len(times) <= 50
        for x in p["probes"]:
            assert set(x) == {"time", "nodes", "why", "kind"} and x["kind"] in ("probe", "climb", "back", "try")
            # the profile is read from the controller, the health time from the last snapshot,
            # which may be one scheduler tick (0.5 s wall, 1,800 s simulated here) behind
            assert job["submit_time"] <= x["time"] <= strict_get(learned, "/api/health")[1]["time"] + 1800
            assert 1 <= x["nodes"] <= job["max_nodes"]
            assert isinstance(x["why"], str) and str(x["nodes"]) in x["why"], x


def test_every_job_in_the_list_has_a_confidence(learned):
    status, body = strict_get(learned, "/api/jobs")
    assert status == 200 and body["count"] > 0
    assert all(JOB_FIELDS <= set(j) for j in body["jobs"]), "every earlier field is still there"
    words = {j["confidence"] for j in body["jobs"]}
    assert words <= WORDS, words
    queued = [j for j in body["jobs"] if j["state"] == "queued"]
    assert all(j["confidence"] == "prior" for j in queued), "a queued job set job has nothing but the prior"
    assert words & {"low", "medium", "high"}, "some job has been measured"


def test_a_registered_job_has_a_profile_once_queued(learned):
    """In replay with hidden curves a registered job's curve is its truth, hidden like the job
    set's: the profiler knows the job from the controller's next step (when it is queued), with
    the prior and no given curve; until then its profile is null."""
    status, body = learned.request("POST", "/api/jobs", {
        "name": "registered", "min_nodes": 1, "max_nodes": 32, "total_samples": 1e12,
        "curve": "1:1200, 8:9000, 32:30000"}, token=learned.token("alice"))
    assert status == 201, body
    assert body["confidence"] in WORDS
    job = wait(lambda: (lambda j: j if j["profile"] else None)(
        strict_get(learned, f"/api/jobs/{body['id']}")[1]), 10, period=0.25, fail=False)
    assert job, "the profiler did not know the registered job within 10 s"
    p = job["profile"]
    assert p["given"] is None
    assert p["fit"]["nodes"] == list(range(1, 33)), "the fit spans the job's own sizes"
    if not p["measured"]:
        assert p["confidence"] == "prior"


def test_without_the_profiler_the_profile_is_null(tmp_path, small_trace, small_jobs):
    app = start_app(tmp_path, "--fresh", "--trace", str(small_trace), "--jobs", str(small_jobs),
                    "--hours", "3", "--speed", "600")
    try:
        assert strict_get(app, "/api/cluster?nodes=0")[1]["config"]["jpa"] is False
        jobs = wait(lambda: strict_get(app, "/api/jobs")[1]["jobs"], 20, period=0.25, fail=False)
        assert jobs, "the job set's jobs did not arrive"
        assert {j["confidence"] for j in jobs} == {"given"}
        status, job = strict_get(app, f"/api/jobs/{jobs[0]['id']}")
        assert status == 200 and job["profile"] is None and job["curve"]["nodes"]
    finally:
        assert app.stop() == 0, app.output()[-3000:]
