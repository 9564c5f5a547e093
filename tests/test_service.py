"""The Harvester service a web process is built around: durable commands, resume after a
crash with the settings the run was made with, restart with new settings."""
from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest

from core.errors import InputError, SettingsError
from core.service import Unsupported
from core.controller_config import ControllerConfig
from core.replay import ReplaySettings
from core.schemas import JobSpec
from core.assemble import build
from core.settings import HarvesterSettings
from tests.support.waiting import wait

SPEC = JobSpec(name="probe", min_nodes=1, max_nodes=4, total_samples=1e9, curve="1:100, 4:390")


def settings(trace, jobs, **kw):
    return ReplaySettings(trace=trace, jobs=jobs, hours=10, config=ControllerConfig(tfwd=600), **kw)


def replay_harvester(db, replay, **kw):
    return build(HarvesterSettings.parse({"db": db, "replay": replay, **kw}))


def stored(db, sql, args=()):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


@pytest.fixture
def harvester(tmp_path, small_trace, small_jobs):
    h = replay_harvester(tmp_path / "h.db", settings(small_trace, small_jobs), speed=60, tick_s=0.05)
    h.open()
    yield h
    h.close()


def test_a_registered_job_is_in_the_store_when_submit_returns(harvester):
    harvester.pause()
    job = harvester.submit(SPEC, "alice")
    assert stored(harvester.db, "select owner, state, name from jobs where id = ?", (job.id,)) == \
        [("alice", "queued", "probe")]
    assert harvester.snapshot.job(job.id)["state"] == "queued"
    harvester.resume()
    wait(lambda: harvester.snapshot.job(job.id)["state"] == "running", 10.0, "the job to run", period=0.02)


def test_cancel_while_paused_takes_effect_at_once_and_durably(harvester):
    harvester.pause()
    job = harvester.submit(SPEC, "alice")
    harvester.cancel(job.id)
    assert harvester.snapshot.job(job.id)["state"] == "cancelled"
    assert stored(harvester.db, "select state from jobs where id = ?", (job.id,)) == [("cancelled",)]
    with pytest.raises(ValueError, match="already ended"):
        harvester.cancel(job.id)
    with pytest.raises(KeyError):
        harvester.cancel("nope")


def test_reopening_a_store_resumes_its_own_settings(tmp_path, small_trace, small_jobs):
    db = tmp_path / "h.db"
    h = replay_harvester(db, settings(small_trace, small_jobs, nodes=6), speed=600, tick_s=0.05)
    h.open()
    wait(lambda: h.snapshot.time > h.replay.start + 1200, 10.0, "1200 simulated s of replay", period=0.02)
    job = h.submit(SPEC, "bob")
    h.close()
    (saved,), = stored(db, "select value from meta where key = 'replay_cursor'")
    # different command-line settings: the stored run wins, and continues from its cursor
    again = replay_harvester(db, settings(small_trace, small_jobs, nodes=8), speed=60, tick_s=0.05)
    again.open()
    try:
        assert again.settings.nodes == 6 and len(again.snapshot.nodes) == 6
        assert again.speed == 600
        assert again.replay.clock.now() >= float(saved)
        assert again.job(job.id) is not None and again.job(job.id).owner == "bob"
    finally:
        again.close()
    fresh = replay_harvester(db, settings(small_trace, small_jobs, nodes=8), fresh=True, tick_s=0.05)
    fresh.open()
    try:
        assert len(fresh.snapshot.nodes) == 8 and fresh.job(job.id) is None
    finally:
        fresh.close()


def test_restart_with_new_settings_drops_the_old_run(harvester, small_trace, small_jobs):
    job = harvester.submit(SPEC, "alice")
    seq = harvester.snapshot.seq
    harvester.restart(replace(harvester.settings, nodes=4), speed=120, wait=True)
    assert harvester.error is None and harvester.speed == 120
    snap = harvester.snapshot
    assert len(snap.nodes) == 4 and snap.seq > seq, "snapshot numbers never go back"
    assert harvester.job(job.id) is None
    assert stored(harvester.db, "select count(*) from jobs where id = ?", (job.id,)) == [(0,)]


def test_a_refused_restart_leaves_the_run_as_it_was(harvester, tmp_path):
    """New settings are checked against the files before the running replay is touched."""
    before = harvester.snapshot
    with pytest.raises(InputError, match="missing.csv"):
        harvester.restart(replace(harvester.settings, jobs=tmp_path / "missing.csv"), wait=True)
    with pytest.raises(SettingsError, match="no such rack: zz99"):
        harvester.restart(replace(harvester.settings, racks="zz99"), wait=True)
    assert harvester.error is None and harvester.runner is not None
    assert harvester.snapshot.status != "error" and len(harvester.snapshot.nodes) == len(before.nodes)
    harvester.submit(SPEC, "alice")


def test_speed_is_bounded(harvester):
    for bad in (0, -1, 1e6):
        with pytest.raises(ValueError):
            harvester.set_speed(bad)
    harvester.set_speed(3600)
    assert harvester.speed == 3600


def test_a_job_sent_to_an_ended_replay_is_refused_clearly(tmp_path, small_trace, small_jobs):
    h = replay_harvester(tmp_path / "ended.db", replace(settings(small_trace, small_jobs), hours=0.05),
                         speed=3600, tick_s=0.05)
    h.open()
    try:
        wait(lambda: h.snapshot.status == "finished", 20.0, "the replay to end", period=0.05)
        with pytest.raises(Unsupported, match="the replay has ended"):
            h.submit(SPEC, "alice")
    finally:
        h.close()


def test_demo_lane_runs_a_registered_job_past_a_full_queue(tmp_path, small_trace, small_jobs):
    """With one running slot taken by the job set and the lane on, a visitor's job still runs,
    on nodes; with the lane off it waits."""
    for slots, runs in ((1, True), (0, False)):
        config = ControllerConfig(tfwd=600, max_jobs=1, visitor_slots=slots)
        h = replay_harvester(tmp_path / f"lane{slots}.db", replace(settings(small_trace, small_jobs), config=config),
                             speed=600, tick_s=0.05)
        h.open()
        try:
            wait(lambda: h.snapshot.kpis.get("running", 0) >= 1 and h.snapshot.kpis.get("queued", 0) >= 1,
                 20.0, "the job set to fill its slot and queue", period=0.05)
            job = h.submit(SPEC, "alice")
            ran = wait(lambda: (h.snapshot.job(job.id) or {}).get("nodes", 0) > 0, 3.0, period=0.05, fail=False)
            assert bool(ran) is runs, (slots, h.snapshot.job(job.id))
        finally:
            h.close()
