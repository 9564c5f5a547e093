"""What ends every process a worker started, daemonised ones included. Signalling a worker's
process group misses a child that called setsid(), and a double fork takes it out of the
worker's process tree as well, so a stop needs something the child cannot leave by itself:

  - a **cgroup** per worker, `<mount>/harvest/<mark>`, where this host lets the harvester make
    one (cgroup v2, or the v1 freezer hierarchy): the worker joins it before it execs its
    command, so everything it ever starts is inside; a stop signals every member and then kills
    the cgroup (v2 `cgroup.kill`; v1: freeze, SIGKILL each member, thaw) and removes it;
  - the **fallback** where no cgroup can be made: every worker gets `HARVEST_WORKER=<mark>` in
    its environment, which its descendants inherit, and a stop finds them by it in
    /proc/*/environ. A process that execs with a cleared environment (`env -i`) escapes it, and
    only processes this account may read and signal are found.

A *mark* is `<instance>/<n>`: the harvester process that started the worker, then a counter.
`<instance>` is `<host>.<pid namespace>.<pid>.<start time>`, so that at start a harvester
finds the cgroups (and, in the fallback, the marked processes) that a crashed earlier run on
this host left, kills them and removes them, and never touches those of a harvester still
running. Slurm pilots use the fallback inside their job and leave the rest to Slurm (see
core/pilots/pilot_job.py): a cgroup of ours would take their workers out of Slurm's.
"""
from __future__ import annotations

import atexit
import errno
import itertools
import logging
import os
import re
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional

log = logging.getLogger(__name__)

#: the variable that marks a worker and everything it starts
ENV_MARK = "HARVEST_WORKER"
#: the folder of a cgroup hierarchy under which the harvester makes its cgroups
PARENT = "harvest"
CGROUP2, CGROUP1, ENVIRON, NONE = "cgroup2", "cgroup1", "environ", "none"
#: `Cleanup(mode)`: "auto" picks the first of cgroup2, cgroup1, environ that works here
MODES = ("auto", CGROUP2, CGROUP1, ENVIRON, NONE)
MARK = re.compile(r"^[A-Za-z0-9-]{1,32}\.[0-9]+\.[0-9]+\.[0-9]+/[0-9]+$")
_INSTANCE = re.compile(r"^([A-Za-z0-9-]{1,32}\.[0-9]+)\.([0-9]+)\.([0-9]+)$")
_KILL_ROUNDS = 20          # environ: scan-and-kill rounds (a process may fork meanwhile)
_FREEZE_WAIT_S = 1.0


def proc_stat(pid: int) -> Optional[list[str]]:
    """Fields 3.. of /proc/PID/stat (state, ppid, pgrp, ...), or None if there is no such PID."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2:].split()  # comm may hold spaces and ')'


def start_token(pid: int) -> str:
    """The start time of a live (non-zombie) PID in clock ticks since boot; '' otherwise."""
    f = proc_stat(pid)
    return f[19] if f and f[0] != "Z" else ""


def _live(pids: Iterable[int]) -> list[int]:
    """The PIDs that are neither gone nor zombies."""
    out = []
    for p in pids:
        f = proc_stat(p)
        if f is not None and f[0] != "Z":
            out.append(p)
    return out


def signal_each(pids: Iterable[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


# ---- marks -------------------------------------------------------------------------------------
_counter = itertools.count(1)
_instances: dict[int, str] = {}


def host_prefix() -> str:
    """`<host>.<pid namespace>`: the processes whose liveness this process can judge."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"
    try:
        ns = "".join(c for c in os.readlink("/proc/self/ns/pid") if c.isdigit()) or "0"
    except OSError:
        ns = "0"
    return f"{host}.{ns}"


def instance() -> str:
    """This process's name in marks (computed again in a forked child: its PID differs)."""
    pid = os.getpid()
    name = _instances.get(pid)
    if name is None:
        name = _instances[pid] = f"{host_prefix()}.{pid}.{start_token(pid) or 0}"
    return name


def new_mark() -> str:
    """A mark no other worker of any harvester on this host has."""
    return f"{instance()}/{next(_counter)}"


def check_mark(mark: str) -> str:
    """`mark` if it is one (it names a path: nothing else may pass), else ValueError."""
    if not MARK.match(mark):
        raise ValueError(f"{mark!r} is not a worker mark (<host>.<ns>.<pid>.<start>/<n>)")
    return mark


def instance_dead(name: str, prefix: Optional[str] = None) -> bool:
    """Whether instance `name` is of this host and PID namespace and its process is gone; an
    instance of any other host or namespace is never judged dead here."""
    m = _INSTANCE.match(name)
    if m is None or m.group(1) != (prefix or host_prefix()):
        return False
    return start_token(int(m.group(2))) != m.group(3)


# ---- the host's cgroup hierarchies -------------------------------------------------------------
def _unescape(path: str) -> str:
    """A path of /proc/mounts, whose spaces and such are octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def cgroup_mounts(mounts: str = "/proc/mounts") -> dict[str, str]:
    """{CGROUP2: mountpoint, CGROUP1: the freezer hierarchy's mountpoint}, as far as mounted."""
    out: dict[str, str] = {}
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        mnt, kind, opts = _unescape(parts[1]), parts[2], parts[3].split(",")
        if kind == "cgroup2":
            out.setdefault(CGROUP2, mnt)
        elif kind == "cgroup" and "freezer" in opts:
            out.setdefault(CGROUP1, mnt)
    return out


@dataclass(frozen=True)
class Cgroup:
    """One worker's cgroup (or a leftover's), v2 or v1 freezer."""
    path: Path
    version: str

    def exists(self) -> bool:
        return (self.path / "cgroup.procs").exists()

    def pids(self) -> list[int]:
        """Its live members ([] once it is gone)."""
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return []
        return _live(int(p) for p in text.split())

    def kill(self) -> None:
        """SIGKILL every member, also one that forks meanwhile (returns without waiting)."""
        if self.version == CGROUP2 and _write(self.path / "cgroup.kill", "1"):
            return
        freeze = (self.path / "cgroup.freeze", "1", "0") if self.version == CGROUP2 else \
            (self.path / "freezer.state", "FROZEN", "THAWED")
        frozen = _write(freeze[0], freeze[1])
        if frozen and self.version == CGROUP1:
            deadline = time.monotonic() + _FREEZE_WAIT_S
            while _read(freeze[0]) != "FROZEN" and time.monotonic() < deadline:
                time.sleep(0.01)
        for _ in range(_KILL_ROUNDS):
            pids = self.pids()
            if not pids:
                break
            signal_each(pids, signal.SIGKILL)
            if frozen:
                break                       # no member could fork: all are signalled
        if frozen:
            _write(freeze[0], freeze[2])    # the SIGKILLs are delivered once thawed

    def remove(self) -> bool:
        """rmdir it (a cgroup with live members cannot be removed); True once it is gone."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                log.warning("cannot remove the cgroup %s: %s", self.path, e.strerror)
            return False
        return True


def _write(path: Path, text: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def marked(marks: Iterable[str]) -> dict[str, list[int]]:
    """For each mark, the live processes whose environment holds HARVEST_WORKER=<mark> (those
    this process may read: all as root, its own account's otherwise), this process excepted;
    one pass over /proc for all of them."""
    needles = {f"{ENV_MARK}={m}".encode(): m for m in marks}
    out: dict[str, list[int]] = {m: [] for m in needles.values()}
    if not needles:
        return out
    me = os.getpid()
    for pid, env in _environs(f"{ENV_MARK}=".encode()):
        if pid == me:
            continue
        for item in env.split(b"\0"):
            if item in needles:
                out[needles[item]].append(pid)
                break
    return {m: _live(pids) for m, pids in out.items()}


def _environs(head: bytes) -> Iterator[tuple[int, bytes]]:
    """(pid, environment) of each process whose environment holds `head`: one pass over /proc."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if head in env:
            yield int(entry.name), env


def marked_by_dead(prefix: str) -> dict[int, str]:
    """The live processes marked by a harvester instance of `prefix` (this host and PID
    namespace) that has ended: {pid: mark}."""
    head = f"{ENV_MARK}={prefix}.".encode()
    out: dict[int, str] = {}
    dead: dict[str, bool] = {}
    for pid, env in _environs(head):
        for item in env.split(b"\0"):
            if item.startswith(head):
                mark = item.decode("ascii", "replace").partition("=")[2]
                if MARK.match(mark):
                    inst = mark.partition("/")[0]
                    if inst not in dead:
                        dead[inst] = instance_dead(inst, prefix)
                    if dead[inst]:
                        out[pid] = mark
                break
    live = set(_live(out))
    return {p: m for p, m in out.items() if p in live}


@dataclass
class Cleanup:
    """How this host ends a worker's processes: `mechanism` is the first of CGROUP2, CGROUP1,
    ENVIRON that works here ("auto"), or the one asked for (OSError where a cgroup one cannot
    be used); NONE leaves everything to the process group. Sweeps leftovers when made."""
    mode: str = "auto"
    mounts: str = "/proc/mounts"
    mechanism: str = field(init=False, default=NONE)
    root: Optional[Path] = field(init=False, default=None)    # <mount>/harvest of a cgroup mechanism
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"cleanup: one of {', '.join(MODES)}, not {self.mode!r}")
        mounts = cgroup_mounts(self.mounts)
        if self.mode in (CGROUP2, CGROUP1):
            if not self._try(self.mode, mounts.get(self.mode)):
                raise OSError(f"no writable {self.mode} hierarchy here ({mounts.get(self.mode) or 'not mounted'})")
        elif self.mode == "auto":
            if not (self._try(CGROUP2, mounts.get(CGROUP2)) or self._try(CGROUP1, mounts.get(CGROUP1))):
                self.mechanism = ENVIRON
        else:
            self.mechanism = self.mode
        if self.mechanism != NONE:
            self.sweep(mounts)

    def _try(self, version: str, mount: Optional[str]) -> bool:
        """Make this instance's folder in the hierarchy at `mount`: whether cgroups work there."""
        if not mount:
            return False
        root = Path(mount) / PARENT
        mine = root / instance()
        for _ in range(3):      # another process may remove an empty `root` meanwhile
            try:
                mine.mkdir(parents=True, exist_ok=True)
                break
            except FileNotFoundError:
                continue
            except OSError:
                return False
        else:
            return False
        needed = ["cgroup.procs"] + (["freezer.state"] if version == CGROUP1 else [])
        if not all(os.access(mine / f, os.W_OK) for f in needed):
            Cgroup(mine, version).remove()
            return False
        self.mechanism, self.root = version, root
        _remove_at_exit(mine, version)
        return True

    def describe(self) -> str:
        """What the logs and a node's status say."""
        if self.root is not None:
            return f"{self.mechanism} ({self.root})"
        return {ENVIRON: "environ (no writable cgroup: processes found by HARVEST_WORKER in /proc/*/environ)",
                NONE: "none (the worker's process group only)"}[self.mechanism]

    # ---- one worker -----------------------------------------------------------------------------
    def cgroup(self, mark: str) -> Optional[Cgroup]:
        """The worker's cgroup (which may be gone); None without a cgroup mechanism."""
        if self.root is None or not mark:
            return None
        return Cgroup(self.root / check_mark(mark), self.mechanism)

    def prepare(self, mark: str) -> Optional[int]:
        """Make the worker's cgroup; a descriptor open on its cgroup.procs, to which the child
        writes "0" (itself) before it execs, or None where there is no cgroup to join. The
        caller closes it once the child runs."""
        cg = self.cgroup(mark)
        if cg is None:
            return None
        for _ in range(3):          # another transport of this process may remove the parent meanwhile
            try:
                cg.path.parent.mkdir(parents=True, exist_ok=True)
                cg.path.mkdir(exist_ok=True)
                return os.open(cg.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
        raise OSError(f"cannot make the cgroup {cg.path}")

    def members(self, marks: Iterable[str]) -> dict[str, list[int]]:
        """For each worker (its mark), its live processes: its cgroup's members, or in the
        fallback, those it marked (one pass over /proc for all of them)."""
        marks = [m for m in marks if m]
        if self.mechanism == NONE:
            return {m: [] for m in marks}
        if self.root is None:
            return marked(marks)
        return {m: cg.pids() for m in marks if (cg := self.cgroup(m)) is not None}

    def kill(self, marks: Iterable[str]) -> None:
        """SIGKILL every process of these workers (returns without waiting)."""
        marks = [m for m in marks if m]
        if not marks or self.mechanism == NONE:
            return
        if self.root is not None:
            for m in marks:
                self.cgroup(m).kill()
            return
        for _ in range(_KILL_ROUNDS):       # a marked process may fork meanwhile
            pids = [p for ps in marked(marks).values() for p in ps]
            if not pids:
                return
            signal_each(pids, signal.SIGKILL)

    def release(self, mark: str) -> None:
        """Remove the worker's cgroup once it is empty (nothing to do in the fallback)."""
        cg = self.cgroup(mark)
        if cg is not None:
            cg.remove()

    def degrade(self, why: str) -> None:
        """A worker could not join its cgroup: the fallback from now on."""
        with self._lock:
            if self.mechanism in (CGROUP2, CGROUP1):
                log.warning("workers cannot join a cgroup under %s (%s): finding their processes by %s instead",
                            self.root, why, ENV_MARK)
                self.mechanism, self.root = ENVIRON, None

    # ---- leftovers ------------------------------------------------------------------------------
    def sweep(self, mounts: Optional[dict[str, str]] = None) -> int:
        """Kill and remove what ended harvester runs of this host and PID namespace left (their
        cgroups, their marked processes); returns how many processes were killed."""
        prefix = host_prefix()
        killed = 0
        for version, mount in (mounts if mounts is not None else cgroup_mounts(self.mounts)).items():
            root = Path(mount) / PARENT
            try:
                names = [e.name for e in os.scandir(root) if e.is_dir()]
            except OSError:
                continue
            for name in names:
                if instance_dead(name, prefix):
                    killed += remove_instance(root / name, version)
        if self.mechanism == ENVIRON:
            strays = marked_by_dead(prefix)
            if strays:
                signal_each(strays, signal.SIGKILL)
                log.warning("killed %d process(es) that ended harvester runs left (marks %s)", len(strays),
                            ", ".join(sorted(set(strays.values()))[:5]))
                killed += len(strays)
        return killed

    def close(self) -> None:
        """Remove this instance's empty cgroups (a worker still running keeps its own), and the
        harvester's folder if no other run uses it."""
        if self.root is not None:
            remove_empty(self.root / instance(), self.mechanism)
            Cgroup(self.root, self.mechanism).remove()


def remove_instance(folder: Path, version: str, wait_s: float = 5.0) -> int:
    """Kill every member of every cgroup in `folder` (a dead instance's), then remove them all;
    how many processes were killed."""
    groups = [Cgroup(Path(e.path), version) for e in os.scandir(folder) if e.is_dir()] if folder.is_dir() else []
    killed = 0
    for cg in groups:
        n = len(cg.pids())
        if n:
            cg.kill()
            killed += n
    deadline = time.monotonic() + wait_s
    while any(cg.pids() for cg in groups) and time.monotonic() < deadline:
        time.sleep(0.02)
    for cg in groups:
        cg.remove()
    Cgroup(folder, version).remove()
    Cgroup(folder.parent, version).remove()
    if killed:
        log.warning("killed %d process(es) left in %s by a harvester run that ended", killed, folder)
    return killed


def remove_empty(folder: Path, version: str) -> None:
    """rmdir the empty cgroups in `folder`, then `folder` itself if that leaves it empty."""
    try:
        subs = [Path(e.path) for e in os.scandir(folder) if e.is_dir()]
    except OSError:
        return
    for sub in subs:
        Cgroup(sub, version).remove()
    Cgroup(folder, version).remove()


_at_exit: set[tuple[Path, str]] = set()


def _remove_at_exit(folder: Path, version: str) -> None:
    """This process's own folder goes when it exits, if its workers' cgroups are gone by then."""
    if not _at_exit:
        atexit.register(_exit_folders)
    _at_exit.add((folder, version))


def _exit_folders() -> None:
    for folder, version in list(_at_exit):
        if folder.name == instance():         # not a forked child's: its parent's
            remove_empty(folder, version)
            Cgroup(folder.parent, version).remove()
