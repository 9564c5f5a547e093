"""How to run one worker process on one node: start it detached, ask whether it still runs,
stop it, read the end of its log. Two backends share this interface: `local` (every "node" is
a process group on this machine) and `ssh` (the OpenSSH client to a real node).

The dispatcher owns the policy (which job, which node, when); a transport only owns the
mechanism. It keeps no state that matters: a `Handle` holds everything needed to reach the
process again (node, PID, an identity token), so it can be written to the store and used by a
controller started later (or by another transport instance) to poll or stop the same worker.

Process model, identical in both backends: the worker is the leader of its own session and
process group (PID == PGID == SID), stdin is /dev/null, stdout and stderr go to `log_path`.
`stop` and `kill` signal the whole group, so children the worker forked go with it, and they
end every other process the worker started too (one that called setsid(), or a double-forked
daemon): a cgroup per worker where the node allows one, else the processes its mark
(HARVEST_WORKER in their environment) names (core/transports/cleanup.py).
"""
from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping, Optional, Sequence

from .runas import RunAs

#: environment variable names accepted by `start` (what a POSIX shell can export)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: all a worker inherits from the process that starts it (the harvester, or a pilot): nothing
#: that could hold a secret; a site adds names (`LiveSettings.worker_env`, `--worker-env`)
WORKER_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR")
WORKER_ENV_PREFIXES = ("LC_",)
#: the devices a batch scheduler bound to a job (Slurm's gres/gpu sets each of these): a worker
#: started inside that job, by a Slurm pilot, must use the same ones, not every GPU of the node
DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK",
              "GPU_DEVICE_ORDINAL")
#: what `stop` reports
STOP_GONE, STOP_TERM, STOP_KILL, STOP_LOST = "gone", "term", "kill", "lost"


class TransportError(RuntimeError):
    """The node could not be reached (ssh exit status 255, connection timeout, dead master).
    The caller should treat the node as lost: its workers are in an unknown state."""

    def __init__(self, node: str, message: str) -> None:
        self.node, self.message = node, message
        super().__init__(f"{node}: {message}")


class StartError(RuntimeError):
    """The node answered but the worker could not be started (no such command, no such working
    directory, log not writable). A problem of the job, not of the node."""

    def __init__(self, node: str, message: str) -> None:
        self.node, self.message = node, message
        super().__init__(f"{node}: {message}")


@dataclass(frozen=True)
class NodeSpec:
    """One node of the inventory. `target` is the ssh destination (`host`, `user@host`, or a
    Host alias of the ssh config, so ProxyJump etc. come from there); '' for local processes.
    `slots` is how many workers it may run at once (GPUs per node)."""
    name: str
    target: str = ""
    slots: int = 1


@dataclass(frozen=True)
class Handle:
    """A started worker. `pid` is also its process group and session id. `token` is the
    process start time (field 22 of /proc/PID/stat): a PID that was reused by an unrelated
    process has another start time, so it is never signalled (empty when the worker had
    already exited by the time it was read). `mark` names its cgroup and is HARVEST_WORKER in
    the environment of everything it starts ('' where the transport keeps none: a stop then
    reaches its process group only). Frozen and hashable: usable as a dict key."""
    node: NodeSpec
    pid: int
    token: str
    log_path: str
    started_at: float  # wall clock (time.time()) when start() returned
    mark: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "Handle":
        return cls(node=NodeSpec(**d["node"]), pid=int(d["pid"]), token=str(d["token"]),
                   log_path=str(d["log_path"]), started_at=float(d["started_at"]), mark=str(d.get("mark", "")))


def check_start_args(node: NodeSpec, argv: Sequence[str], env: Mapping[str, str], workdir: str,
                     log_path: str) -> None:
    """Reject what cannot be passed through exec() unchanged, before anything runs."""
    if not log_path.startswith("/"):
        raise ValueError(f"{node.name}: the log path must be absolute, not {log_path!r}")
    if "\0" in workdir or "\0" in log_path:
        raise ValueError(f"{node.name}: NUL byte in the working directory or log path")
    if not argv:
        raise ValueError(f"{node.name}: empty argv")
    for a in argv:
        if not isinstance(a, str):
            raise TypeError(f"{node.name}: argv items must be str, not {type(a).__name__}")
        if "\0" in a:
            raise ValueError(f"{node.name}: NUL byte in an argument")
    for k, v in env.items():
        if not isinstance(k, str) or not ENV_NAME.match(k):
            raise ValueError(f"{node.name}: bad environment variable name {k!r}")
        if not isinstance(v, str):
            raise TypeError(f"{node.name}: environment value of {k} must be str")
        if "\0" in v:
            raise ValueError(f"{node.name}: NUL byte in the value of {k}")


def inherited_env(environ: Mapping[str, str], allow: Iterable[str] = ()) -> dict[str, str]:
    """The part of `environ` a worker may see: WORKER_ENV, LC_*, and the names in `allow`."""
    names = set(WORKER_ENV) | set(allow)
    return {k: v for k, v in environ.items() if k in names or k.startswith(WORKER_ENV_PREFIXES)}


class Transport(ABC):
    """Run processes on nodes. Thread-safe: the dispatcher may call it from several threads
    (e.g. one per node when vacating many nodes at once)."""

    name: str = ""
    #: the least seconds between two process counts of a job (`census`): a remote one is a
    #: round trip and a login shell on every node, so remote transports ask less often
    census_every_s: float = 1.0

    @abstractmethod
    def start(self, node: NodeSpec, argv: Sequence[str], env: Mapping[str, str], workdir: str,
              log_path: str) -> Handle:
        """Start `argv` (exec'd directly, never through a shell: every item arrives as one
        literal argument) detached from the caller, in `workdir` ('' = the login directory /
        the caller's cwd; a relative one is relative to those), with `env` added to the node's
        normal environment (locally: only `inherited_env` of the caller's, never its secrets),
        stdout+stderr truncated into `log_path` (absolute; its directory is
        created). `env` may carry the worker's mark (HARVEST_WORKER, cleanup.new_mark(): a
        caller whose launcher resets the environment, sudo, must list it to keep it); without
        one the transport makes one. Returns as soon as the PID is
        known. Raises StartError when the command or workdir does not exist, TransportError
        when the node cannot be reached, ValueError for arguments exec() cannot carry."""

    def start_as(self, node: NodeSpec, launcher: RunAs, user: str, argv: Sequence[str], env: Mapping[str, str],
                 workdir: str, log_path: str) -> Handle:
        """`start` as Unix account `user` through the site's launcher: its words before `argv`,
        keeping exactly the variables of `env`. A transport whose worker gets variables of its
        own on the node (a Slurm pilot's binding) applies the launcher there instead."""
        return self.start(node, launcher.argv(user, env, argv), env, workdir, log_path)

    def host_of(self, node: NodeSpec) -> Optional[str]:
        """The host a worker for `node` runs on, as this host would name it; None: not known."""
        return None

    def cleanup_of(self, node: NodeSpec) -> str:
        """How a stop ends every process of a worker on `node` (cleanup.CGROUP2, CGROUP1,
        ENVIRON or NONE); '' while not known (no worker started there yet, or not said)."""
        return ""

    def give_dir(self, node: NodeSpec, path: str, user: str) -> None:
        """Create directory `path` on the node (with its parents) owned by Unix account `user`
        and private to it (0700): where a job that runs as that account writes (its checkpoints).
        Its parent and grandparent (the job's folder and the workers' folder, otherwise 0700) are
        made passable (0711): the account can enter them, not list them. Raises StartError when that cannot be done, TransportError when the node is unreachable."""
        raise StartError(node.name, f"the {self.name or 'this'} transport cannot run workers as another account")

    def alive_many(self, handles: Iterable[Handle]) -> dict[Handle, Optional[bool]]:
        """Whether each worker (its group leader) still runs; a zombie counts as dead. One
        round trip per node, nodes in parallel. None for the handles of a node that could not
        be reached (treat that node as lost)."""
        return self._per_node(handles, self._alive_node, None)

    def alive(self, handle: Handle) -> bool:
        """Whether this worker still runs. Raises TransportError when its node is unreachable."""
        return self._alive_node([handle])[handle]

    def census(self, handles: Iterable[Handle]) -> dict[Handle, Optional[int]]:
        """How many live processes each worker has on its node (its session's, its process
        group's and those its cleanup finds: core/transports/census.py), one round trip per node;
        a handle left out, or None, where that is not known (an unreachable node, a transport
        that cannot tell)."""
        return self._per_node(handles, self._census_node, None)

    def _census_node(self, handles: list[Handle]) -> dict[Handle, Optional[int]]:
        """census for handles that all live on one node (nothing known by default)."""
        return {}

    def folder_size(self, node: NodeSpec, path: str) -> tuple[Optional[int], bool]:
        """The bytes of disk the folder `path` on the node takes, and whether all of it was read
        (a walk of bounded cost may stop early: the size is then a lower bound); (None, True)
        when there is no such folder or the transport cannot tell. Raises TransportError when
        the node is unreachable."""
        return None, True

    def stop_many(self, handles: Iterable[Handle], grace_s: float = 5.0) -> dict[Handle, str]:
        """`stop` for many workers: one round trip per node, all nodes in parallel, so vacating
        N nodes costs one grace period, not N. "lost" for the handles of a node that could not
        be reached."""
        return self._per_node(handles, lambda hs: self._stop_node(hs, grace_s), STOP_LOST)

    def stop(self, handle: Handle, grace_s: float = 5.0) -> str:
        """SIGTERM (then SIGCONT, so a stopped worker can act on it) to the worker's process
        group, wait until the group is empty or `grace_s` has passed, then SIGKILL what is left.
        Returns once the group is gone (at most grace_s + a few seconds): "term" (gone after
        SIGTERM), "kill" (needed SIGKILL) or "gone" (nothing was running). Idempotent; also
        the way to clean up after a worker that died (reaps it, kills any leftover children).
        Raises TransportError when the node is unreachable."""
        return self._stop_node([handle], grace_s)[handle]

    @abstractmethod
    def _alive_node(self, handles: list[Handle]) -> dict[Handle, bool]:
        """alive for handles that all live on one node; raises TransportError."""

    @abstractmethod
    def _stop_node(self, handles: list[Handle], grace_s: float) -> dict[Handle, str]:
        """stop for handles that all live on one node; raises TransportError."""

    def _per_node(self, handles: Iterable[Handle], fn, lost) -> dict:
        groups: dict[str, list[Handle]] = {}
        for h in handles:
            groups.setdefault(h.node.name, []).append(h)
        out: dict = {}
        lock = threading.Lock()

        def one(hs: list[Handle]) -> None:
            try:
                r = fn(hs)
            except TransportError:
                r = {h: lost for h in hs}
            with lock:
                out.update(r)

        if len(groups) <= 1:
            for hs in groups.values():
                one(hs)
        else:
            with ThreadPoolExecutor(max_workers=min(32, len(groups))) as pool:
                list(pool.map(one, groups.values()))
        return out

    def taken_back(self, node: str, handle: Optional[Handle] = None) -> bool:
        """Whether the node's owner has taken it back (its batch scheduler preempted the job
        that held it; the node source reports that as a leave), from under `handle` when one is
        given. A worker there that died or cannot be reached is then part of that leave, not a
        crash of the training job."""
        return False

    def adoptable(self, node: NodeSpec, job: str, key: str, inc: int) -> Optional[Handle]:
        """The process of worker (`key`, incarnation `inc`) of `job` on `node` that outlived
        an earlier harvester run, to be adopted; None where workers die with the harvester."""
        return None

    @abstractmethod
    def kill(self, handle: Handle) -> None:
        """SIGKILL the worker's process group now (a crash, or a node that must be vacated
        within no grace at all); returns once the group is gone."""

    def run(self, node: NodeSpec, argv: Sequence[str], timeout: float = 30.0) -> tuple[int, str, str]:
        """Run `argv` on the node and wait: (exit status, stdout, stderr), for checks of the node.
        Raises TransportError when the node cannot be reached."""
        raise NotImplementedError(f"the {self.name or 'this'} transport runs no checks")

    def exit_status(self, handle: Handle) -> Optional[int]:
        """How a worker that is gone ended: its exit status, or minus the signal that killed it;
        None where the transport cannot know (a process that was not its own child)."""
        return None

    @abstractmethod
    def tail(self, handle: Handle, lines: int = 20) -> list[str]:
        """The last `lines` lines of the worker's log (for the dashboard when a job fails);
        [] when there is no log."""

    def close(self) -> None:
        """Release what the transport holds (ssh master connections). Workers keep running:
        stop them first if that is what you want."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
