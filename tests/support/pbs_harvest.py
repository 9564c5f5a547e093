"""A harvester on the test OpenPBS (tests/support/openpbs.py), as the PBS tests run it: its
command line, our pilots as PBS lists them, a digits job registered through the API and the
workers' status."""
from __future__ import annotations

import sys

from tests.support.openpbs import PbsCluster
from tests.support.pace import PaceFile
from tests.support.server import ROOT, AppProcess

GLOBAL_BATCH = 64
STEPS = 400
PILOT = "harvest-pilot"


def app_args(pbs: PbsCluster, logs, watch: list[str], *extra: str) -> list[str]:
    return ["--source", "pbs", "--pbs-bin", str(pbs.bin_dir), "--pbs-conf", str(pbs.conf),
            "--advertise", pbs.head_address, "--slurm-pilot-logs", str(logs), "--slurm-watch", ",".join(watch),
            "--workdir", str(ROOT), "--no-profiler", "--slurm-slots", "1", "--tfwd", "600",
            "--metrics-interval", "0", *extra]


def pilots(pbs: PbsCluster, states: str = "RQ") -> dict[str, str]:
    """Our pilot jobs PBS has in these states: id -> vnode ('' while queued)."""
    jobs = pbs.jobs_json().get("Jobs", {})
    return {jid: (j.get("exec_vnode") or "").strip("()").split(":")[0] for jid, j in jobs.items()
            if j.get("Job_Name") == PILOT and j.get("job_state") in states}


def register(app: AppProcess, name: str, nodes: int, pace: PaceFile) -> str:
    status, job = app.request("POST", "/api/jobs", {
        "name": name, "min_nodes": 1, "max_nodes": nodes, "total_samples": GLOBAL_BATCH * STEPS,
        "curve": f"1:100, {nodes}:{100 * nodes}" if nodes > 1 else "1:100", "scale_up_seconds": 0, "scale_down_seconds": 0,
        "global_batch": GLOBAL_BATCH,
        "command": [sys.executable, "examples/digits_cnn.py", *pace.args, "--log-every", "1000000"]},
        token=app.token("alice"))
    assert status == 201, job
    return job["id"]


def workers_of(app: AppProcess, jid: str) -> dict:
    return app.get(f"/api/jobs/{jid}")[1].get("workers") or {}


def on(app: AppProcess, jid: str, k: int):
    """The workers' status once the job trains on k vnodes (no regroup under way)."""
    def check():
        j = app.get(f"/api/jobs/{jid}")[1]
        w = j.get("workers") or {}
        return w if w.get("world_size") == k and not w.get("regrouping") and j["nodes"] == k else None
    return check
