"""The mechanisms that end every process of a worker (core/transports/cleanup.py), each on its
own: a cgroup v2 per worker, a cgroup in the v1 freezer hierarchy, and the fallback that finds a
worker's processes by HARVEST_WORKER in /proc/*/environ; the same in sh over ssh; and what a
harvester that crashed leaves, which the next one on the host removes, never touching a live
one's. Every worker here starts a child in its own session, a double-forked daemon and (for the
cgroups) one that clears its environment. Jobs end to end: tests/test_job_cleanup.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from core.transports import LocalTransport, NodeSpec, SshTransport
from core.transports.base import STOP_GONE, STOP_KILL, STOP_TERM, Handle
from core.transports.cleanup import (CGROUP1, CGROUP2, ENV_MARK, ENVIRON, PARENT, Cleanup, cgroup_mounts,
                                     check_mark, host_prefix, instance, new_mark)
from core.transports.ssh import _LIB
from tests.support.files import ROOT
from tests.support.procs import processes_with_cmdline, tag  # noqa: F401  (tag: the fixture)
from tests.support.waiting import wait

NODE = NodeSpec("n0")
#: a worker that daemonises three ways, then runs on (`{end}`)
DAEMONS = r"""
setsid sh -c 'exec sleep 4242.{tag}' &
sh -c 'setsid sh -c "exec sleep 4343.{tag}" & exit 0'
{wipe}
echo started
{end}
"""
#: a child that execs with no environment at all: only a cgroup finds it
WIPE = "setsid env -i /bin/sleep 4444.{tag} &"


def mechanisms() -> list[str]:
    """Those this host offers (the test machines mount cgroup v2 and the v1 freezer, as root)."""
    out = [ENVIRON]
    for mode in (CGROUP2, CGROUP1):
        try:
            Cleanup(mode)
            out.append(mode)
        except OSError:
            pass
    return out


def sleepers(tag: str) -> set[str]:
    return {cmd for cmd in processes_with_cmdline(tag).values() if cmd.split()[-1].endswith(tag) and "sleep" in cmd}


def cgroup_dirs(mark: str) -> list[Path]:
    return [p for m in cgroup_mounts().values() if (p := Path(m, PARENT, mark)).exists()]



def start(t, tag: str, end: str = "exec sleep 600", wipe: bool = True, sleeping: int = 0) -> Handle:
    """The worker, once its daemons (and `sleeping` more sleeps with the tag) run."""
    h = t.start(NODE, ["/bin/sh", "-c", DAEMONS.format(tag=tag, end=end, wipe=WIPE.format(tag=tag) if wipe else "")],
                {}, "", f"/tmp/cleanup-{tag}.log")
    wait(lambda: len(sleepers(tag)) == 2 + wipe + sleeping, 10, "the daemons", lambda: processes_with_cmdline(tag))
    return h


@pytest.mark.parametrize("mode", mechanisms())
def test_a_stop_ends_every_process_of_the_worker(mode, tag):
    t = LocalTransport(cleanup=mode)
    try:
        assert t.cleanup_of(NODE) == mode
        h = start(t, tag, wipe=mode != ENVIRON)
        assert h.mark and check_mark(h.mark).startswith(instance() + "/")
        assert len(cgroup_dirs(h.mark)) == (0 if mode == ENVIRON else 1)
        t0 = time.monotonic()
        assert t.stop(h, grace_s=5) == STOP_TERM
        assert time.monotonic() - t0 < 2, "sleep ends at SIGTERM: no wait for the grace"
        assert not processes_with_cmdline(tag) and not cgroup_dirs(h.mark)
    finally:
        t.close()


def test_the_fallback_misses_a_process_that_clears_its_environment(tag):
    """The documented limit of the fallback: `env -i` takes the mark with the environment."""
    t = LocalTransport(cleanup=ENVIRON)
    try:
        h = start(t, tag)
        assert t.stop(h, grace_s=2) == STOP_TERM
        assert set(processes_with_cmdline(tag).values()) == {f"/bin/sleep 4444.{tag}"}
    finally:
        t.close()


@pytest.mark.parametrize("mode", mechanisms())
def test_what_ignores_sigterm_is_killed_after_the_grace_and_kill_ends_all_at_once(mode, tag):
    t = LocalTransport(cleanup=mode)
    try:
        stubborn = "trap '' TERM; setsid sh -c \"trap '' TERM; exec sleep 4545.{tag}\" & while :; do sleep 1; done"
        h = start(t, tag, end=stubborn.format(tag=tag), wipe=False, sleeping=1)
        t0 = time.monotonic()
        assert t.stop(h, grace_s=1) == STOP_KILL
        assert 1 <= time.monotonic() - t0 < 4
        assert not processes_with_cmdline(tag) and not cgroup_dirs(h.mark)
        h = start(t, tag, wipe=False)
        t0 = time.monotonic()
        t.kill(h)
        assert time.monotonic() - t0 < 2 and not processes_with_cmdline(tag) and not cgroup_dirs(h.mark)
    finally:
        t.close()


@pytest.mark.parametrize("mode", mechanisms())
def test_a_worker_that_ended_by_itself_has_its_daemons_ended_at_the_stop(mode, tag):
    t = LocalTransport(cleanup=mode)
    try:
        h = start(t, tag, end="exit 3", wipe=False)
        wait(lambda: not t.alive(h), 5, "the worker's own end")
        assert t.exit_status(h) == 3 and len(sleepers(tag)) == 2, "its daemons outlive it"
        assert t.stop(h, grace_s=5) == STOP_GONE
        assert not processes_with_cmdline(tag) and not cgroup_dirs(h.mark)
    finally:
        t.close()


def test_a_worker_that_cannot_join_its_cgroup_starts_and_is_found_by_its_mark(tag, monkeypatch):
    """A cgroup that refuses the worker (a delegation rule, a full pids limit): the fallback."""
    modes = [m for m in mechanisms() if m != ENVIRON]
    if not modes:
        pytest.skip("no writable cgroup hierarchy here")
    t = LocalTransport(cleanup=modes[0])
    try:
        refused = lambda mark: os.open("/dev/null", os.O_RDONLY) if t.cleanup.root else None   # writes fail
        monkeypatch.setattr(t.cleanup, "prepare", refused)
        h = start(t, tag, wipe=False)
        assert t.cleanup_of(NODE) == ENVIRON
        assert t.stop(h, grace_s=5) == STOP_TERM and not processes_with_cmdline(tag)
    finally:
        t.close()


def test_marks_name_paths_and_travel_in_handles():
    m = new_mark()
    assert check_mark(m) == m and m.startswith(host_prefix() + ".") and new_mark() != m
    for bad in ("", "../x", f"{instance()}/../../etc", f"{instance()}/1/2", "a b.1.2.3/4", f"{instance()}/x y"):
        with pytest.raises(ValueError):
            check_mark(bad)
    h = Handle(NODE, 12, "34", "/tmp/x.log", 1.0, m)
    assert Handle.from_dict(h.to_dict()) == h
    old = {k: v for k, v in h.to_dict().items() if k != "mark"}       # stored by an earlier version
    assert Handle.from_dict(old).mark == ""
    with pytest.raises(ValueError):
        LocalTransport(cleanup=ENVIRON).start(NODE, ["true"], {ENV_MARK: "../../x"}, "", "/tmp/never.log")


# ---- a crashed harvester's leftovers -----------------------------------------------------------------
#: a harvester process: a worker that daemonises, then it dies without a word (or lives on)
CRASH = r"""
import os, sys, time
from core.transports import LocalTransport, NodeSpec
t = LocalTransport(cleanup=sys.argv[1])
t.start(NodeSpec("n0"), ["/bin/sh", "-c", sys.argv[2]], {}, "", sys.argv[3])
time.sleep(1.0)
if sys.argv[4] == "crash":
    os._exit(9)
time.sleep(600)
"""


FATES = {"crash": "1", "alive": "2"}     # the last digit of their daemons' tags


def harvester_process(mode: str, tag: str, fate: str, tmp_path: Path) -> subprocess.Popen:
    script = DAEMONS.format(tag=tag + FATES[fate], end="exec sleep 600", wipe="")
    return subprocess.Popen([sys.executable, "-c", CRASH, mode, script, str(tmp_path / f"{fate}.log"), fate],
                            cwd=ROOT)


@pytest.mark.parametrize("mode", mechanisms())
def test_the_next_start_ends_what_a_crashed_run_left_and_nothing_of_a_live_one(mode, tag, tmp_path):
    crashed = harvester_process(mode, tag, "crash", tmp_path)
    alive = harvester_process(mode, tag, "alive", tmp_path)
    try:
        assert crashed.wait(30) == 9
        wait(lambda: len(sleepers(tag + "1")) == 2 and len(sleepers(tag + "2")) == 2, 10, "both runs' daemons")
        dead_folders = [Path(m, PARENT) for m in cgroup_mounts().values()]
        dead = [f for root in dead_folders if root.is_dir() for f in root.glob(f"*.{crashed.pid}.*")]
        assert bool(dead) == (mode != ENVIRON)
        t = LocalTransport(cleanup=mode)        # the next harvester on this host
        try:
            wait(lambda: not processes_with_cmdline(tag + "1"), 5, "the crashed run's workers and daemons to go",
                 lambda: processes_with_cmdline(tag + "1"))
            assert not [f for f in dead if f.exists()], "and so are its cgroups"
            assert len(sleepers(tag + "2")) == 2, "the live run's are left alone"
        finally:
            t.close()
    finally:
        for p in (crashed, alive):
            p.kill()
            p.wait(10)
        for pid in processes_with_cmdline(tag):
            os.kill(pid, 9)
        Cleanup(mode).close()       # the other run is dead now: its folders go too
    # a SIGKILLed process stays in /proc, not yet a zombie, for a moment on a loaded host
    wait(lambda: not processes_with_cmdline(tag), 5, "the test's own processes, killed, to go",
         lambda: processes_with_cmdline(tag))


# ---- over ssh: the same in sh on the node ------------------------------------------------------------
@pytest.fixture
def ssh(sshd_server) -> Iterator[SshTransport]:
    t = SshTransport(config=str(sshd_server.client_config))
    yield t
    t.close()


def test_ssh_workers_join_a_cgroup_on_the_node_and_a_stop_ends_all_of_it(ssh, tag, tmp_path):
    node = NodeSpec("node0", "node0")
    h = ssh.start(node, ["/bin/sh", "-c", DAEMONS.format(tag=tag, end="exec sleep 600", wipe=WIPE.format(tag=tag))],
                  {}, str(tmp_path), str(tmp_path / "w.log"))
    wait(lambda: len(sleepers(tag)) == 3, 10, "the daemons", lambda: processes_with_cmdline(tag))
    expected = CGROUP2 if CGROUP2 in mechanisms() else CGROUP1 if CGROUP1 in mechanisms() else ENVIRON
    assert ssh.cleanup_of(node) == expected
    assert ssh.stop(h, grace_s=5) == STOP_TERM
    assert not processes_with_cmdline(tag) and not cgroup_dirs(h.mark)
    h = ssh.start(node, ["/bin/sh", "-c", DAEMONS.format(tag=tag, end="exec sleep 600", wipe="")], {}, str(tmp_path),
                  str(tmp_path / "w2.log"))
    wait(lambda: len(sleepers(tag)) == 2, 10, "the daemons")
    ssh.kill(h)
    assert not processes_with_cmdline(tag) and not cgroup_dirs(h.mark)


def test_the_fallback_in_sh_finds_and_kills_a_workers_marked_processes_with_cmdline(tag):
    """_members and _mkill of the node's script where no cgroup can be made (its mounts unset)."""
    mark = new_mark()
    env = {**os.environ, ENV_MARK: mark}
    daemon = subprocess.Popen(["setsid", "sh", "-c", f"sleep 4646.{tag} & exec sleep 4747.{tag}"], env=env)
    try:
        wait(lambda: len(sleepers(tag)) == 2, 10, "the marked processes")
        marked = sorted(processes_with_cmdline(tag))
        assert daemon.pid in marked
        script = _LIB + f"_cg2=; _cg1=\n_members {mark}\necho --\n_mkill {mark}\n_members {mark}\n"
        r = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, timeout=30)
        before, _, after = r.stdout.partition("--")
        assert sorted(map(int, before.split())) == marked, r
        assert after.split() == [], r
        daemon.wait(5)
        wait(lambda: not processes_with_cmdline(tag), 5, "their end")
    finally:
        daemon.kill()
        daemon.wait(5)


#: a harvester with ssh workers that dies without a word
SSH_CRASH = r"""
import os, sys
from core.transports import NodeSpec, SshTransport
t = SshTransport(config=sys.argv[1], control_persist=1)
t.start(NodeSpec("node0", "node0"), ["/bin/sh", "-c", sys.argv[2]], {}, sys.argv[3], sys.argv[3] + "/crash.log")
os._exit(9)
"""


def test_the_first_start_on_a_node_ends_what_a_crashed_run_left_there(ssh, sshd_server, tag, tmp_path):
    script = DAEMONS.format(tag=tag, end="exec sleep 600", wipe="")
    crashed = subprocess.Popen([sys.executable, "-c", SSH_CRASH, str(sshd_server.client_config), script,
                                str(tmp_path)], cwd=ROOT)
    assert crashed.wait(60) == 9
    wait(lambda: len(sleepers(tag)) == 2, 10, "the crashed run's daemons on the node")
    left = lambda: [f for m in cgroup_mounts().values() for f in Path(m, PARENT).glob(f"*.{crashed.pid}.*")]
    assert left() or mechanisms() == [ENVIRON]
    h = ssh.start(NodeSpec("node0", "node0"), ["true"], {}, str(tmp_path), str(tmp_path / "next.log"))
    wait(lambda: not processes_with_cmdline(tag), 10, "what the crashed run left to go", lambda: processes_with_cmdline(tag))
    assert not left()
    ssh.stop(h)
