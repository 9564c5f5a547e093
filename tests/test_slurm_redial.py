"""A pilot outliving its hub (the harvester killed) without Slurm: the real pilot program in a
subprocess, the hub in process. The hub's identity (port, token, certificate) is kept in a file
(core/pilots/identity.py); a pilot that loses the hub keeps its workers and redials it for its
orphan timeout, and its new hello lists the workers, which a restarted harvester adopts."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.pilots import identity
from core.pilots.hub import PilotHub, PilotLink
from core.pilots.identity import HubIdentity, IdentityError
from core.pilots.tls import server_context
from core.pilots.wire import ENV_HUB, ENV_HUB_SHA256, ENV_ORPHAN, ENV_TOKEN, HELLO, START, dial
from tests.support.files import ROOT
from tests.support.waiting import wait


def hub(ident: HubIdentity, hellos: list, port: int = 0) -> PilotHub:
    return PilotHub(ident.token, hellos.append, lambda link, why: None, port=port,
                    identity=(ident.cert_pem, ident.key_pem))


def pilot(address: str, sha256: str, token: str, orphan_s: float, tmp: Path) -> subprocess.Popen:
    env = {**os.environ, ENV_HUB: address, ENV_HUB_SHA256: sha256, ENV_TOKEN: token, ENV_ORPHAN: str(orphan_s),
           "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node1"}
    return subprocess.Popen([sys.executable, "-c", "import sys; from core.pilots.pilot_job import main; "
                             "sys.exit(main())"], cwd=ROOT, env=env, stdout=(tmp / "pilot.log").open("w"),
                            stderr=subprocess.STDOUT)


def start_worker(link: PilotLink, tmp: Path) -> int:
    reply = link.request(START, 10, argv=[sys.executable, "-c", "import time; time.sleep(120)"],
                         env={"HARVEST_JOB": "j1", "HARVEST_NODE": "node1", "HARVEST_INCARNATION": "4"},
                         workdir="", log=str(tmp / "w.log"))
    assert reply["ok"], reply
    return reply["pid"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[-1].split()[0] != "Z"


def test_the_identity_is_kept_whole_and_private_and_the_hub_shows_the_same_certificate(tmp_path):
    path = tmp_path / "h.db.hub"
    assert identity.load(path) is None
    ident = HubIdentity.new().with_port(40123)
    identity.save(path, ident)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert identity.load(path) == ident
    whole = path.read_text()
    assert server_context((ident.cert_pem, ident.key_pem))[1] == server_context((ident.cert_pem, ident.key_pem))[1]
    assert server_context()[1] != server_context((ident.cert_pem, ident.key_pem))[1]
    for damage in ("", "{", '{"token": "short", "cert_pem": "", "key_pem": "", "port": 1}', "[1, 2]",
                   whole[:200], whole.replace('"port": 40123', '"port": 70000')):
        path.write_text(damage)
        with pytest.raises(IdentityError) as e:
            identity.load(path)
        assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_pilot_keeps_its_workers_and_redials_a_restarted_hub_which_it_tells_about_them(tmp_path):
    ident = HubIdentity.new()
    hellos: list[PilotLink] = []
    first = hub(ident, hellos)
    port = first.address[1]
    p = pilot("127.0.0.1:%d" % port, first.fingerprint, ident.token, 60, tmp_path)
    second = None
    try:
        link = wait(lambda: first.link("node1"), 10, "the pilot's hello")
        assert link.workers == []
        pid = start_worker(link, tmp_path)
        first.close()                                  # the harvester dies
        time.sleep(1.5)
        assert p.poll() is None and alive(pid), "the pilot and its worker stay"
        second = hub(ident, hellos, port=port)         # the restart: same port, token and certificate
        assert second.fingerprint == first.fingerprint
        again = wait(lambda: second.link("node1"), 10, "the pilot redialed", lambda: (tmp_path / "pilot.log").read_text())
        assert again.job == "77"
        [w] = again.workers
        assert (w["pid"], w["job"], w["key"], w["inc"]) == (pid, "j1", "node1", 4)
        assert alive(pid)
    finally:
        if second is not None:
            second.close()
        p.send_signal(signal.SIGTERM)
        p.wait(15)
    assert not alive(pid), "the worker goes with its pilot"
    assert "redialed the harvester" in (tmp_path / "pilot.log").read_text()


def test_a_pilot_gives_up_after_its_orphan_timeout_and_stops_its_workers(tmp_path):
    ident = HubIdentity.new()
    h = hub(ident, [])
    p = pilot("127.0.0.1:%d" % h.address[1], h.fingerprint, ident.token, 2, tmp_path)
    try:
        link = wait(lambda: h.link("node1"), 10, "the pilot's hello")
        pid = start_worker(link, tmp_path)
        h.close()
        t0 = time.monotonic()
        assert p.wait(20) == 0
        took = time.monotonic() - t0
        assert 1.5 <= took < 10, took
        assert not alive(pid)
        assert "no harvester within 2 s" in (tmp_path / "pilot.log").read_text()
    finally:
        if p.poll() is None:
            p.kill()


def test_a_hello_with_a_malformed_list_of_workers_is_refused():
    ident = HubIdentity.new()
    hellos: list[PilotLink] = []
    h = hub(ident, hellos)
    try:
        for workers in ([{"pid": "1"}], "all", [{"pid": 1, "token": "t", "log": "l", "job": "j", "key": "k",
                                                  "inc": True}], [{}] * 2000):
            w = dial("127.0.0.1:%d" % h.address[1], h.fingerprint, timeout_s=5)
            w.send({"op": HELLO, "token": ident.token, "job": "5", "node": "node2", "pid": 1, "workers": workers})
            assert w.recv() is None, workers          # closed without a welcome
            w.close()
        assert not hellos
    finally:
        h.close()
