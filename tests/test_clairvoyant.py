"""The clairvoyant reference (core/clairvoyant.py): true remaining idle times read from a real
trace file, and a replay whose placement uses them avoids the node the trace takes back."""
from __future__ import annotations

import pytest

from core.clairvoyant import Clairvoyant
from core.controller import ControllerConfig
from core.replay import Replay, ReplaySettings, build_parser
from core.timeutil import parse_iso
from tests.support.files import write_jobset, write_trace

T0 = parse_iso("2021-02-10T00:00:00Z")


def test_remaining_is_the_next_reclaim_inside_the_window(tmp_path):
    trace = write_trace(tmp_path / "t.csv", [
        ("2021-02-10T00:00:00Z", "a", "idle"), ("2021-02-10T00:00:00Z", "b", "idle"),
        ("2021-02-10T00:00:00Z", "c", "idle"),
        ("2021-02-10T00:05:00Z", "a", "busy"), ("2021-02-10T00:06:00Z", "a", "idle"),
        ("2021-02-10T00:07:00Z", "c", "busy"),        # c is outside the nodes asked for
        ("2021-02-10T00:20:00Z", "a", "busy"),
        ("2021-02-10T02:00:00Z", "b", "busy"),        # after the window's end
    ])
    seer = Clairvoyant.from_trace(trace, ["a", "b"], T0, T0 + 3600)
    assert seer.remaining(["a", "b"], T0 + 60) == {"a": 240.0, "b": 3540.0}
    assert seer.remaining(["a"], T0 + 300) == {"a": 900.0}     # the reclaim at `now` has happened
    assert seer.remaining(["a", "c"], T0 + 1500) == {"a": 2100.0, "c": 2100.0}


def test_replay_placement_avoids_the_node_the_trace_takes_back(tmp_path):
    # two single-node cohorts; without knowing the future placement takes the older one,
    # which the trace takes back ten minutes in
    trace = write_trace(tmp_path / "trace.csv", [
        ("2021-02-10T00:00:00Z", "r00n00", "idle"), ("2021-02-10T00:00:01Z", "r00n01", "idle"),
        ("2021-02-10T00:10:00Z", "r00n00", "busy")])
    jobs = write_jobset(tmp_path / "jobs.csv", ["A,alex,2021-02-10T00:01:00Z,1,1,2000000,18,12,1,100"])

    def run(clairvoyant: bool) -> tuple[dict, Replay]:
        settings = ReplaySettings(trace=trace, jobs=jobs, hours=1, config=ControllerConfig(tfwd="auto"),
                                  clairvoyant=clairvoyant)
        replay = Replay(settings)
        return replay.run(), replay

    blind, _ = run(False)
    seen, replay = run(True)
    assert blind["preemptions"] == 1
    assert seen["preemptions"] == 0 and replay.controller.held["A"] == ["r00n01"]
    assert seen["samples"] > blind["samples"]      # no pause for the forced shrink and regrow


def test_the_setting_is_part_of_a_stored_runs_key():
    on = ReplaySettings(clairvoyant=True)
    assert on.key()["clairvoyant"] is True
    assert ReplaySettings.from_key(on.key()).clairvoyant is True
    assert ReplaySettings.from_key({k: v for k, v in on.key().items() if k != "clairvoyant"}).clairvoyant is False


@pytest.mark.parametrize("flag", [[], ["--clairvoyant"]])
def test_cli_accepts_the_flag(small_trace, small_jobs, flag):
    args = build_parser().parse_args(["--trace", str(small_trace), "--jobs", str(small_jobs), *flag])
    assert args.clairvoyant is bool(flag)
