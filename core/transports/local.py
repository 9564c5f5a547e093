"""Every "node" is a process group on this machine (one-machine mode, tests, demos). No shell is
involved anywhere: argv goes to exec() as it is.

Liveness ignores zombies: an orphaned child of a worker is re-parented to PID 1, and where PID 1
does not reap (some containers and micro-VMs) its zombie would otherwise look alive forever.

`die_with_parent` is for a parent that must take its workers with it (a Slurm pilot: the batch
scheduler tracks a job's processes by parentage, so a worker orphaned by a dead pilot would
escape it): the kernel SIGKILLs each worker when the thread that started it ends.

Every process a worker starts ends with it, daemonised ones included: each worker joins a cgroup
of its own before it execs (or, where this host has no writable cgroup, is marked in its
environment), and a stop signals and kills all of it (core/transports/cleanup.py).
"""
from __future__ import annotations

import ctypes
import logging
import os
import pwd
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

from ..logtail import tail_path
from .base import (STOP_GONE, STOP_KILL, STOP_TERM, Handle, NodeSpec, StartError, Transport, TransportError,
                   check_start_args, inherited_env)
from . import census
from .cleanup import ENV_MARK, Cleanup, check_mark, new_mark, proc_stat, signal_each, start_token

log = logging.getLogger(__name__)
_POLL_S = 0.02
_KILL_WAIT_S = 5.0
_EXITS_KEPT = 4096         # exit statuses remembered (of workers gone, for their failure)
_PR_SET_PDEATHSIG = 1


def _libc_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl = _libc_prctl()   # resolved here: the child between fork and exec must not load anything


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent's starting thread ends."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def live_groups() -> Optional[set[int]]:
    """The process groups that have a non-zombie member; None where there is no /proc."""
    if not os.path.isdir("/proc/self"):
        return None
    out = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            f = proc_stat(int(entry.name))
            if f and f[0] != "Z":
                out.add(int(f[2]))
    return out


def group_alive(pgid: int, groups: Optional[set[int]] = None) -> bool:
    """Whether any non-zombie process is in process group `pgid` (`groups`: from live_groups)."""
    groups = live_groups() if groups is None else groups
    if groups is None:
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    return pgid in groups


def _joiner(fd: Optional[int], then):
    """The child's last act before exec: join the cgroup whose cgroup.procs `fd` is open on
    (writing "0" moves the writer), so that nothing it starts can be outside; then `then`."""
    if fd is None:
        return then

    def join() -> None:
        os.write(fd, b"0")
        if then is not None:
            then()
    return join


def private_dirs(path: Path, mode: int = 0o700) -> None:
    """`path` and the parents it lacks, each made with `mode` (the harvester's folders are its
    own: other accounts list no job there); an existing `path` gets no less than `mode`."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=mode)
        except FileExistsError:
            pass
        os.chmod(d, mode)
    st = path.stat()
    if not missing and st.st_uid == os.geteuid() and st.st_mode & mode != mode:
        os.chmod(path, (st.st_mode | mode) & 0o7777)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class LocalTransport(Transport):
    name = "local"

    def __init__(self, die_with_parent: bool = False, inherit_prefixes: tuple[str, ...] = (),
                 inherit: Iterable[str] = (), cleanup: str = "auto") -> None:
        """`inherit_prefixes` and `inherit` (names): more of this process's variables its
        workers see (a pilot's workers: `SLURM_`, the Slurm job they belong to, and DEVICE_ENV,
        the GPUs Slurm bound to it). `cleanup`: how all of a worker's processes are found and
        ended (cleanup.MODES; "auto": a cgroup where this host allows one, else the fallback)."""
        if die_with_parent and _prctl is None:
            raise OSError("die_with_parent needs Linux prctl(PR_SET_PDEATHSIG)")
        self._preexec = _die_with_parent if die_with_parent else None
        self.cleanup = Cleanup(cleanup)
        log.info("local workers: every process a job starts is ended by %s", self.cleanup.describe())
        self._inherit = inherit_prefixes
        self._inherit_names = tuple(inherit)
        self._procs: dict[tuple[int, str], subprocess.Popen] = {}  # (pid, token) -> our child
        self._exits: dict[tuple[int, str], int] = {}               # (pid, token) -> how it ended
        self._lock = threading.Lock()

    def host_of(self, node: NodeSpec) -> Optional[str]:
        return "127.0.0.1"

    def cleanup_of(self, node: NodeSpec) -> str:
        return self.cleanup.mechanism

    def _inherited(self) -> dict[str, str]:
        env = inherited_env(os.environ, self._inherit_names)
        if self._inherit:
            env.update({k: v for k, v in os.environ.items() if k.startswith(self._inherit)})
        return env

    def give_dir(self, node: NodeSpec, path: str, user: str) -> None:
        try:
            account = pwd.getpwnam(user)
        except KeyError:
            raise StartError(node.name, f"there is no Unix account {user!r} on this host") from None
        try:
            private_dirs(Path(path).parent, 0o711)     # it can pass through (not list) its parents
            private_dirs(Path(path).parent.parent, 0o711)
            Path(path).mkdir(mode=0o700, exist_ok=True)
            os.chown(path, account.pw_uid, account.pw_gid)
            os.chmod(path, 0o700)
        except OSError as e:
            raise StartError(node.name, f"cannot give {path} to {user}: {e.strerror}") from None

    def start(self, node: NodeSpec, argv: Sequence[str], env: Mapping[str, str], workdir: str,
              log_path: str) -> Handle:
        argv, env = list(argv), dict(env)
        check_start_args(node, argv, env, workdir, log_path)
        if workdir and not os.path.isdir(workdir):
            raise StartError(node.name, f"no working directory {workdir!r}")
        mark = env[ENV_MARK] = check_mark(env[ENV_MARK]) if env.get(ENV_MARK) else new_mark()
        try:
            private_dirs(Path(log_path).parent)
            try:
                proc = self._popen(argv, env, workdir, log_path, mark)
            except subprocess.SubprocessError as e:     # it could not join its cgroup
                self.cleanup.release(mark)
                self.cleanup.degrade(str(e))
                proc = self._popen(argv, env, workdir, log_path, mark)
        except FileNotFoundError as e:
            raise StartError(node.name, f"command not found: {argv[0]!r} (in {workdir or os.getcwd()!r})") from e
        except PermissionError as e:
            raise StartError(node.name, f"not executable: {argv[0]!r} ({e.strerror})") from e
        except OSError as e:
            raise StartError(node.name, f"cannot start {argv[0]!r} in {workdir or '.'!r}: {e}") from e
        # read before the child can be reaped (its zombie still has a start time)
        token = start_token(proc.pid) if proc.poll() is None else ""
        with self._lock:
            self._procs[(proc.pid, token)] = proc
        return Handle(node, proc.pid, token, log_path, time.time(), mark)

    def _popen(self, argv: list[str], env: dict[str, str], workdir: str, log_path: str,
               mark: str) -> subprocess.Popen:
        """The worker, in its cgroup from before its exec where there is one."""
        fd = self.cleanup.prepare(mark)
        try:
            # the log is the harvester's (0600): a job run as another account writes it through
            # the descriptor it inherits, and reads no other job's
            with os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
                return subprocess.Popen(argv, env={**self._inherited(), **env}, cwd=workdir or None,
                                        stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_joiner(fd, self._preexec))
        except OSError:
            self.cleanup.release(mark)
            raise
        finally:
            if fd is not None:
                os.close(fd)

    def _proc(self, handle: Handle) -> Optional[subprocess.Popen]:
        with self._lock:
            return self._procs.get((handle.pid, handle.token))

    def _reap(self, handle: Handle) -> bool:
        """Reap our own child if it exited; True while the leader runs."""
        proc = self._proc(handle)
        if proc is not None:
            if proc.poll() is None:
                return True
            with self._lock:
                self._procs.pop((handle.pid, handle.token), None)
                if len(self._exits) >= _EXITS_KEPT:
                    self._exits.pop(next(iter(self._exits)))
                self._exits[(handle.pid, handle.token)] = proc.returncode
            if handle.mark:
                self.cleanup.release(handle.mark)     # gone with it, unless it left processes
            return False
        # a handle from another transport instance (or a controller that restarted)
        return bool(handle.token) and start_token(handle.pid) == handle.token

    def _ours(self, handle: Handle) -> bool:
        """False when the PID now belongs to an unrelated process (never signal that)."""
        if self._proc(handle) is not None:
            return True
        now = start_token(handle.pid)
        return now == "" or now == handle.token

    def _alive_node(self, handles: list[Handle]) -> dict[Handle, bool]:
        return {h: self._reap(h) for h in handles}

    def _census_node(self, handles: list[Handle]) -> dict[Handle, Optional[int]]:
        members = self.cleanup.members(h.mark for h in handles if h.mark)
        counts = census.count([(h.pid, h.mark) for h in handles], members)
        return {h: counts.get(h.pid) for h in handles}

    def folder_size(self, node: NodeSpec, path: str) -> tuple[Optional[int], bool]:
        return census.folder_size(path)

    def _strays(self, handles: list[Handle]) -> dict[Handle, list[int]]:
        """Each worker's processes outside its process group: children that called setsid()."""
        marked = [h for h in handles if h.mark]
        members = self.cleanup.members(h.mark for h in marked) if marked else {}
        return {h: [p for p in members.get(h.mark, []) if (f := proc_stat(p)) is not None and int(f[2]) != h.pid]
                for h in marked}

    def _stop_node(self, handles: list[Handle], grace_s: float) -> dict[Handle, str]:
        """SIGTERM the group and every process of the worker outside it, wait for all of them
        within the grace, SIGKILL what is left. The result says how the group went: a child
        the worker left behind is ended as well, and does not make its exit a kill."""
        out: dict[Handle, str] = {}
        leaders: list[Handle] = []     # groups still running
        for h in handles:
            self._reap(h)
        groups = live_groups()
        strays = self._strays(handles)
        for h in handles:
            leader = self._ours(h) and group_alive(h.pid, groups)
            if leader:
                _signal_group(h.pid, signal.SIGTERM)
                _signal_group(h.pid, signal.SIGCONT)
                leaders.append(h)
            signal_each(strays.get(h, []), signal.SIGTERM)
            signal_each(strays.get(h, []), signal.SIGCONT)
            out[h] = STOP_TERM if leader else STOP_GONE
        pending = [h for h in handles if h in leaders or strays.get(h)]    # a group or a stray runs
        deadline = time.monotonic() + grace_s
        while pending:
            for h in pending:
                self._reap(h)
            groups = live_groups()
            leaders = [h for h in leaders if group_alive(h.pid, groups)]
            strays = self._strays([h for h in pending if h not in leaders])     # once its group is gone
            pending = [h for h in pending if h in leaders or strays.get(h)]
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        self._kill_together(pending)
        out.update({h: STOP_KILL for h in leaders})
        for h in handles:
            if h.mark:
                self.cleanup.release(h.mark)
        return out

    def kill(self, handle: Handle) -> None:
        self._kill_together([handle])
        if handle.mark:
            self.cleanup.release(handle.mark)

    def _kill_together(self, handles: list[Handle]) -> None:
        """SIGKILL every one of these groups and all of each worker's processes first, then wait
        until all are gone (at most _KILL_WAIT_S): the ranks of a node a pilot must give back
        die in parallel, not one after the other."""
        groups_of = [h for h in handles if self._ours(h)]
        for h in groups_of:
            _signal_group(h.pid, signal.SIGKILL)
        marks = [h.mark for h in handles if h.mark]
        self.cleanup.kill(marks)
        deadline = time.monotonic() + _KILL_WAIT_S
        while handles:
            for h in groups_of:
                self._reap(h)
            groups = live_groups()
            if not any(group_alive(h.pid, groups) for h in groups_of) and \
                    not any(self.cleanup.members(marks).values()):
                break
            if time.monotonic() >= deadline:
                log.warning("processes of %d worker(s) outlived SIGKILL for %g s", len(handles), _KILL_WAIT_S)
                break
            time.sleep(_POLL_S)
        for h in groups_of:
            proc = self._proc(h)
            if proc is not None:
                try:
                    proc.wait(1.0)
                except subprocess.TimeoutExpired:
                    pass
                self._reap(h)

    def run(self, node: NodeSpec, argv: Sequence[str], timeout: float = 30.0) -> tuple[int, str, str]:
        try:
            r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                               env=self._inherited(), stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return 127, "", f"{argv[0]}: not found"
        except subprocess.TimeoutExpired:
            raise TransportError(node.name, f"no answer within {timeout:g} s") from None
        return r.returncode, r.stdout, r.stderr

    def exit_status(self, handle: Handle) -> Optional[int]:
        self._reap(handle)
        with self._lock:
            return self._exits.get((handle.pid, handle.token))

    def tail(self, handle: Handle, lines: int = 20) -> list[str]:
        return tail_file(handle.log_path, lines)

    def close(self) -> None:
        self.cleanup.close()


def tail_file(path: str, lines: int) -> list[str]:
    """The last `lines` lines of a file, reading only its end: at most logtail.MAX_READ_BYTES,
    each line at most logtail.MAX_LINE_BYTES (longer ones cut and marked)."""
    return tail_path(path, lines)
