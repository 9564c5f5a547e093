"""Jobs waiting for a running slot, in admission order: first come first served, by priority, or
by fair share (the owner who used least for their share first, then first come), with the demo
lane's registered jobs first. It decides who takes a free slot; the controller
applies that to its job and node state."""
from __future__ import annotations

import heapq
import itertools
from typing import Callable, Iterable, Iterator, Mapping, Optional

from .admission import free_slots
from .controller_config import ControllerConfig
from .model import Job, JobState


class JobQueue:
    def __init__(self, config: ControllerConfig, rank: Optional[Callable[[Job], float]] = None) -> None:
        self.config = config
        self._heap: list[tuple] = []     # (lane first, order key..., seq, job id); may hold stale entries
        self._seq = itertools.count()
        self._ids: set[str] = set()      # the jobs queued now: an entry of another id is stale
        #: queue fairshare: a job's owner's use per share now (lower goes first; core.fairshare)
        self.rank = rank

    def in_lane(self, job: Job) -> bool:
        """A registered job (not the job set's) while the demo lane is on."""
        return self.config.visitor_slots > 0 and bool(job.owner)

    def push(self, job: Job) -> None:
        """Queue a job (new, restored, or back from running): it keeps its place by submit time."""
        if job.id in self._ids:
            return                        # queued already: one entry, one admission
        key = (-job.priority, job.submit_time) if self.config.queue == "priority" else (job.submit_time,)
        heapq.heappush(self._heap, (0 if self.in_lane(job) else 1, *key, next(self._seq), job.id))
        self._ids.add(job.id)

    @property
    def count(self) -> int:
        """Jobs queued now (each pushed once, taken off once, whatever the order of events)."""
        return len(self._ids)

    def discard(self, job_id: str) -> None:
        """A job ended, or is no longer queued: its entry is stale (the heap is rebuilt once
        more than half of it is, so it stays O(queued))."""
        self._ids.discard(job_id)
        if len(self._heap) > 2 * len(self._ids) + 16:
            self._heap = [e for e in self._heap if e[-1] in self._ids]
            heapq.heapify(self._heap)

    def queued(self, jobs: Mapping[str, Job], ordered: bool = True) -> list[Job]:
        """The queued jobs, in admission order (or, cheaper, in no order)."""
        entries = self._ordered(jobs) if ordered else self._current()
        return [jobs[e[-1]] for e in entries if jobs[e[-1]].state is JobState.QUEUED]

    def _current(self) -> list[tuple]:
        return [e for e in self._heap if e[-1] in self._ids]

    def _ordered(self, jobs: Mapping[str, Job]) -> list[tuple]:
        """The entries in admission order; by fair share the order moves with use, so it is
        worked out now rather than kept in the heap."""
        if self.config.queue != "fairshare" or self.rank is None:
            return sorted(self._current())
        rank = self.rank
        return sorted(self._current(), key=lambda e: (e[0], rank(jobs[e[-1]]), *e[1:]))

    def free_slots(self, lane: bool, running: Iterable[Job]) -> int:
        running = list(running)
        cfg = self.config
        in_lane = sum(1 for j in running if self.in_lane(j)) if cfg.visitor_slots else 0
        return free_slots(cfg.max_jobs, cfg.visitor_slots, len(running), in_lane, lane)

    def admit(self, jobs: Mapping[str, Job], running: Iterable[Job], can_start: Callable[[Job], bool]) -> list[Job]:
        """Take off the queue, in order, the queued jobs that get a free running slot and can start
        now; the others keep their place. The lane's jobs come first and have the most room, so
        nobody after a job without a slot has one."""
        running = list(running)
        admitted, skipped = [], []
        fair = self.config.queue == "fairshare" and self.rank is not None
        if fair:                                  # the order of this moment; the heap is refilled below
            entries: Iterator[tuple] = iter(self._ordered(jobs))
            self._heap = []
        else:
            entries = self._popped()
        for entry in entries:
            if entry[-1] not in self._ids:
                continue                          # stale: the job ended, or was queued again since
            job = jobs[entry[-1]]
            if job.state is not JobState.QUEUED:
                continue
            if self.free_slots(self.in_lane(job), running) <= 0:
                skipped.append(entry)
                break
            if not can_start(job):
                skipped.append(entry)
                continue
            admitted.append(job)
            running.append(job)
            self._ids.discard(job.id)
        if fair:
            skipped.extend(entries)               # those after the first without a slot
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return admitted

    def _popped(self) -> Iterator[tuple]:
        """The heap's entries in order, each taken off as it is reached (the rest stay put)."""
        while self._heap:
            yield heapq.heappop(self._heap)
