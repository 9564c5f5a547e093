"""examples/hpo_optuna.py end to end: an Optuna study of six trials, three at a time, each trial a
real elastic digits job on a live harvester of four local nodes, submitted through app/client.py.
The study runs to its end; a trial the pruner stops has its job cancelled on the server, every
other trial's job is done; the jobs carry the study's name; no worker process is left.

The search space reaches learning rates far above what the digits model survives (above ~10 its loss
climbs to hundreds within a few steps, clipped gradients or not), so that some trials diverge and the divergence rule prunes them
whatever the timing; seed 5 draws such rates (the test checks that it still does, so that a
changed sampler fails with that reason rather than with "nothing pruned")."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.procs import leftovers
from tests.support.server import ROOT, password, start_app
from tests.support.waiting import wait

TRIALS = 6
DIVERGES_ABOVE_LR = 20.0


@pytest.fixture
def app(tmp_path):
    proc = start_app(tmp_path, "--fresh", "--dispatch", "local", "--local-nodes", "4", "--tick", "0.1")
    yield proc
    proc.stop()


def test_a_study_prunes_diverging_trials_by_cancelling_their_jobs(app, tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "hpo_optuna.py"), "--url", app.url, "--user", "alice",
         "--password", password("alice"), "--name", "hpo-test", "--trials", str(TRIALS), "--parallel", "3",
         "--seed", "5", "--lr-min", "0.01", "--lr-max", "1000", "--widths", "8,16",
         "--total-samples", "9600", "--step-seconds", "0.02", "--max-nodes", "2",
         "--report-every", "640", "--warmup-reports", "3", "--poll", "0.3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr + app.output()[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    trials = summary["trials"]
    assert [t["number"] for t in trials] == list(range(TRIALS)), summary
    assert any(t["params"]["lr"] > DIVERGES_ABOVE_LR for t in trials), \
        f"seed 5 no longer draws a learning rate that diverges: {[t['params'] for t in trials]}"

    jobs = {j["id"]: j for j in app.get("/api/jobs")[1]["jobs"]}
    assert {t["job"] for t in trials} == set(jobs), "one job per trial, and no other"
    pruned = [t for t in trials if t["state"] == "pruned"]
    assert pruned, f"no trial was pruned:\n{r.stdout}"
    for t in trials:
        job = jobs[t["job"]]
        assert job["name"].startswith(f"hpo-test #{t['number']} "), job
        assert job["owner"] == "alice"
        if t["state"] == "pruned":
            assert job["state"] == "cancelled" and job["samples_done"] < job["total_samples"], (t, job)
            assert f"trial {t['number']}: pruned" in r.stdout
        else:
            assert t["state"] == "complete" and job["state"] == "done", (t, job)
            assert job["samples_done"] == job["total_samples"] and t["value"] is not None
    for t in trials:
        if t["params"]["lr"] > DIVERGES_ABOVE_LR:
            assert t["state"] == "pruned", f"a diverging trial ran to its end: {t}"
    best = summary["best"]
    assert best["state"] == "complete" and best["value"] == min(
        t["value"] for t in trials if t["state"] == "complete")
    assert best["params"]["lr"] < 1, best
    wait(lambda: not any(leftovers(j) for j in jobs), 20, "no worker left",
         lambda: {j: leftovers(j) for j in jobs})
    print(r.stdout)
