"""PID 1 of the test Slurm's own PID namespace (`tests/support/slurm.py` starts it under
`unshare --pid --fork --mount-proc --kill-child`): it runs munged, slurmctld and one slurmd per
node in the foreground, reaps every process that ends in the namespace (daemons leave zombies
where PID 1 does not), and obeys one-line commands on stdin:

    stop-ctld    stop slurmctld (as if it crashed or was taken down for maintenance)
    start-ctld   start it again on its saved state, wait until it answers
    kill-slurmd NODE   SIGKILL that node's slurmd, as a dead host would leave it (its job
                 steps, slurmstepd and the jobs' processes, run on: tests kill those themselves)
    start-slurmd NODE  start that node's slurmd again (no wait: Slurm's view is the test's to watch)
    quit         cancel every job, wait until no slurmstepd is left, stop the daemons, report
                 any process still alive in the namespace, exit (the kernel then kills the rest)

Each answer is one line on stdout: `ok ...`, `error ...` or `bye <json leftovers>`. EOF on stdin
(the test process died) means quit.

    python -m tests.support.slurm_init DIR node1,node2,... [--chroot ROOT [--bind PATH]...]

With --chroot, every daemon and every Slurm command of the init runs in ROOT (another Slurm
version, tests/support/slurm_chroot.py), into which the init first binds the host's /proc, /dev,
/etc/hosts, the usual host folders and each --bind PATH at the same paths. unshare made the init
a mount namespace of its own that propagates nothing, so the binds are seen by the daemons, the
jobs and the clients that enter it (`nsenter --mount`), never by the host, and they go with it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from tests.support.ports import free_ports
from tests.support.slurm_accounting import DBD_CONF, start_slurmdbd
from tests.support.slurm_chroot import enter, host_paths

STOP_WAIT_S = 10.0
READY_WAIT_S = 30.0


class Init:
    def __init__(self, workdir: Path, nodes: list[str], chroot: Optional[Path] = None) -> None:
        self.dir = workdir
        self.nodes = nodes
        #: what every daemon and Slurm command is run under: nothing (the host's Slurm) or the chroot
        self.prefix = ["chroot", str(chroot)] if chroot else []
        self.conf = workdir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.pids: dict[str, int] = {}           # daemon name -> pid
        self.exited: dict[int, int] = {}         # pid -> wait status, for our own daemons
        # Held so that no Popen is collected while its daemon runs: subprocess would then reap
        # the daemon behind our back (its _cleanup on the next Popen), and we would signal a
        # pid that no longer exists.
        self.procs: dict[str, subprocess.Popen] = {}

    # ---- processes --------------------------------------------------------------------------
    def spawn(self, name: str, argv: list[str]) -> int:
        log = open(self.dir / "log" / f"{name}.out", "ab")
        proc = subprocess.Popen([*self.prefix, *argv], env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        self.pids[name] = proc.pid
        self.procs[name] = proc
        return proc.pid

    def reap(self) -> None:
        """Collect every child that ended: ours and the orphans the namespace hands to PID 1."""
        ours = set(self.pids.values())
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in ours:
                self.exited[pid] = status
                for proc in self.procs.values():
                    if proc.pid == pid:
                        proc.returncode = os.waitstatus_to_exitcode(status)

    def alive(self, name: str) -> bool:
        self.reap()
        pid = self.pids.get(name)
        return pid is not None and pid not in self.exited

    def signal(self, name: str, sig: int) -> None:
        """Signal a daemon that `alive` saw; one that ended since is left alone."""
        try:
            os.kill(self.pids[name], sig)
        except ProcessLookupError:
            pass

    def stop(self, names: list[str]) -> None:
        """SIGTERM these daemons together, SIGKILL what is left after STOP_WAIT_S."""
        live = [n for n in names if self.alive(n)]
        for n in live:
            self.signal(n, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while any(self.alive(n) for n in live) and time.monotonic() < deadline:
            time.sleep(0.02)
        for n in live:
            if self.alive(n):
                self.signal(n, signal.SIGKILL)
        deadline = time.monotonic() + STOP_WAIT_S
        while any(self.alive(n) for n in live) and time.monotonic() < deadline:
            time.sleep(0.02)

    def slurm(self, *argv: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
        r = subprocess.run([*self.prefix, *argv], env=self.env, capture_output=True, text=True, timeout=timeout)
        self.reap()
        return r

    def wait(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout:g} s")
            time.sleep(0.05)

    # ---- daemons ----------------------------------------------------------------------------
    def start_munge(self) -> None:
        d = self.dir
        # --force: a test's folder is private (0700), which munged refuses for its socket otherwise
        self.spawn("munged", ["munged", "-F", "--force", f"--key-file={d / 'munge.key'}",
                              f"--socket={d / 'munge' / 'munge.socket.2'}",
                              f"--pid-file={d / 'run' / 'munged.pid'}",
                              f"--log-file={d / 'log' / 'munged.log'}",
                              f"--seed-file={d / 'state' / 'munge.seed'}"])
        self.wait(lambda: (d / "munge" / "munge.socket.2").exists() or not self.alive("munged"),
                  READY_WAIT_S, "munged to create its socket")
        if not self.alive("munged"):
            raise RuntimeError("munged exited; see log/munged.out")

    def start_ctld(self) -> None:
        self.spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])

        def up() -> bool:
            if not self.alive("slurmctld"):
                raise RuntimeError("slurmctld exited; see log/slurmctld.log")
            return "is UP" in self.slurm("scontrol", "ping").stdout
        self.wait(up, READY_WAIT_S, "slurmctld to answer scontrol ping")

    def start_nodes(self) -> None:
        for n in self.nodes:
            self.spawn(f"slurmd-{n}", ["slurmd", "-D", "-f", str(self.conf), "-N", n])

        def all_idle() -> bool:
            out = self.slurm("sinfo", "-h", "-N", "-t", "idle", "-o", "%N").stdout.split()
            return set(self.nodes) <= set(out)
        self.wait(all_idle, READY_WAIT_S, "every slurmd to register idle")

    def start_slurm(self) -> None:
        """slurmctld, then the slurmds; once more from a clean stop if the slurmds do not register,
        with fresh ports for any slurmd that exited. Seen in full suites: once no slurmd came
        up in 30 s, and once in CI one slurmd exited because another process had taken its port
        between choosing it and binding it."""
        self.start_ctld()
        try:
            self.start_nodes()
            return
        except TimeoutError as e:
            nodes = self.slurm("sinfo", "-h", "-N", "-o", "%N %T").stdout.strip().replace("\n", ", ")
            print(f"# {e} (nodes: {nodes or 'none'}); restarting slurmctld and the slurmds",
                  file=sys.stderr, flush=True)
        dead = [n for n in self.nodes if not self.alive(f"slurmd-{n}")]
        for n in dead:
            print(f"# slurmd-{n} had exited: {self.last_error(f'slurmd-{n}')}", file=sys.stderr, flush=True)
        self.stop([n for n in self.pids if n.startswith("slurmd-")])
        self.stop(["slurmctld"])
        if dead:
            self.move_ports(dead)
        self.start_ctld()
        self.start_nodes()

    def last_error(self, name: str) -> str:
        lines = (self.dir / "log" / f"{name}.out").read_text(errors="replace").splitlines()
        errors = [ln for ln in lines if "error" in ln.lower()]
        return (errors or lines or ["(no output)"])[-1].strip()

    def move_ports(self, nodes: list[str]) -> None:
        """Give these nodes fresh ports in slurm.conf (a slurmd that exited may have lost its
        port to another process); the clients and daemons started next read the new file."""
        text = self.conf.read_text()
        for n, port in zip(nodes, free_ports(len(nodes))):
            text, count = re.subn(rf"^(NodeName={re.escape(n)} .*?\bPort=)\d+", rf"\g<1>{port}", text,
                                  flags=re.MULTILINE)
            if count != 1:
                raise RuntimeError(f"no Port= for {n} in {self.conf}")
        self.conf.write_text(text)

    # ---- shutdown ---------------------------------------------------------------------------
    def stepds(self) -> list[int]:
        return [pid for pid, comm in processes() if comm.startswith("slurmstepd")]

    def quit(self) -> list[str]:
        if self.alive("slurmctld"):
            try:
                jobs = self.slurm("squeue", "-h", "-o", "%i").stdout.split()
                if jobs:
                    self.slurm("scancel", "--full", "-s", "KILL", *jobs)
                    self.slurm("scancel", *jobs)
                    self.wait(lambda: not self.slurm("squeue", "-h", "-t", "R,CG,PD", "-o", "%i").stdout.split(),
                              STOP_WAIT_S * 2, "every job to end")
            except (TimeoutError, subprocess.TimeoutExpired) as e:
                print(f"# {e}", file=sys.stderr, flush=True)
        try:
            self.wait(lambda: not self.stepds(), STOP_WAIT_S * 2, "every slurmstepd to exit")
        except TimeoutError as e:
            print(f"# {e}", file=sys.stderr, flush=True)
        self.stop([n for n in self.pids if n.startswith("slurmd-")])
        self.stop(["slurmctld"])
        self.stop(["slurmdbd"])
        self.stop(["munged"])
        self.reap()
        return [f"{pid} {comm}" for pid, comm in processes() if pid != os.getpid()]


def processes() -> list[tuple[int, str]]:
    """(pid, comm) of every live process this /proc shows (the namespace's own)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        if raw[raw.rindex(")") + 2:].split()[0] != "Z":
            out.append((int(entry.name), comm))
    return out


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def serve(init: Init) -> None:
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.1)
        init.reap()
        if not ready:
            continue
        line = sys.stdin.readline()
        cmd = line.strip()
        if not line or cmd == "quit":
            say("bye " + json.dumps(init.quit()))
            return
        try:
            if cmd == "stop-ctld":
                init.stop(["slurmctld"])
                say("ok stopped")
            elif cmd == "start-ctld":
                init.start_ctld()
                say("ok started")
            elif cmd.startswith(("kill-slurmd ", "start-slurmd ")) and cmd.split()[1] in init.nodes:
                name = f"slurmd-{cmd.split()[1]}"
                if cmd.startswith("kill-"):
                    init.signal(name, signal.SIGKILL)
                    init.wait(lambda: not init.alive(name), STOP_WAIT_S, f"{name} to exit")
                    say("ok killed")
                elif init.alive(name):
                    say(f"error {name} is running")
                else:
                    say(f"ok started {init.spawn(name, ['slurmd', '-D', '-f', str(init.conf), '-N', cmd.split()[1]])}")
            else:
                say(f"error unknown command {cmd!r}")
        except (RuntimeError, TimeoutError, OSError) as e:
            say(f"error {e}")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.support.slurm_init")
    ap.add_argument("dir", type=Path)
    ap.add_argument("nodes")
    ap.add_argument("--chroot", type=Path)
    ap.add_argument("--bind", type=Path, action="append", default=[])
    args = ap.parse_args(argv)
    init = Init(args.dir, args.nodes.split(","), args.chroot)
    try:
        if args.chroot:
            enter(args.chroot, host_paths([args.dir, *args.bind]))
        init.start_munge()
        if (init.dir / DBD_CONF).exists():       # QOS preemption: accounting before slurmctld
            start_slurmdbd(init)
        init.start_slurm()
    except (RuntimeError, TimeoutError, OSError) as e:
        say(f"error {e}")
        init.quit()
        return 1
    say("ok " + json.dumps({name: pid for name, pid in init.pids.items()}))
    serve(init)
    return 0


if __name__ == "__main__":
    sys.exit(main())
