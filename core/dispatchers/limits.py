"""The site's caps on what one job holds: its processes on each node (`max_pids`) and the disk its
checkpoint folder takes (`max_checkpoint_bytes`); 0 turns a cap off.

A job over a cap fails with kind `limit` (the job's own fault: its node is not held out, it is not
requeued, blame.py), its processes on the node over the cap are killed at once, and nothing of
its files is deleted. Measured by polling over the transport, off the controller's thread:
processes each `every_s` (census.py: the worker's session, process group and cgroup or mark),
the folder each `checkpoint_every_s` (a walk of bounded cost). A fork bomb can outrun a poll:
between two checks it may make many more processes than the cap, which the kill then ends.
RLIMIT_NPROC is not used: it caps every process of a real uid together, which for jobs that run
as the harvester's own account would count the harvester and every other job.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .. import failures
from ..failures import Failure
from ..transports.base import Handle, Transport, TransportError

log = logging.getLogger(__name__)
GIB = 1024 ** 3
DEFAULT_MAX_PIDS = 512
DEFAULT_MAX_CHECKPOINT_GIB = 50.0
PIDS_EVERY_S = 1.0
CHECKPOINT_EVERY_S = 5.0


@dataclass(frozen=True)
class JobLimits:
    """The caps (0: off) and how often each is measured."""
    max_pids: int = DEFAULT_MAX_PIDS
    max_checkpoint_bytes: int = int(DEFAULT_MAX_CHECKPOINT_GIB * GIB)
    every_s: float = PIDS_EVERY_S
    checkpoint_every_s: float = CHECKPOINT_EVERY_S


@dataclass(frozen=True)
class Watched:
    """One running job as the limits see it: its checkpoint folder and its workers now."""
    job_id: str
    checkpoint: str
    handles: tuple[Handle, ...]


def pids_failure(node: str, count: int, cap: int) -> Failure:
    return failures.named(failures.LIMIT, f"its processes on {node} numbered {count:,}, over the cap of "
                                          f"{cap:,} per node (--job-max-pids): they were killed", node)


def checkpoint_failure(folder: str, size: int, cap: int, node: Optional[str]) -> Failure:
    return failures.named(failures.LIMIT, f"its checkpoint folder {folder} takes {_bytes(size)}, over the cap "
                                          f"of {_bytes(cap)} (--job-max-checkpoint-gib); nothing was deleted", node)


def over_pids(counts: dict[Handle, Optional[int]], jobs: list[Watched], cap: int) -> list[tuple[str, str, Failure]]:
    """(job, node, failure) for each job over `cap` processes on a node (its workers' there summed)."""
    out = []
    for w in jobs:
        per_node: dict[str, int] = {}
        for h in w.handles:
            n = counts.get(h)
            if n is not None:
                per_node[h.node.name] = per_node.get(h.node.name, 0) + n
        worst = max(per_node.items(), key=lambda kv: kv[1], default=None)
        if worst is not None and worst[1] > cap:
            out.append((w.job_id, worst[0], pids_failure(worst[0], worst[1], cap)))
    return out


@dataclass
class LimitWatch:
    """Runs the measures on the dispatcher's pool, one round at a time; `over(job, node, failure)`
    is told of each job over a cap (once per job)."""
    transport: Transport
    limits: JobLimits
    submit: Callable
    over: Callable[[str, Optional[str], Failure], None]
    _busy: bool = False
    _last: float = float("-inf")
    _last_folder: float = float("-inf")
    _told: set[str] = field(default_factory=set)
    _partial: set[str] = field(default_factory=set)     # jobs whose folder was too big to read whole
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def active(self) -> bool:
        return self.limits.max_pids > 0 or self.limits.max_checkpoint_bytes > 0

    def poll(self, watched: Callable[[], list[Watched]]) -> None:
        """Per dispatcher poll: a round starts when one is due and none runs."""
        t = time.monotonic()
        with self._lock:
            every = max(self.limits.every_s, self.transport.census_every_s)
            if not self.active() or self._busy or t - self._last < every:
                return
            jobs = [w for w in watched() if w.handles and w.job_id not in self._told]
            if not jobs:
                return
            self._busy, self._last = True, t
            folders = self.limits.max_checkpoint_bytes > 0 and t - self._last_folder >= self.limits.checkpoint_every_s
            if folders:
                self._last_folder = t
        self.submit(self._round, jobs, folders)

    def _round(self, jobs: list[Watched], folders: bool) -> None:
        try:
            found = self._pids(jobs) if self.limits.max_pids > 0 else []
            if folders:
                gone = {j for j, _, _ in found}
                found += self._folders([w for w in jobs if w.job_id not in gone])
            for job_id, node, failure in found:
                with self._lock:
                    if job_id in self._told:
                        continue
                    self._told.add(job_id)
                log.info("job %s: %s", job_id, failure.line())
                self.over(job_id, node, failure)
        except Exception:       # a round must never kill the pool's thread
            log.exception("measuring the jobs' limits failed")
        finally:
            with self._lock:
                self._busy = False

    def _pids(self, jobs: list[Watched]) -> list[tuple[str, Optional[str], Failure]]:
        counts = self.transport.census([h for w in jobs for h in w.handles])
        return list(over_pids(counts, jobs, self.limits.max_pids))

    def _folders(self, jobs: list[Watched]) -> list[tuple[str, Optional[str], Failure]]:
        out: list[tuple[str, Optional[str], Failure]] = []
        cap = self.limits.max_checkpoint_bytes
        for w in jobs:
            spec = w.handles[0].node
            try:
                size, whole = self.transport.folder_size(spec, w.checkpoint)
            except TransportError:
                continue
            if size is not None and size > cap:
                out.append((w.job_id, None, checkpoint_failure(w.checkpoint, size, cap, spec.name)))
            elif not whole and w.job_id not in self._partial:
                self._partial.add(w.job_id)
                log.warning("job %s: its checkpoint folder %s holds too many files to read whole each time; "
                            "its size is measured on the first of them only", w.job_id, w.checkpoint)
        return out

    def forget(self, job_id: str) -> None:
        """The job ended: what is kept stays bounded by the jobs that run (a requeued one is watched again)."""
        with self._lock:
            self._told.discard(job_id)
            self._partial.discard(job_id)


def _bytes(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"
