"""A real OpenPBS cluster for tests: pbs_comm, pbs_server with its PostgreSQL datastore, pbs_sched
and one pbs_mom reporting N vnodes, all run inside a network namespace of the test's own.

    with PbsCluster(workdir, vnodes=8, extra={"vn007": {"ngpus": 2}}) as pbs:
        pbs.bin_dir        # qsub, qstat, pbsnodes, ... wrappers: the real command in the namespace
        pbs.conf           # this cluster's pbs.conf (PBS_CONF_FILE)
        pbs.head_address   # this (root) namespace's address as the jobs see it: a hub listens here
        pbs.vnodes         # ["vn001", ...]
        pbs.qmgr("set server ..."); pbs.run(["qstat", "-f", "-F", "json"])
        job = pbs.submit_main("vn003", 30)      # a job of queue `main` pinned to vn003

Why a namespace: PBS refuses a loopback address for its own host, and the daemons must find
their name (`pbshead`) at a non-loopback address. `ip netns exec` binds `/etc/netns/<ns>/hosts`
over /etc/hosts for what it starts, so the host's /etc/hosts is never touched. Its private
mount namespace also gets a tmpfs on /run/postgresql, so the datastore's socket is the
cluster's own. Nothing is written under /etc (besides /etc/netns/<ns>, removed at the end) or
/opt: every daemon and command is pointed at the cluster's pbs.conf by PBS_CONF_FILE; it,
PBS_TMPDIR and the wrappers are in `workdir`. PBS_HOME cannot be there: PBS refuses one below a
folder others may write (pytest's are below /tmp), so it goes to
`/var/cache/harvest-tests/openpbs-<version>-homes/<tag>-home`
and is removed at the end. The build: tests/support/openpbs_build.py.

Queues: `main` (priority 200) preempts the pilot queue (default `scavenger`, priority 10,
kill_delay 2) by `preempt_order` (default "R": requeue). Jobs run as root are accepted (the
harvester in the tests is root). Stopping kills every daemon by PID (their lock files), then the
datastore, then whatever is left in the namespace, and checks that nothing remains. A crashed
run's namespace, links, /etc/netns folder and PBS_HOME are removed by the next start.

In a test module:  `from tests.support.openpbs import pbs_cluster`  (tests/conftest.py does).
"""
from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

import pytest

from tests.support.netns import NETNS_RUN_DIR, OURS, NetnsCluster, alive
from tests.support.openpbs_build import CACHE, VERSION, ensure_openpbs, fail, log

SERVER = "pbshead"
NETNS_ETC = Path("/etc/netns")
#: the commands a harvester (or a test) calls, as wrappers in `bin_dir`
COMMANDS = ("qsub", "qdel", "qstat", "pbsnodes", "qselect", "qmgr", "qrls", "qsig", "qalter", "qrerun",
            "qrun", "qhold", "qmove", "tracejob")
#: daemons by the lock file that holds their PID, stopped in this order
LOCKS = (("pbs_server", "server_priv/server.lock"), ("pbs_sched", "sched_priv/sched.lock"),
         ("pbs_mom", "mom_priv/mom.lock"), ("pbs_comm", "server_priv/comm.lock"))
START_TIMEOUT_S = 120
#: starts tried before a test fails: the datastore's creation now and then finds PostgreSQL not yet
#: listening on a loaded machine ("createdb: error: connection to server on socket ... failed")
START_TRIES = 3
MOM_CONFIG = "$usecp *:/ /\n"
#: the MoM's poll as docs/operators/pbs.md advises (`fast_poll=False`: PBS's default, 10 s and more)
FAST_POLL = "$min_check_poll 1\n$max_check_poll 2\n"

#: run by `ip netns exec`, in the namespace's private mount namespace: the datastore's socket
#: folder becomes the cluster's own tmpfs, PBS_HOME is made (pbs_postinstall with the cluster's
#: pbs.conf), the datastore created, and the daemons started as /etc/init.d/pbs would
START_SCRIPT = r"""set -e
mount -t tmpfs -o mode=2775,size=4m harvest-pbs /run/postgresql
chown postgres:postgres /run/postgresql
. "$PBS_CONF_FILE"
export PBS_EXEC PBS_HOME PBS_SERVER
"$PBS_EXEC/libexec/pbs_postinstall" server "$PBS_VERSION" "$PBS_EXEC" "$PBS_HOME" postgres sameconf
cat "$HARVEST_MOM_CONFIG" >> "$PBS_HOME/mom_priv/config"
sed -i "s/^resources: \"\(.*\)\"/resources: \"\1$HARVEST_SCHED_RESOURCES\"/" "$PBS_HOME/sched_priv/sched_config"
"$PBS_EXEC/sbin/pbs_mom" -s insert harvest_vnodes "$HARVEST_VNODES"
. "$PBS_EXEC/libexec/pbs_db_env"
PBS_DATA_SERVICE_USER=postgres PBS_DATA_SERVICE_PORT=15007 "$PBS_EXEC/libexec/pbs_db_utility" install_db
echo "$PBS_VERSION" > "$PBS_HOME/pbs_version"
"$PBS_EXEC/sbin/pbs_comm"
"$PBS_EXEC/sbin/pbs_mom"
"$PBS_EXEC/sbin/pbs_sched"
"$PBS_EXEC/sbin/pbs_server" -t create
"""


def vnode_name(i: int) -> str:
    return f"vn{i:03d}"


def vnodes_file(n: int, extra: Mapping[str, Mapping[str, object]]) -> str:
    """The MoM's v2 config: the natural vnode takes no jobs, vn001..vnN one cpu each, plus the
    `extra` resources_available per vnode (e.g. {"vn007": {"ngpus": 2}})."""
    lines = ["$configversion 2", f"{SERVER}: resources_available.ncpus = 0", f"{SERVER}: resources_available.mem = 0"]
    for i in range(1, n + 1):
        v = vnode_name(i)
        lines += [f"{v}: resources_available.ncpus = 1", f"{v}: resources_available.mem = 1gb"]
        lines += [f"{v}: resources_available.{k} = {val}" for k, val in extra.get(v, {}).items()]
    return "\n".join(lines) + "\n"


def queue_setup(pilot_queue: str, preempt_order: str) -> list[str]:
    """qmgr lines: root may submit, job history, `main` preempting the pilot queue."""
    lines = [f"create node {SERVER}", "set server acl_roots = root", "set server flatuid = True",
             "set server job_history_enable = True"]
    for queue, priority in (("main", 200), (pilot_queue, 10)):
        lines += [f"create queue {queue}", f"set queue {queue} queue_type = Execution",
                  f"set queue {queue} priority = {priority}", f"set queue {queue} enabled = True",
                  f"set queue {queue} started = True"]
    return lines + [f"set queue {pilot_queue} kill_delay = 2", "set server default_queue = main", "set sched preempt_queue_prio = 150",
                    'set sched preempt_prio = "express_queue, normal_jobs"', f'set sched preempt_order = "{preempt_order}"']


def homes_dir() -> Path:
    """Where the clusters' PBS_HOMEs live: PBS refuses a PBS_HOME below a folder others may write
    (pytest's folders are below /tmp), so they go next to the default build folder (even when
    HARVEST_OPENPBS puts the build below /tmp)."""
    return CACHE.with_name(CACHE.name + "-homes")


def resource_setup(extra: Mapping[str, Mapping[str, object]]) -> list[str]:
    """qmgr lines defining the extra vnode resources (OpenPBS has no `ngpus` of its own): a
    number is a consumable host-level count the scheduler checks, anything else a string."""
    kinds = {k: isinstance(v, int) for res in extra.values() for k, v in res.items()}
    return [f"create resource {k} type=long, flag=nh" if num else f"create resource {k} type=string, flag=h"
            for k, num in sorted(kinds.items())]


def cleanup_leftovers() -> list[Path]:
    """Remove the /etc/netns/<name> folders and PBS_HOMEs of ours whose test process is gone (a
    crashed run); its namespace and links go with netns.py's own clean-up."""
    gone = []
    for d in [*(NETNS_ETC.glob("hv*") if NETNS_ETC.is_dir() else ()), *homes_dir().glob("hv*")]:
        m = OURS.match(d.name)
        if m and int(m.group(1)) != os.getpid() and not os.path.exists(f"/proc/{m.group(1)}"):
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    if gone:
        _remove_if_empty(NETNS_ETC)
    return gone


def _pidfd_signal(fd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        pass


def _remove_if_empty(folder: Path) -> None:
    """/etc/netns goes when its last cluster does (a parallel run's folder keeps it)."""
    try:
        folder.rmdir()
    except OSError:
        pass


def _traversable(path: Path) -> None:
    """Give every folder above `path` search permission for others (never read or write): the
    datastore runs as user `postgres` and pytest's tmp folders are 0700."""
    for folder in reversed(path.parents):
        mode = folder.stat().st_mode
        if not mode & 0o001:
            folder.chmod(mode | 0o001)


class PbsCluster:
    """One OpenPBS server, scheduler, comm and MoM (N vnodes) in a network namespace; a context
    manager: leaving it stops everything and removes what it made."""

    def __init__(self, workdir: Path, vnodes: int = 8, pilot_queue: str = "scavenger",
                 extra: Optional[Mapping[str, Mapping[str, object]]] = None, preempt_order: str = "R",
                 fast_poll: bool = True) -> None:
        self.workdir = workdir
        self.vnodes = [vnode_name(i) for i in range(1, vnodes + 1)]
        self.pilot_queue = pilot_queue
        self.extra = dict(extra or {})
        self.preempt_order = preempt_order
        self.fast_poll = fast_poll
        self.home: Optional[Path] = None
        self.conf = workdir / "pbs.conf"
        self.bin_dir = workdir / "bin"
        self.out_dir = workdir / "out"
        self.exec_dir = Path()
        self.head_address = ""
        self.address = ""
        self.netns = ""
        self.start_seconds = 0.0
        self._net: Optional[NetnsCluster] = None
        self._closed = False

    def __enter__(self) -> "PbsCluster":
        for attempt in range(1, START_TRIES + 1):
            try:
                self.start()
                return self
            except (Exception, pytest.fail.Exception) as e:
                self.close()
                if attempt == START_TRIES:
                    raise
                log(f"the cluster did not start (try {attempt} of {START_TRIES}), again: {str(e)[-300:]}")
                self._reset()
            except BaseException:
                self.close()
                raise
        return self

    def _reset(self) -> None:
        """Back to before `start`, after a start that failed and was closed."""
        self._closed, self._net, self.home, self.netns = False, None, None, ""
        shutil.rmtree(self.workdir / "net", ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- starting --------------------------------------------------------------------------

    def start(self) -> None:
        self.exec_dir = ensure_openpbs()
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._net = NetnsCluster(1, self.workdir / "net", sshd=False)
        self._net.start()  # first kills what runs in a crashed run's namespaces and removes them
        cleanup_leftovers()
        self.netns = self._net.namespaces["node1"]
        self.home = homes_dir() / f"{self._net.tag}-home"
        self.address, self.head_address = self._net.nodes["node1"], self._net.head
        etc = NETNS_ETC / self.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{self.address} {SERVER} {socket.gethostname()}\n")
        self._write_config()
        self._write_wrappers()
        script = self.workdir / "start.sh"
        script.write_text(START_SCRIPT)
        env = {**self.env(), "PBS_VERSION": VERSION, "HARVEST_MOM_CONFIG": str(self.workdir / "mom_config"),
               "HARVEST_VNODES": str(self.workdir / "vnodes.conf"), "HARVEST_SCHED_RESOURCES": self._sched_extra()}
        log = self.workdir / "start.log"
        with open(log, "w") as out:
            r = subprocess.run(self.exec_argv(["/bin/sh", str(script)]), env=env, stdout=out,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=START_TIMEOUT_S)
        if r.returncode != 0:
            fail(f"the OpenPBS daemons did not start ({r.returncode}):\n{log.read_text()[-3000:]}")
        self._wait_server()
        for line in queue_setup(self.pilot_queue, self.preempt_order) + resource_setup(self.extra):
            self.qmgr(line)
        if self.extra:  # the MoM's vnodes and sched_config were read before the resources existed
            pids = self.daemon_pids()
            os.kill(pids["pbs_mom"], signal.SIGHUP)
            os.kill(pids["pbs_sched"], signal.SIGHUP)
        self._wait_extra()
        self.wait_free(self.vnodes)
        self.start_seconds = time.monotonic() - t0

    def _write_config(self) -> None:
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        tmp.chmod(0o1777)
        self.out_dir.mkdir(exist_ok=True)
        self.home.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        _traversable(self.home)
        self.conf.write_text("".join(f"{k}={v}\n" for k, v in {
            "PBS_SERVER": SERVER, "PBS_START_SERVER": 1, "PBS_START_SCHED": 1, "PBS_START_COMM": 1,
            "PBS_START_MOM": 1, "PBS_EXEC": self.exec_dir, "PBS_HOME": self.home, "PBS_CORE_LIMIT": "unlimited",
            "PBS_SCP": "/usr/bin/scp", "PBS_SERVER_HOST_NAME": SERVER, "PBS_LEAF_NAME": SERVER,
            "PBS_COMM_NAME": SERVER, "PBS_MOM_NODE_NAME": SERVER, "PBS_TMPDIR": tmp}.items()))
        (self.workdir / "mom_config").write_text(MOM_CONFIG + (FAST_POLL if self.fast_poll else ""))
        (self.workdir / "vnodes.conf").write_text(vnodes_file(len(self.vnodes), self.extra))

    def _sched_extra(self) -> str:
        names = sorted({k for res in self.extra.values() for k in res})
        return "".join(f", {n}" for n in names)

    def _write_wrappers(self) -> None:
        self.bin_dir.mkdir(exist_ok=True)
        for name in COMMANDS:
            path = self.bin_dir / name
            argv = self.exec_argv(["env", f"PBS_CONF_FILE={self.conf}", str(self.exec_dir / "bin" / name)])
            path.write_text(f'#!/bin/sh\nexec {shlex.join(argv)} "$@"\n')
            path.chmod(0o755)

    def _wait_server(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.run(["qstat", "-B"]).returncode != 0:
            if time.monotonic() > deadline:
                fail(f"pbs_server did not answer within {START_TIMEOUT_S} s: {self.logs()}")
            time.sleep(0.2)

    def _wait_extra(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.extra:
            nodes = self.nodes_json()["nodes"]
            if all(nodes.get(v, {}).get("resources_available", {}).get(k) == val
                   for v, res in self.extra.items() for k, val in res.items()):
                return
            if time.monotonic() > deadline:
                fail(f"the vnodes' extra resources {self.extra} did not appear: {self.logs()}")
            time.sleep(0.2)

    def wait_free(self, vnodes: Sequence[str], timeout: float = START_TIMEOUT_S) -> dict:
        """Wait until each of `vnodes` is `free`; the last `pbsnodes -av -F json` document."""
        deadline = time.monotonic() + timeout
        while True:
            doc = self.nodes_json()
            states = {v: doc["nodes"].get(v, {}).get("state") for v in vnodes}
            if all(s == "free" for s in states.values()):
                return doc
            if time.monotonic() > deadline:
                fail(f"vnodes not free after {timeout} s: {states}; {self.logs()}")
            time.sleep(0.2)

    # --- using it ---------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PBS_CONF_FILE": str(self.conf), "LANG": "C"}

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` inside the cluster's namespace (with its /etc/hosts)."""
        return ["/usr/sbin/ip", "netns", "exec", self.netns, *argv]

    def command(self, name: str) -> str:
        """A PBS program's path in the build (bin/ or sbin/), or `name` itself."""
        for sub in ("bin", "sbin"):
            if (self.exec_dir / sub / name).is_file():
                return str(self.exec_dir / sub / name)
        return name

    def run(self, argv: Sequence[str], timeout: float = 60, input: Optional[str] = None,
            env: Optional[Mapping[str, str]] = None, check: bool = False) -> subprocess.CompletedProcess:
        """Run `argv` (a PBS command by its name) in the namespace with this cluster's pbs.conf."""
        full = self.exec_argv([self.command(argv[0]), *argv[1:]])
        r = subprocess.run(full, env={**self.env(), **(env or {})}, capture_output=True, text=True,
                           timeout=timeout, input=input)
        if check and r.returncode != 0:
            fail(f"`{' '.join(argv)}` exited with {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
        return r

    def qmgr(self, command: str) -> str:
        return self.run(["qmgr", "-c", command], check=True).stdout

    def nodes_json(self) -> dict:
        return json.loads(self.run(["pbsnodes", "-av", "-F", "json"], check=True).stdout)

    def jobs_json(self, history: bool = False) -> dict:
        return json.loads(self.run(["qstat", "-f", "-F", "json", *(["-x"] if history else [])], check=True).stdout)

    def submit(self, queue: str, vnode: str, argv: Sequence[str], name: str = "test", extra: Sequence[str] = ()) -> str:
        """qsub a job of `queue` pinned to `vnode` running `argv`; its id."""
        out = self.out_dir / f"{name}-{vnode}-{time.monotonic_ns()}.out"
        r = self.run(["qsub", "-q", queue, "-N", name, "-l", f"select=1:ncpus=1:vnode={vnode}", "-j", "oe",
                      "-o", str(out), "-m", "n", *extra, "--", *argv], check=True)
        return r.stdout.strip()

    def submit_main(self, vnode: str, seconds: float, name: str = "main") -> str:
        return self.submit("main", vnode, ["/bin/sleep", str(seconds)], name)

    def job(self, job_id: str) -> dict:
        """The job's `qstat -f -F json -x` entry."""
        return json.loads(self.run(["qstat", "-f", "-F", "json", "-x", job_id], check=True).stdout)["Jobs"][job_id]

    def wait_job(self, job_id: str, states: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info["job_state"] in states:
                return info
            if time.monotonic() > deadline:
                fail(f"job {job_id} still {info['job_state']} after {timeout} s (want {states}): {info.get('comment')}")
            time.sleep(0.1)

    def logs(self) -> str:
        """The tail of each daemon's log of today, for failure messages."""
        parts = []
        for sub in () if self.home is None else ("server_logs", "sched_logs", "mom_logs", "comm_logs"):
            for f in sorted((self.home / sub).glob("*"))[-1:]:
                parts.append(f"--- {f}\n{f.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts) or f"(no logs in {self.home})"

    # --- stopping ---------------------------------------------------------------------------

    def daemon_pids(self) -> dict[str, int]:
        """PIDs of the daemons alive in the namespace, from their lock files, and the datastore's."""
        found: dict[str, int] = {}
        if self.home is None:
            return found
        for name, lock in LOCKS + (("postgres", "datastore/postmaster.pid"),):
            try:
                pid = int((self.home / lock).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            if alive(pid) and self._in_netns(pid):
                found[name] = pid
        return found

    def close(self) -> list[int]:
        """Stop the daemons by PID (SIGTERM, the datastore SIGINT; SIGKILL after 10 s), whatever
        else runs in the namespace, and remove the namespace, its /etc/netns folder and PBS_HOME.
        Returns the PIDs that had to be killed at the end."""
        if self._closed:
            return []
        self._closed = True
        self._stop_daemons()
        killed = self._net.close() if self._net else []
        if self.netns:
            shutil.rmtree(NETNS_ETC / self.netns, ignore_errors=True)
            _remove_if_empty(NETNS_ETC)
        if self.home:
            shutil.rmtree(self.home, ignore_errors=True)
        left = self.leftovers()
        if left:
            raise RuntimeError(f"the OpenPBS test cluster left: {left}")
        return killed

    def _stop_daemons(self, grace: float = 10) -> None:
        """Signal through pidfds, so that a PID reused after a daemon exits is never hit."""
        fds = {}
        for name, pid in self.daemon_pids().items():
            try:
                fds[name] = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            if not self._in_netns(pid):  # exited and reused between the check and the open
                os.close(fds.pop(name))
        try:
            for name, fd in fds.items():
                _pidfd_signal(fd, signal.SIGINT if name == "postgres" else signal.SIGTERM)
            deadline = time.monotonic() + grace
            running = list(fds.values())
            while running and time.monotonic() < deadline:
                done, _, _ = select.select(running, [], [], max(0.0, deadline - time.monotonic()))
                running = [fd for fd in running if fd not in done]
            for fd in running:
                _pidfd_signal(fd, signal.SIGKILL)
        finally:
            for fd in fds.values():
                os.close(fd)

    def _in_netns(self, pid: int) -> bool:
        try:
            return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"{NETNS_RUN_DIR}/{self.netns}").st_ino
        except OSError:
            return False

    def leftovers(self) -> list[str]:
        """What of this cluster still exists: daemons, its namespace's processes and links, /etc/netns."""
        left = [f"{name} pid {pid}" for name, pid in self.daemon_pids().items()]
        if self._net:
            left += self._net.leftovers()
        left += [str(p) for p in (NETNS_ETC / self.netns, self.home) if self.netns and p and p.exists()]
        return left


@pytest.fixture(scope="module")
def pbs_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PbsCluster]:
    """8 vnodes (vn007 and vn008 with ngpus = 2), queues main and scavenger, torn down after the module."""
    with PbsCluster(tmp_path_factory.mktemp("pbs"), extra={"vn007": {"ngpus": 2}, "vn008": {"ngpus": 2}}) as pbs:
        yield pbs


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["build"]:
        try:
            print(ensure_openpbs())
        except pytest.fail.Exception as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    print("usage: python -m tests.support.openpbs build", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
