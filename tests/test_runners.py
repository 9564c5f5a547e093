"""Live replay driven by a real APScheduler BackgroundScheduler."""
from __future__ import annotations

import time

import pytest

from core.controller_config import ControllerConfig
from core.replay import TIMING_KEYS, Replay, ReplaySettings
from core.runners import ReplayRunner
from core.snapshot import BUSY, HELD, IDLE
from tests.support.waiting import wait


def settings(trace, jobs):
    return ReplaySettings(trace=trace, jobs=jobs, hours=10, config=ControllerConfig(tfwd=600))


def test_live_replay_runs_to_the_same_end_as_headless(small_trace, small_jobs):
    whole = Replay(settings(small_trace, small_jobs)).run()
    runner = ReplayRunner(Replay(settings(small_trace, small_jobs)), speed=20 * 3600, tick_s=0.05)
    first = runner.snapshot
    assert first.status == "stopped" and len(first.nodes) == 8
    runner.start()
    try:
        wait(lambda: runner.status == "finished", 10.0, "the replay to finish", period=0.02)
    finally:
        runner.stop()
    snap = runner.snapshot
    assert snap.seq > 1 and snap.time == pytest.approx(runner.replay.end)
    assert {k: v for k, v in runner.summary.items() if k not in TIMING_KEYS} == \
        {k: v for k, v in whole.items() if k not in TIMING_KEYS}
    assert snap.kpis["done"] == 3 and all(j["progress"] == 1.0 for j in snap.jobs)
    assert set(snap.state) <= {BUSY, IDLE, HELD}


def test_pause_resume_and_speed(small_trace, small_jobs):
    runner = ReplayRunner(Replay(settings(small_trace, small_jobs)), speed=600, tick_s=0.05)
    runner.start()
    try:
        wait(lambda: runner.snapshot.time > runner.replay.start + 60, 10.0, "60 simulated s of replay", period=0.02)
        held = [s for s in runner.snapshot.state if s == HELD]
        assert held and runner.snapshot.kpis["harvested"] == len(held)
        runner.pause()
        t_paused = runner.snapshot.time
        time.sleep(0.3)
        assert runner.snapshot.status == "paused" and runner.replay.clock.now() == t_paused
        runner.resume()
        runner.set_speed(6000)
        wait(lambda: runner.snapshot.time > t_paused + 600, 10.0, "600 simulated s after the resume", period=0.02)
        assert runner.snapshot.status == "running"
    finally:
        runner.stop()
    assert runner.status == "stopped"


def test_a_failing_tick_stops_the_replay_visibly(small_trace, small_jobs):
    runner = ReplayRunner(Replay(settings(small_trace, small_jobs)), speed=600, tick_s=0.05)
    runner.start()
    try:
        assert runner.snapshot.status == "running", "start publishes at once"

        def broken(*a, **k):
            raise IndexError("injected")
        runner.replay.advance = broken       # fault injection: the next tick raises
        wait(lambda: runner.snapshot.status == "error", 10.0, "the failing tick to stop the replay", period=0.02)
        assert runner.error == "IndexError: injected"
        assert runner.scheduler.get_job("replay-tick") is None, "no more failing ticks"
    finally:
        runner.stop()


def test_the_live_loop_steps_a_quiet_controller_when_a_replan_is_due():
    """Live mode ticks without events too: the tick steps the controller once `replan_at` has
    come (core/runners/live.py), so B, which arrived 5 s after A took every node, gets nodes
    with no event from the source (the controller side: tests/test_controller.py)."""
    from core.runners.live import LiveRunner
    from core.sources.static import StaticSource
    from tests.support.sim import a_then_b, controller
    nodes = [f"a01n{i:02d}" for i in range(1, 17)]
    ctl, clock = controller(nodes, ControllerConfig(tfwd="auto"))
    runner = LiveRunner(ctl, StaticSource(nodes))
    a_then_b(ctl, clock, 5, runner._advance)
    assert len(ctl.held["A"]) == 16 and not ctl.held.get("B")
    steps = ctl.counters.steps
    for _ in range(12):
        clock.advance_to(ctl.replan_at - 1)
        runner._advance()
        assert ctl.counters.steps == steps        # not due yet: the tick leaves it alone
        clock.advance_to(ctl.replan_at)
        runner._advance()
        steps += 1
        assert ctl.counters.steps == steps
        if ctl.held.get("B"):
            break
    assert ctl.held.get("B") and len(ctl.held["A"]) < 16


def test_an_idle_live_loop_describes_the_machine_at_most_once_a_second():
    """A snapshot describes every node (10,624 on a whole machine, ~0.3 s): a live tick that
    stepped nothing publishes one at most once a second; a tick that stepped publishes at once."""
    from core.model import Event, EventKind
    from core.runners.live import IDLE_PUBLISH_S, LiveRunner
    from core.sources.static import StaticSource
    from tests.support.sim import controller
    nodes = [f"a01n{i:02d}" for i in range(1, 9)]
    ctl, clock = controller(nodes, ControllerConfig())
    source = StaticSource(nodes)
    runner = LiveRunner(ctl, source)
    runner.status = "running"
    built: list[int] = []
    build = runner._build
    runner._build = lambda seq: (built.append(seq), build(seq))[1]
    runner._tick()
    assert len(built) == 1, "the first tick publishes"
    for _ in range(20):
        runner._tick()
    assert len(built) == 1, "idle ticks within a second publish nothing"
    ctl.post(Event(clock.now(), EventKind.NODE_LEAVE, node=nodes[0]))
    runner._tick()
    assert len(built) == 2, "a tick that stepped publishes"
    runner._published_at -= IDLE_PUBLISH_S
    runner._tick()
    assert len(built) == 3, "and an idle one after a second"
