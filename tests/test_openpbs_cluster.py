"""The OpenPBS test cluster itself (tests/support/openpbs.py), on real daemons: it starts with
every vnode free, a pinned job runs and reaches a listener in this namespace with the checkout's
Python, a `main` job preempts a pilot-queue job on its vnode, and stopping leaves nothing."""
from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.netns import namespaces, netns_pids
from tests.support.openpbs import NETNS_ETC, PbsCluster, pbs_cluster  # noqa: F401  (module fixture)

DIAL = """import json, os, socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:
    s.sendall(json.dumps(dict(os.environ)).encode())
"""
TRAP = """#!/bin/sh
trap 'echo TERM >> "$SIGFILE"; exit 0' TERM
echo started >> "$SIGFILE"
while :; do sleep 0.1; done
"""


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"{what} not within {timeout} s")


def test_all_vnodes_free_through_the_wrappers(pbs_cluster: PbsCluster) -> None:
    r = subprocess.run([str(pbs_cluster.bin_dir / "pbsnodes"), "-av", "-F", "json"], capture_output=True,
                       text=True, timeout=30, env={"PATH": os.environ["PATH"]})
    assert r.returncode == 0, r.stderr
    nodes = json.loads(r.stdout)["nodes"]
    assert {name: nodes[name]["state"] for name in pbs_cluster.vnodes} == {v: "free" for v in pbs_cluster.vnodes}
    assert nodes["vn007"]["resources_available"]["ngpus"] == 2
    assert nodes["pbshead"]["resources_available"]["ncpus"] == 0
    assert not Path("/etc/pbs.conf").exists()


def test_a_pinned_job_runs_the_checkouts_python_and_dials_the_head(pbs_cluster: PbsCluster, tmp_path: Path) -> None:
    got: list[bytes] = []
    with socket.create_server((pbs_cluster.head_address, 0)) as server:
        port = server.getsockname()[1]
        server.settimeout(60)

        def accept() -> None:
            conn, _ = server.accept()
            with conn:
                got.append(b"".join(iter(lambda: conn.recv(65536), b"")))

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        dial = tmp_path / "dial.py"
        dial.write_text(DIAL)
        job = pbs_cluster.submit("main", "vn002", [sys.executable, str(dial), pbs_cluster.head_address, str(port)])
        t.join(60)
    assert got, f"the job never connected: {pbs_cluster.job(job)}"
    env = json.loads(got[0])
    assert env["PBS_JOBID"] == job
    assert env["PBS_QUEUE"] == "main"
    info = pbs_cluster.wait_job(job, "F")
    assert info["exec_vnode"] == "(vn002:ncpus=1)"
    assert info["Exit_status"] == 0


def test_a_main_job_preempts_a_pilot_on_its_vnode(pbs_cluster: PbsCluster, tmp_path: Path) -> None:
    script, sigfile = tmp_path / "pilot.sh", tmp_path / "signals"
    script.write_text(TRAP)
    script.chmod(0o755)
    pilot = pbs_cluster.submit(pbs_cluster.pilot_queue, "vn003", [str(script)], "pilot",
                               extra=["-v", f"SIGFILE={sigfile}", "-r", "y"])
    _wait_for(lambda: sigfile.exists() and "started" in sigfile.read_text(), 30, "the pilot starting")
    main = pbs_cluster.submit_main("vn003", 30)
    _wait_for(lambda: "TERM" in sigfile.read_text(), 15, "SIGTERM reaching the pilot")
    running = pbs_cluster.wait_job(main, "R", timeout=40)
    assert running["exec_vnode"] == "(vn003:ncpus=1)"
    requeued = pbs_cluster.job(pilot)
    assert requeued["job_state"] == "Q" and requeued["run_count"] >= 1
    pbs_cluster.run(["qdel", pilot], check=True)
    pbs_cluster.wait_job(pilot, "F", timeout=20)
    pbs_cluster.run(["qdel", main], check=True)


def test_stopping_leaves_no_process_namespace_or_file(tmp_path: Path) -> None:
    with PbsCluster(tmp_path / "pbs", vnodes=1) as pbs:
        pbs.submit_main("vn001", 300)
        pids = pbs.daemon_pids()
        ns = pbs.netns
        assert set(pids) == {"pbs_server", "pbs_sched", "pbs_mom", "pbs_comm", "postgres"}
        exits = [os.pidfd_open(pid) for pid in pids.values()]  # readable once the process is gone
        assert (NETNS_ETC / ns / "hosts").exists()
    assert ns not in namespaces()
    assert not netns_pids(ns)
    assert all(select.select([fd], [], [], 0)[0] for fd in exits)
    assert not (NETNS_ETC / ns).exists()
    assert pbs.leftovers() == []
