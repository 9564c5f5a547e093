"""The clairvoyant references (core/clairvoyant.py): true remaining idle times read from a real
trace file, a replay whose placement uses them avoids the node the trace takes back, and one whose
placement groups the nodes taken back together keeps a job off a reclaim that spans cohorts."""
from __future__ import annotations

import pytest

from core.clairvoyant import Clairvoyant
from core.controller_config import ControllerConfig
from core.errors import SettingsError
from core.replay import Replay, ReplaySettings, build_parser
from core.timeutil import parse_iso
from tests.support.files import write_jobset, write_trace

T0 = parse_iso("2021-02-10T00:00:00Z")


def _replay(trace, jobs, clairvoyant: bool | str) -> tuple[dict, Replay]:
    """One hour of `trace` with `auto`, and the replay (its controller shows where jobs ended)."""
    replay = Replay(ReplaySettings(trace=trace, jobs=jobs, hours=1, config=ControllerConfig(tfwd="auto"),
                                   clairvoyant=clairvoyant))
    return replay.run(), replay


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
    # the moments themselves: exact trace times, so nodes taken back together compare equal
    assert seer.taken_at(["a", "b", "c"], T0 + 60) == {"a": T0 + 300, "b": T0 + 3600, "c": T0 + 3600}


def test_replay_placement_avoids_the_node_the_trace_takes_back(tmp_path):
    # two single-node cohorts; without knowing the future placement takes the older one,
    # which the trace takes back ten minutes in
    trace = write_trace(tmp_path / "trace.csv", [
        ("2021-02-10T00:00:00Z", "r00n00", "idle"), ("2021-02-10T00:00:01Z", "r00n01", "idle"),
        ("2021-02-10T00:10:00Z", "r00n00", "busy")])
    jobs = write_jobset(tmp_path / "jobs.csv", ["A,alex,2021-02-10T00:01:00Z,1,1,2000000,18,12,1,100"])

    blind, _ = _replay(trace, jobs, False)
    seen, replay = _replay(trace, jobs, True)
    assert blind["preemptions"] == 1
    assert seen["preemptions"] == 0 and replay.controller.held["A"] == ["r00n01"]
    assert seen["samples"] > blind["samples"]      # no pause for the forced shrink and regrow


def test_replay_groups_put_a_job_on_nodes_taken_back_together(tmp_path):
    # two cohorts: n00-n02 freed at 00:00 and n03 at 00:00:01. Cohorts say n00-n02 share fate and
    # a 2-node job takes two of them; the trace's one reclaim at 00:10 takes n01 and n02 (a reclaim
    # that, as on Summit, splits a cohort), so the job is hit wherever in that cohort it sits. Told
    # which nodes go back together, placement sees {n00, n03} as the group that stays.
    trace = write_trace(tmp_path / "trace.csv", [
        *(("2021-02-10T00:00:00Z", f"r00n0{i}", "idle") for i in range(3)),
        ("2021-02-10T00:00:01Z", "r00n03", "idle"),
        ("2021-02-10T00:10:00Z", "r00n01", "busy"), ("2021-02-10T00:10:00Z", "r00n02", "busy")])
    jobs = write_jobset(tmp_path / "jobs.csv", ["A,alex,2021-02-10T00:01:00Z,2,2,2000000,18,12,1,100"])

    times, _ = _replay(trace, jobs, "times")
    groups, replay = _replay(trace, jobs, "groups")
    assert times["preemptions"] >= 1
    assert groups["preemptions"] == 0
    assert sorted(replay.controller.held["A"]) == ["r00n00", "r00n03"]
    assert groups["samples"] > times["samples"]


def test_the_setting_is_part_of_a_stored_runs_key():
    on = ReplaySettings(clairvoyant="groups")
    assert on.key()["clairvoyant"] == "groups"
    assert ReplaySettings.from_key(on.key()).clairvoyant == "groups"
    assert ReplaySettings.from_key({k: v for k, v in on.key().items() if k != "clairvoyant"}).clairvoyant == ""
    # runs stored when the setting was on or off
    assert ReplaySettings.from_key({**on.key(), "clairvoyant": True}).clairvoyant == "times"
    assert ReplaySettings.from_key({**on.key(), "clairvoyant": False}).clairvoyant == ""


def test_an_unknown_clairvoyance_is_refused():
    with pytest.raises(SettingsError) as e:
        ReplaySettings(clairvoyant="oracle")
    assert e.value.field == "clairvoyant" and "'times' or 'groups'" in str(e.value)


@pytest.mark.parametrize("flag, mode", [([], ""), (["--clairvoyant"], "times"),
                                        (["--clairvoyant", "groups"], "groups")])
def test_cli_accepts_the_flag(small_trace, small_jobs, flag, mode):
    args = build_parser().parse_args(["--trace", str(small_trace), "--jobs", str(small_jobs), *flag])
    assert args.clairvoyant == mode
