"""Cancel, failure and shutdown end every process a job started, daemonised ones included
(issue 47, row 5). The job's command starts a child in its own session (`setsid`, out of the
worker's process group) and a double-forked daemon (setsid, then its parent exits: it is not
even a descendant of the worker any more), then trains on (or fails); the job is cancelled,
fails, or the harvester shuts down, and then no process of the job may be left, nor a cgroup of
its workers. A harvester built in the test's process, local workers as the test's account and
as an account of the test's own (`--run-as`), and ssh workers through a loopback sshd. The
mechanisms themselves (cgroup v2, v1 freezer, the environment fallback, leftovers of a crashed
run): tests/test_cleanup.py.
"""
from __future__ import annotations

import ctypes
import os
import pwd
import random
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest

from core.assemble import build
from core.schemas import JobSpec
from core.settings import HarvesterSettings
from tests.support.accounts import LAUNCHER, unix_account
from tests.support.procs import processes_with_cmdline
from tests.support.slurm import slurm_cluster  # noqa: F401  (the fixture)
from tests.support.waiting import wait

#: the job: two daemons, a line in its log, then `{end}` (train on: sleep; or fail)
SCRIPT = r"""
setsid sh -c 'exec sleep 4242.{tag}' &
sh -c 'setsid sh -c "exec sleep 4343.{tag}" & exit 0'
echo daemons started
{end}
"""
RUN_ON = "exec sleep 600"
PR_SET_CHILD_SUBREAPER = 36
FAIL = "sleep 1; echo giving up >&2; exit 3"


def daemons(tag: str) -> list[int]:
    """The job's two daemons, once they run (the shell and sudo hold the tag in their script)."""
    return [p for p, cmd in processes_with_cmdline(tag).items() if cmd in (f"sleep 4242.{tag}", f"sleep 4343.{tag}")]


def worker_cgroups() -> list[Path]:
    """The worker cgroups harvesters of this process made (`<mount>/harvest/<this process>/<n>`)."""
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 3 and (parts[2] == "cgroup2" or (parts[2] == "cgroup" and "freezer" in parts[3].split(","))):
            out += [p for p in Path(parts[1], "harvest").glob(f"*.{os.getpid()}.*/*") if p.is_dir()]
    return out


def kill_all(tag: str) -> None:
    for pid in processes_with_cmdline(tag):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


@pytest.fixture
def tag() -> Iterator[str]:
    """A number no other process has in its command line; whatever holds it is killed at the end."""
    t = f"{os.getpid()}{random.randint(100000, 999999)}"
    yield t
    kill_all(t)


def harvester(db: Path, **live):
    h = build(HarvesterSettings.parse({"db": db, "tick_s": 0.1, "live": {
        "profiler": False, "config": {"tfwd": 60}, "trust_user_commands": True,
        "workers": {"rejoin_after_s": 1.0, "max_crashes": 1}, **live}}))
    h.open()
    return h


def spec(tag: str, end: str, launcher: str) -> JobSpec:
    extra = {"global_batch": 64} if launcher == "runtime" else {"launcher": "torchrun"}
    return JobSpec(name="daemons", min_nodes=1, max_nodes=1, total_samples=64 * 10 ** 6, curve="1:100",
                   scale_up_seconds=0, scale_down_seconds=0, stop_grace_seconds=2,
                   command=["/bin/sh", "-c", SCRIPT.format(tag=tag, end=end)], **extra)


def run(h, tag: str, how: str, launcher: str = "torchrun", unix: str = "") -> list[int]:
    """Submit the job, see its daemons run, end it `how`, then check that nothing of it is left;
    the daemons' PIDs."""
    job = h.submit(spec(tag, FAIL if how == "fail" else RUN_ON, launcher), "alice", unix=unix)
    state = lambda: h.job(job.id).state.value
    wait(lambda: len(daemons(tag)) == 2, 60, "the job's two daemons", lambda: (state(), processes_with_cmdline(tag)))
    seen = daemons(tag)
    if unix:
        uid = pwd.getpwnam(unix).pw_uid
        assert all(os.stat(f"/proc/{p}").st_uid == uid for p in daemons(tag)), "they run as the job's account"
    if how == "cancel":
        h.cancel(job.id)
        wait(lambda: state() == "cancelled", 10, "the cancel", state)
    elif how == "fail":
        wait(lambda: state() == "failed", 60, "the job to fail", state)
    else:
        h.close()
    t0 = time.monotonic()
    left: Optional[dict] = None
    while time.monotonic() - t0 < (0.5 if how == "shutdown" else 15):
        left = processes_with_cmdline(tag)
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"after the {how}, processes of the job still run: {left}"
    wait(lambda: not worker_cgroups(), 5, "its workers' cgroups to go", worker_cgroups)
    return seen


@pytest.mark.parametrize("launcher", ["runtime", "torchrun"])
@pytest.mark.parametrize("how", ["cancel", "fail", "shutdown"])
def test_local_workers_leave_no_process(tmp_path, tag, how, launcher):
    h = harvester(tmp_path / "live.db", dispatch="local", local_nodes=1)
    try:
        run(h, tag, how, launcher)
    finally:
        if how != "shutdown":
            h.close()
    assert not processes_with_cmdline(tag) and not worker_cgroups()


@pytest.fixture
def account() -> Iterator[str]:
    """An account of the test's own; its fixture fails the test if any process of it outlives it."""
    with unix_account("hvclean") as name:
        yield name


@pytest.fixture
def reaper() -> Iterator[list[int]]:
    """This process is the subreaper of what it starts while the test runs (an orphaned daemon
    is reparented to it, not to PID 1, which here reaps nothing) and reaps the PIDs the test
    lists: the account's fixture counts a zombie of the account as a process left running."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    pids: list[int] = []
    try:
        yield pids
    finally:
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in pids:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.02)


@pytest.mark.parametrize("how", ["cancel", "fail", "shutdown"])
def test_jobs_run_as_their_owner_leave_no_process(tmp_path, tag, how, account, reaper):
    h = harvester(tmp_path / "live.db", dispatch="local", local_nodes=1, run_as=LAUNCHER, trust_user_commands=False)
    try:
        reaper += run(h, tag, how, unix=account)
    finally:
        if how != "shutdown":
            h.close()
    assert not processes_with_cmdline(tag) and not worker_cgroups()


@pytest.mark.parametrize("how", ["cancel", "shutdown"])
def test_ssh_workers_leave_no_process(tmp_path, tag, how, sshd_server):
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("node0 node0\n")
    h = harvester(tmp_path / "live.db", dispatch="ssh", inventory=nodes, ssh_config=sshd_server.client_config,
                  workdir=str(tmp_path))
    try:
        run(h, tag, how)
    finally:
        if how != "shutdown":
            h.close()
    assert not processes_with_cmdline(tag) and not worker_cgroups()


@pytest.mark.parametrize("how", ["cancel", "pilot"])
def test_workers_in_slurm_pilots_leave_no_process(slurm_cluster, tmp_path, tag, how):
    """Inside a pilot the worker's daemons are found by their mark (no cgroup of ours there:
    it would take them out of Slurm's). "pilot": Slurm ends the pilot itself (scancel, as a
    preemption would); its proctrack/linuxproc finds no orphan, the pilot's stop does."""
    cluster = slurm_cluster
    cluster.wait_quiet()
    h = harvester(tmp_path / "live.db", source="slurm", slurm={**cluster.slurm_settings(), "watch": ("node1",)})
    try:
        job = h.submit(spec(tag, RUN_ON, "torchrun"), "alice")
        wait(lambda: len(daemons(tag)) == 4, 90, "the daemons of the job's two ranks (one per GPU) in a pilot",
             lambda: (h.job(job.id).state.value, processes_with_cmdline(tag)))
        before = set(processes_with_cmdline(tag))
        if how == "cancel":
            h.cancel(job.id)
        else:                   # the job goes on in a new pilot: only the old one's processes must go
            cluster.run("scancel", h.source.hub.link("node1").job)
        left = lambda: {p: cmd for p, cmd in processes_with_cmdline(tag).items() if p in before}
        wait(lambda: not left(), 15, f"the job's processes to go after the {how}", left)
    finally:
        h.close()
    cluster.wait_quiet()
    assert not processes_with_cmdline(tag)


def test_the_daemons_are_what_the_process_group_misses(tmp_path, tag):
    """The job's daemons are outside its worker's process group and session: what a stop that
    signals only the group would leave (the case this file is about, not a test artefact)."""
    h = harvester(tmp_path / "live.db", dispatch="local", local_nodes=1)
    try:
        job = h.submit(spec(tag, RUN_ON, "torchrun"), "alice")
        wait(lambda: len(daemons(tag)) == 2, 60, "the job's two daemons")
        worker = h.dispatcher.restarts.keyed_handles(job.id)[0][1]
        for pid in daemons(tag):
            assert os.getpgid(pid) != worker.pid and os.getsid(pid) != worker.pid
        ppids = {int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) for p in daemons(tag)}
        assert worker.pid in ppids and len(ppids) == 2, "one is the worker's child, the other an orphan"
    finally:
        h.close()
    assert not processes_with_cmdline(tag)
