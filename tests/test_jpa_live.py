"""The profiler on real PyTorch workers (local processes): a job registered without a curve is
measured at three sizes within five minutes, with its rescale pauses, probes in the event log and
samples in the store; without the profiler such a job is refused."""
from __future__ import annotations

import sys
import time

import pytest

from core.assemble import build
from core.schemas import JobSpec
from core.settings import HarvesterSettings
from tests.support.files import ROOT
from tests.support.procs import leftovers
from tests.support.waiting import wait

GLOBAL_BATCH = 64
COMMAND = [sys.executable, str(ROOT / "examples" / "digits_cnn.py"), "--seed", "2", "--log-every", "1000000",
           "--step-seconds", "0.02"]


def harvester(tmp_path, profile_sizes=None):
    """Local workers on 4 nodes; the profiler measures `profile_sizes` sizes first (None: off)."""
    return build(HarvesterSettings.parse({"db": tmp_path / "live.db", "tick_s": 0.1, "live": {
        "dispatch": "local", "local_nodes": 4, "profiler": profile_sizes is not None, "trust_user_commands": True,
        "profile_sizes": profile_sizes or 0, "workers": {"sample_s": 3.0}}}))


def test_a_job_without_a_curve_is_measured_at_three_sizes_within_five_minutes(tmp_path):
    h = harvester(tmp_path, 3)
    h.open()
    try:
        spec = JobSpec(name="digits-nocurve", min_nodes=1, max_nodes=4, total_samples=GLOBAL_BATCH * 200_000,
                       global_batch=GLOBAL_BATCH, command=COMMAND)
        assert spec.curve is None
        job = h.submit(spec, "alice")
        t0 = time.monotonic()
        sizes = lambda: [m["nodes"] for m in (h.profile(job.id) or {}).get("measured", [])]
        wait(lambda: len(sizes()) >= 3, 300, "three measured sizes", lambda: h.profile(job.id))
        took = time.monotonic() - t0
        print(f"three sizes measured {took:.0f} s after registration: {sizes()}")
        view = h.profile(job.id)
        assert all(m["samples_per_second"] > 0 for m in view["measured"])
        assert view["confidence"] in ("low", "medium", "high")
        assert len(view["fit"]["mean"]) == 4 and all(lo <= hi for lo, hi in zip(view["fit"]["lo"], view["fit"]["hi"]))
        assert any(p["kind"] == "probe" and p["why"].startswith("probe at") for p in view["probes"]), view["probes"]
        assert sum(view["pauses"].values()) >= 1, "no rescale pause was measured"
        assert 0 < min(view["scale_up_seconds"], view["scale_down_seconds"])
        # the allocator uses the measured curve (not the empty placeholder it was registered with)
        assert max(h.controller.job(job.id).curve.samples_per_second) > 0
        h.controller.flush()
        db = h.controller.store.db
        rates = db.execute("select count(*) from samples where job = ? and kind = 'rate'", (job.id,)).fetchone()[0]
        probes = db.execute("select count(*) from events where job = ? and kind = 'probe'", (job.id,)).fetchone()[0]
        assert rates >= 3 and probes >= 1, (rates, probes)
        h.cancel(job.id)
        wait(lambda: not leftovers(job.id), 15, "every worker process to be gone")
    finally:
        h.close()


def test_without_the_profiler_a_job_needs_its_curve(tmp_path):
    h = harvester(tmp_path, None)
    h.open()
    try:
        spec = JobSpec(name="digits-nocurve", min_nodes=1, max_nodes=4, total_samples=6400,
                       global_batch=GLOBAL_BATCH, command=COMMAND)
        with pytest.raises(ValueError, match="curve: .*profiler is off"):
            h.submit(spec, "alice")
        assert h.controller.store.db.execute("select count(*) from jobs").fetchone()[0] == 0
    finally:
        h.close()
