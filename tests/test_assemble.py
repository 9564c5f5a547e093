"""core/assemble.py: one place builds every harvester from settings, with the capabilities
front ends ask for instead of a mode string."""
from __future__ import annotations

import pytest

from core.assemble import build
from core.dispatchers.simulated import SimulatedDispatcher
from core.dispatchers.workers import WorkerDispatcher
from core.errors import InputError, SettingsError
from core.service import Capabilities, LiveHarvester, ReplayHarvester, Unsupported
from core.settings import HarvesterSettings
from core.sources.static import StaticSource
from core.transports.local import LocalTransport
from core.transports.ssh import SshTransport
from tests.support.fakeslurm import fake_slurm


def built(tmp_path, **data):
    return build(HarvesterSettings.parse({"db": tmp_path / "h.db", **data}))


def test_a_replay_harvester_can_restart_and_change_speed(tmp_path, small_trace, small_jobs):
    h = built(tmp_path, replay={"trace": small_trace, "jobs": small_jobs, "hours": 1}, speed=90)
    assert isinstance(h, ReplayHarvester) and h.speed == 90 and h.tick_s == 0.5
    assert h.capabilities == Capabilities(can_restart=True, can_set_speed=True)
    with pytest.raises(Unsupported):
        h.worker_report("j", None, b"{}")
    with pytest.raises(Unsupported):
        h.reclaim_node("r00n00")
    assert not (tmp_path / "h.db").exists(), "building opens nothing; open() does"


def test_live_harvesters_get_the_source_and_dispatcher_their_settings_name(tmp_path):
    sim = built(tmp_path, live={"dispatch": "simulated", "local_nodes": 3})
    assert isinstance(sim, LiveHarvester) and isinstance(sim.source, StaticSource)
    assert isinstance(sim.dispatcher, SimulatedDispatcher) and sim.jpa is None and not sim.require_command
    assert sim.capabilities == Capabilities(operates_nodes=True)
    with pytest.raises(Unsupported):
        sim.set_speed(10)
    with pytest.raises(Unsupported):
        sim.restart()
    local = built(tmp_path, tick_s=0.1, live={"dispatch": "local", "local_nodes": 2,
                                               "report_url": "http://127.0.0.1:1/api/workers"})
    try:
        assert isinstance(local.dispatcher, WorkerDispatcher) and isinstance(local.dispatcher.transport, LocalTransport)
        assert local.require_command and local.jpa is not None and local.tick_s == 0.1
        assert local.capabilities == Capabilities(runs_workers=True, operates_nodes=True, clears_nodes=True)   # staff clear a node held out after a fault of its own
        assert local.dispatcher.report_base == "http://127.0.0.1:1/api/workers"
        assert local.dispatcher.logdir.name == "h.db.workers"
        assert local.source.node_names() == list(local.dispatcher.specs)
    finally:
        local.dispatcher.close()


def test_ssh_workers_come_from_the_inventory(tmp_path):
    inventory = tmp_path / "nodes.txt"
    inventory.write_text("n1 alice@10.0.0.1\nn2 alice@10.0.0.2 2\n")
    (tmp_path / "ssh_config").write_text("")
    h = built(tmp_path, live={"dispatch": "ssh", "inventory": inventory, "ssh_config": tmp_path / "ssh_config",
                              "advertise": "10.0.0.254"})
    try:
        assert isinstance(h.dispatcher.transport, SshTransport)
        assert h.source.node_names() == ["n1", "n2"] and sorted(h.dispatcher.specs) == ["n1", "n2"]
        assert h.dispatcher.coordinator_host == "10.0.0.254" == h.dispatcher.coordinator_bind
    finally:
        h.dispatcher.close()
    inventory.write_text("n1 alice@10.0.0.1\nn1 alice@10.0.0.2\n")
    with pytest.raises(InputError):
        built(tmp_path, live={"dispatch": "ssh", "inventory": inventory})


def test_remote_nodes_refuse_a_loopback_address(tmp_path):
    """ssh -G resolves each node's target (aliases of the ssh config included; nothing is sent):
    a node on another host would dial its own loopback for its job's store and reports."""
    config = tmp_path / "ssh_config"
    config.write_text("Host far\n  HostName 10.0.0.7\nHost near\n  HostName 127.0.0.1\n")
    inventory = tmp_path / "nodes.txt"
    inventory.write_text("a near\nb far\n")
    live = {"dispatch": "ssh", "inventory": inventory, "ssh_config": config}
    with pytest.raises(SettingsError) as e:
        built(tmp_path, live=live)
    assert e.value.field == "live.advertise" and e.value.message.startswith("b run on other hosts")
    with pytest.raises(SettingsError):     # the report URL is an address of the nodes too
        built(tmp_path, live={**live, "advertise": "10.0.0.254", "report_url": "http://127.0.0.1:8050/api/workers"})
    h = built(tmp_path, live={**live, "advertise": "10.0.0.254", "report_url": "http://10.0.0.254:8050/api/workers"})
    h.dispatcher.close()
    inventory.write_text("a near\n")
    built(tmp_path, live=live).dispatcher.close()


def test_slurm_nodes_elsewhere_refuse_a_loopback_hub(tmp_path, monkeypatch):
    """Slurm's NodeAddr says where a pilot runs: pilots there would dial their own loopback for
    the hub. With --advertise the hub listens where --bind says and pilots dial the advertised
    address (nothing is sent to it here: the fakes answer for Slurm)."""
    fake_slurm(tmp_path, monkeypatch, addresses=["10.0.0.7", "10.0.0.8"])
    slurm = {"conf": "", "python": "/usr/bin/python3"}
    with pytest.raises(SettingsError) as e:
        built(tmp_path, live={"source": "slurm", "dispatch": "simulated", "slurm": slurm})
    assert e.value.field == "live.advertise" and "node1, node2 run on other hosts" in e.value.message
    h = built(tmp_path, live={"source": "slurm", "dispatch": "simulated", "slurm": slurm,
                              "advertise": "10.0.0.254", "bind": "127.0.0.1"})
    try:
        assert h.source.settings.advertise == "10.0.0.254" and h.source.settings.hub_host == "127.0.0.1"
        assert h.source.address_of("node1") == "10.0.0.7"
    finally:
        h.close()


def test_a_slurm_that_cannot_be_read_is_a_clear_error(tmp_path):
    with pytest.raises(SettingsError) as e:
        built(tmp_path, live={"source": "slurm", "slurm": {"conf": str(tmp_path / "no-such-slurm.conf"),
                                                            "command_timeout_s": 2}})
    assert e.value.field == "" and e.value.message.startswith("cannot read Slurm")


@pytest.mark.parametrize("version, sinfo, says", [
    ("slurm 21.08.8", None, "cannot read Slurm: Slurm 21.08.8 is older than 22.05, the oldest this harvester reads"),
    ("slurm 25.11.1", "node1 idle scavenger\n", "cannot read Slurm: cannot read the nodes of Slurm 25.11.1: "
                                                 "sinfo line 1 has not the 5 fields asked for: 'node1 idle scavenger'"),
    ("slurm 24.11.5", "", "partition: Slurm 24.11.5 has no partition 'scavenger' with nodes (it has none)")])
def test_a_slurm_too_old_or_unreadable_is_one_line_naming_its_version(tmp_path, monkeypatch, version, sinfo, says):
    fake_slurm(tmp_path, monkeypatch, version=version, sinfo=sinfo)
    with pytest.raises(SettingsError) as e:
        built(tmp_path, live={"source": "slurm", "dispatch": "simulated", "slurm": {"python": "/usr/bin/python3"}})
    assert e.value.render() == says and "\n" not in says
