"""Settings whose servers could not all listen are refused before anything starts (issue 56,
item 7; core/listeners.py): `--print-config` and a start each exit 2 with one line naming the
options, and a refused start writes nothing (no store, no secret, no demo password). A wildcard
--host covers the advertised address: one listener, where two used to fail with EADDRINUSE.

Real sockets on loopback only: a port held by this test, the harvester's own servers meeting on
one port; 192.0.2.1 (TEST-NET-1, RFC 5737) is no address of any machine here, so nothing binds
it. The documented start itself, `--host 0.0.0.0 --advertise HEAD` on three hosts, is
tests/test_own_machines.py (network namespaces, so 0.0.0.0 is only a test host's)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import SettingsError
from core.listeners import check, plan, web_listen
from core.settings import HarvesterSettings
from tests.support.files import ROOT
from tests.support.ports import free_port
from tests.support.server import write_users

NOT_HERE = "192.0.2.1"


def live(**kw) -> HarvesterSettings:
    return HarvesterSettings.parse({"live": {"dispatch": "local", "local_nodes": 1, **kw}})


def run(*args: str, cwd: Path, users: bool = False) -> subprocess.CompletedProcess:
    """`python -m app ARGS` in `cwd` (its store and files land there), HARVEST_ variables cleared."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARVEST_")}
    env["PYTHONPATH"] = str(ROOT)
    extra = ("--users", str(write_users(cwd.parent / f"{cwd.name}-users.json"))) if users else ()
    return subprocess.run([sys.executable, "-m", "app", *extra, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def refused(r: subprocess.CompletedProcess) -> str:
    """The one line of a refusal (exit 2, nothing on stdout, no traceback)."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and not r.stdout.strip(), r.stdout
    return lines[0]


# ------------------------------------------------------------------------------ the plan, pure

def test_a_wildcard_host_covers_the_advertised_address_one_listener():
    s = live(advertise="10.1.0.5")
    web = [it for it in plan("0.0.0.0", 8050, s.live) if it.role == "web"]
    assert web_listen(web) == "0.0.0.0:8050"
    assert [it.shown for it in plan("0.0.0.0", 8050, s.live) if it.role == "stores"] == ["10.1.0.5:0"]
    # a specific --host keeps its own socket beside the advertised one; a repeat is bound once
    assert web_listen(plan("127.0.0.1", 8050, s.live)) == "127.0.0.1:8050 10.1.0.5:8050"
    assert web_listen(plan("10.1.0.5", 8050, s.live)) == "10.1.0.5:8050"
    # --bind 0.0.0.0 covers --host 127.0.0.1 (two sockets here failed the same way)
    assert web_listen(plan("127.0.0.1", 8050, live(advertise="head01", bind="0.0.0.0").live)) == "0.0.0.0:8050"
    # :: is IPv6 only (waitress sets IPV6_V6ONLY): an IPv4 address beside it keeps its socket
    assert web_listen(plan("::", 8050, s.live)) == "[::]:8050 10.1.0.5:8050"
    # a replay, or live with no --advertise: --host alone
    assert web_listen(plan("0.0.0.0", 8050, None)) == "0.0.0.0:8050"
    assert [it.role for it in plan("127.0.0.1", 8050, live().live)] == ["web", "stores"]


def test_the_slurm_hub_listens_where_the_servers_for_the_nodes_do():
    s = HarvesterSettings.parse({"live": {"source": "slurm", "advertise": "10.1.0.5"}}).live
    assert (s.hub_host, s.hub_on_bind) == ("10.1.0.5", True)
    hub = [it for it in plan("0.0.0.0", 8050, s) if it.role == "hub"]
    assert [(it.shown, it.field) for it in hub] == [("10.1.0.5:0", "live.advertise")]
    dry = HarvesterSettings.parse({"live": {"source": "slurm", "slurm": {"dry_run": True}}}).live
    assert not [it for it in plan("127.0.0.1", 8050, dry) if it.role == "hub"]     # a dry run starts none


def test_the_harvesters_own_servers_on_one_port_are_refused_naming_both():
    port = free_port()
    s = HarvesterSettings.parse({"live": {"source": "slurm", "advertise": "127.0.0.1",
                                          "slurm": {"hub_host": "127.0.0.1", "hub_port": port}}}).live
    with pytest.raises(SettingsError) as e:
        check(plan("0.0.0.0", port, s))
    assert e.value.field == "live.slurm.hub_host" and "{host} and {port}" in e.value.message, e.value.message
    assert "one port cannot take both" in e.value.message


# ------------------------------------------------------------------ --print-config and a start

@pytest.mark.parametrize("mode", ["--print-config", "start"])
def test_a_port_in_use_is_refused_in_one_line_and_a_start_writes_nothing(tmp_path, mode):
    held = socket.create_server(("127.0.0.1", 0))
    port = held.getsockname()[1]
    try:
        args = ("--port", str(port), "--dispatch", "simulated", "--local-nodes", "2")
        line = refused(run(*args, *((mode,) if mode != "start" else ()), cwd=tmp_path))
    finally:
        held.close()
    assert line == (f"error: --port: port {port} is in use on 127.0.0.1 (--host): another program listens there, "
                    "so the web server (dashboard, API, workers' reports) cannot; stop it or choose another port")
    assert list(tmp_path.iterdir()) == []        # no store, no secret, no demo password file


def test_the_port_is_free_again_after_a_check(tmp_path):
    """--print-config binds each socket and closes it: the port can be listened on right after."""
    port = free_port()
    r = run("--port", str(port), "--dispatch", "simulated", "--local-nodes", "2", "--advertise", "127.0.0.1",
            "--print-config", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    socket.create_server(("127.0.0.1", port)).close()


@pytest.mark.parametrize("args,expected", [
    (("--host", NOT_HERE),
     f"error: --host: {NOT_HERE} is not an address of this machine, so the web server (dashboard, API, workers' "
     "reports) cannot listen there: give one of its addresses, or 0.0.0.0 for all of them"),
    # no --bind: the web server and the jobs' stores would listen on the advertised address
    (("--dispatch", "local", "--local-nodes", "1", "--advertise", NOT_HERE),
     f"error: --advertise: {NOT_HERE} is not an address of this machine, so the web server"),
    # the web server on every address, but each job's store still on the advertised one
    (("--dispatch", "local", "--local-nodes", "1", "--advertise", NOT_HERE, "--host", "0.0.0.0"),
     f"error: --advertise: {NOT_HERE} is not an address of this machine, so the jobs' stores cannot listen "
     "there: give one of its addresses; or keep --advertise for the address the nodes dial"),
    (("--dispatch", "local", "--local-nodes", "1", "--advertise", "127.0.0.1", "--bind", NOT_HERE),
     f"error: --bind: {NOT_HERE} is not an address of this machine"),
    (("--dispatch", "local", "--local-nodes", "1", "--port", "0"),
     "error: --port: 0 (any free port) cannot be told to the nodes"),
], ids=["host", "advertise", "advertise-wildcard-host", "bind", "port-0-live"])
def test_addresses_that_cannot_be_listened_on_are_refused(tmp_path, args, expected):
    for mode in (("--print-config",), ()):
        line = refused(run(*args, *mode, cwd=tmp_path, users=True))
        assert line.startswith(expected), line
        assert list(tmp_path.iterdir()) == []


def test_the_hub_on_the_web_port_is_refused_by_the_print_config(tmp_path):
    port = free_port()
    line = refused(run("--source", "slurm", "--slurm-hub", f"127.0.0.1:{port}", "--port", str(port),
                       "--advertise", "127.0.0.1", "--print-config", cwd=tmp_path))
    assert line == (f"error: --slurm-hub: the Slurm pilot hub would listen on 127.0.0.1:{port}, where the web "
                    "server (dashboard, API, workers' reports) listens by --host and --port: one port cannot take "
                    "both; give one of them another port"), line


def test_a_port_held_by_the_harvester_of_the_same_store_is_left_to_its_lock(tmp_path):
    """--print-config tests a file before a restart, while the running harvester holds the port:
    not refused; a start is refused by the store's lock, naming that harvester."""
    from tests.support.server import start_app
    app = start_app(tmp_path, "--dispatch", "simulated", "--local-nodes", "2")
    try:
        port = app.url.rsplit(":", 1)[1]
        same = ("--port", port, "--db", str(app.db), "--dispatch", "simulated", "--local-nodes", "2")
        r = run(*same, "--print-config", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        line = refused(run(*same, cwd=tmp_path, users=True))
        assert f"in use by another harvester (pid {app.proc.pid})" in line, line
        other = tmp_path / "other"
        other.mkdir()
        line = refused(run("--port", port, "--dispatch", "simulated", "--local-nodes", "2", "--print-config",
                           cwd=other))
        assert line.startswith(f"error: --port: port {port} is in use on 127.0.0.1"), line
    finally:
        app.stop()


def test_the_check_imports_nothing_heavy():
    """--print-config with live addresses still loads neither the engine nor the web app."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "app", "--dispatch", "local", "--local-nodes", "1",
                        "--advertise", "127.0.0.1", "--port", str(free_port()), "--print-config"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    names = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in r.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    assert "core" in names and not names & {"torch", "dash", "plotly", "pulp", "flask", "waitress", "apscheduler",
                                            "optuna"}, sorted(names)
