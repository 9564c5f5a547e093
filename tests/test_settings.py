"""core/settings.py: every setting is checked once, where the settings are built, and an error
names the setting by its path; front ends word that path their own way (the CLI: its flag)."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from app.__main__ import build_parser, flag, settings_from
from core.controller_config import ControllerConfig
from core.errors import SettingsError
from core.replay import ReplaySettings
from core.settings import HarvesterSettings, LiveSettings, check_speed


def error_of(data: dict) -> SettingsError:
    with pytest.raises(SettingsError) as e:
        HarvesterSettings.parse(data)
    return e.value


@pytest.mark.parametrize("replay,path", [
    ({"hours": -1}, "replay.hours"), ({"hours": math.nan}, "replay.hours"), ({"hours": 0}, "replay.hours"),
    ({"nodes": 0}, "replay.nodes"), ({"start": "yesterday"}, "replay.start"), ({"curves": "magic"}, "replay.curves"),
    ({"coalesce": -1}, "replay.coalesce"), ({"config": {"tfwd": -5}}, "replay.config.tfwd"),
    ({"config": {"tfwd": math.inf}}, "replay.config.tfwd"), ({"config": {"tfwd": "soon"}}, "replay.config.tfwd"), ({"config": {"max_jobs": 0}}, "replay.config.max_jobs"),
    ({"config": {"policy": "fastest"}}, "replay.config.policy"), ({"bogus": 1}, "replay.bogus"),
    ({"gpus_per_node": 0}, "replay.gpus_per_node"), ({"gpus_per_node": 1025}, "replay.gpus_per_node"),
    ({"gpus_per_node": 2.5}, "replay.gpus_per_node"),
])
def test_a_bad_replay_setting_is_named_by_its_path(replay, path):
    e = error_of({"replay": replay})
    assert e.field == path, (e.field, e.message)


def test_the_same_rules_hold_however_the_settings_are_built():
    """The replay page changes settings with dataclasses.replace; the CLI and tests parse dicts."""
    base = ReplaySettings(hours=2)
    for change, field in (({"hours": -2}, "hours"), ({"nodes": 0}, "nodes"), ({"start": "soon"}, "start"),
                          ({"gpus_per_node": 0}, "gpus_per_node")):
        with pytest.raises(SettingsError) as e:
            replace(base, **change)
        assert e.value.field == field
    with pytest.raises(SettingsError) as e:
        replace(base.config, tfwd=0)
    assert e.value.field == "tfwd"
    assert replace(base, start="  ", racks=" ").start is None, "blank text means unset"


@pytest.mark.parametrize("live,path,words", [
    ({"dispatch": "pilot", "local_nodes": 2}, "live.dispatch", "needs {live.source} slurm"),
    ({"dispatch": "ssh", "local_nodes": 2}, "live.inventory", "{live.dispatch} ssh needs a node file"),
    ({"dispatch": "local"}, "live.local_nodes", "needs {live.local_nodes} N or {live.inventory} FILE"),
    ({"dispatch": "local", "local_nodes": 0}, "live.local_nodes", "at least 1"),
    ({"dispatch": "local", "local_nodes": 2, "inventory": "nodes.txt"}, "live.local_nodes", "not both"),
    ({"dispatch": "local", "local_nodes": 2, "profile_sizes": -1}, "live.profile_sizes", "0 or more"),
    ({"source": "slurm", "dispatch": "ssh"}, "live.dispatch", "use {live.dispatch} pilot"),
    ({"source": "slurm", "local_nodes": 3}, "live.source", "leave out"),
    ({"source": "slurm", "slurm": {"max_pilots": 0}}, "live.slurm.max_pilots", "whole number"),
    ({"source": "lsf"}, "live.source", ""),
    ({"dispatch": "local", "local_nodes": 2, "advertise": "10.0.0.1 rm"}, "live.advertise", "host name"),
    ({"dispatch": "local", "local_nodes": 2, "bind": "a/b"}, "live.bind", "host name"),
    ({"dispatch": "local", "local_nodes": 2, "worker_env": ["LD_LIBRARY_PATH", "1X"]}, "live.worker_env", "not an environment"),
    ({"dispatch": "local", "local_nodes": 2, "worker_env": ["HARVEST_SECRET_KEY"]}, "live.worker_env", "never go to workers"),
])
def test_live_settings_that_do_not_fit_together_are_refused(live, path, words):
    e = error_of({"live": live})
    assert e.field == path and words in e.message, (e.field, e.message)


def test_one_address_for_the_nodes():
    live = LiveSettings(dispatch="local", local_nodes=2)
    assert live.dial_host == live.bind_host == "127.0.0.1"
    live = LiveSettings(dispatch="local", local_nodes=2, advertise="10.9.8.1")
    assert live.dial_host == live.bind_host == "10.9.8.1"
    live = LiveSettings(dispatch="local", local_nodes=2, advertise="head01", bind="0.0.0.0")
    assert (live.dial_host, live.bind_host) == ("head01", "0.0.0.0")
    args = build_parser().parse_args(["--dispatch", "ssh", "--nodes", "n.txt", "--advertise", "10.9.8.1",
                                      "--port", "9000", "--worker-env", "LD_LIBRARY_PATH, NCCL_DEBUG"])
    s = settings_from(args)
    assert s.live.report_url == "http://10.9.8.1:9000/api/workers", "workers report to the advertised address"
    assert s.live.worker_env == ("LD_LIBRARY_PATH", "NCCL_DEBUG")
    assert flag("live.advertise") == "--advertise" and flag("live.worker_env") == "--worker-env"


def test_the_profiler_runs_only_on_real_workers():
    assert LiveSettings(dispatch="local", local_nodes=2).jpa is not None
    assert LiveSettings(dispatch="local", local_nodes=2, profiler=False).jpa is None
    assert LiveSettings(dispatch="simulated", local_nodes=2).jpa is None, "simulated jobs run at their given curve"
    assert LiveSettings(source="slurm").dispatcher == "pilot"
    assert LiveSettings(source="slurm", slurm={"dry_run": True}).real_workers is False


def test_speed_and_tick_are_checked_and_the_modes_exclude_each_other():
    assert error_of({"speed": 0}).field == "speed"
    assert error_of({"speed": 1e9}).field == "speed"
    assert error_of({"tick_s": 0}).field == "tick_s"
    assert error_of({"replay": {}, "live": {"dispatch": "local", "local_nodes": 1}}).field == "live"
    assert check_speed("600") == 600.0
    s = HarvesterSettings.parse({})
    assert s.replay_settings == ReplaySettings() and s.tick == 0.5
    assert HarvesterSettings.parse({"live": {"dispatch": "simulated", "local_nodes": 3}}).tick == 0.2


def test_the_cli_words_every_setting_as_its_flag():
    e = SettingsError("dispatch", "with {source} slurm use {dispatch} pilot").within("live")
    assert e.render(flag) == "--dispatch: with --source slurm use --dispatch pilot"
    assert flag("replay.config.max_jobs") == "--max-jobs"
    assert flag("live.config.tfwd") == "--tfwd"
    assert flag("live.inventory") == "--nodes"
    assert flag("live.slurm.time_limit_min") == "--slurm-time-limit"
    assert flag("live.slurm.hub_port") == "--slurm-hub"
    assert flag("speed") == "--speed" and flag("tick_s") == "--tick"
    assert SettingsError("", "cannot read Slurm: x").render(flag) == "cannot read Slurm: x"


def test_the_command_line_becomes_settings():
    args = build_parser().parse_args(["--db", "x.db", "--hours", "3", "--nodes", "40", "--tfwd", "60",
                                      "--speed", "120"])
    s = settings_from(args)
    assert s.live is None and s.speed == 120.0 and s.db == Path("x.db")
    assert s.replay.hours == 3.0 and s.replay.nodes == 40 and s.replay.config == ControllerConfig(tfwd=60.0, visitor_slots=2)
    assert s.replay.start == "2021-02-10T20:00:00Z", "the demo's window on the Summit trace"
    other = settings_from(build_parser().parse_args(["--db", "x.db", "--trace", "other.csv", "--visitor-slots", "0"]))
    assert other.replay.start is None and other.replay.config.visitor_slots == 0, "another trace from its start"
    auto = settings_from(build_parser().parse_args(["--db", "x.db", "--tfwd", "auto"]))
    assert auto.replay.config.tfwd == "auto" and auto.replay.config.learns_horizon
    args = build_parser().parse_args(["--dispatch", "local", "--local-nodes", "3", "--port", "9000",
                                      "--no-profiler", "--max-jobs", "4"])
    s = settings_from(args)
    assert s.replay is None and s.live.local_nodes == 3 and s.live.jpa is None
    assert s.live.report_url == "http://127.0.0.1:9000/api/workers" and s.live.config.max_jobs == 4
    with pytest.raises(SettingsError) as e:
        settings_from(build_parser().parse_args(["--nodes", "nodes.txt"]))
    assert e.value.render(flag).startswith("--nodes: a replay takes a number of nodes")
