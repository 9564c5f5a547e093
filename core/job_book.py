"""The controller's jobs, split by what a step needs: the live ones (queued or running, taken in
by a step) that every step walks, the ended ones kept in memory only while recent, and the store
for the rest. Reading a job by id still finds it wherever it is, so a step costs O(live jobs)
however long the run, while an ended job's page, resubmission and usage keep working.

How many jobs ended in each state is counted here, at the one place a job ends, so the KPIs are
a count of state changes that are each made once, not a sum over history."""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, Mapping, Optional

from .model import Job, JobState
from .store import Store

#: ended jobs kept in memory (the newest; the snapshot shows them, the store holds them all)
ENDED_KEPT = 200
ENDED_STATES = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


class JobBook(Mapping[str, Job]):
    """Every job of the run by id; `live` is what the step walks. Without a store the ended jobs
    all stay in memory (nothing else holds them); with one, `trim` keeps the newest `keep` once
    the store has saved them."""

    def __init__(self, store: Optional[Store] = None, keep: int = ENDED_KEPT) -> None:
        self.store = store
        self.keep = keep
        self.live: dict[str, Job] = {}
        self.ended: OrderedDict[str, Job] = OrderedDict()     # oldest end first
        self.tally: dict[JobState, int] = {s: 0 for s in ENDED_STATES}

    def add(self, job: Job) -> None:
        """A job taken in by a step (or restored) that has not ended."""
        self.live[job.id] = job

    def end(self, job: Job) -> None:
        """The job has just ended (its state says how): out of the live set, counted once."""
        if job.id in self.ended:
            return
        self.live.pop(job.id, None)
        self.ended[job.id] = job
        self.tally[job.state] += 1

    def trim(self) -> None:
        """Let the oldest ended jobs go, past `keep` (call once the store has them)."""
        if self.store is None:
            return
        while len(self.ended) > self.keep:
            self.ended.popitem(last=False)

    def recent(self) -> list[Job]:
        """The newest ended jobs, at most `keep` (oldest first), what the snapshot shows."""
        jobs = list(self.ended.values())
        return jobs[-self.keep:] if self.keep else []

    def count(self, state: JobState) -> int:
        """Jobs in `state` now (live states are counted from the live set)."""
        if state in self.tally:
            return self.tally[state]
        return sum(1 for j in self.live.values() if j.state is state)

    def __getitem__(self, job_id: str) -> Job:
        job = self.live.get(job_id) or self.ended.get(job_id)
        if job is None and self.store is not None:
            rows = self.store.jobs("id = ?", [job_id])
            job = rows[0][0] if rows else None
        if job is None:
            raise KeyError(job_id)
        return job

    def __len__(self) -> int:
        return len(self.live) + sum(self.tally.values())

    def __iter__(self) -> Iterator[str]:
        return (j.id for j in self.values())

    def values(self) -> Iterator[Job]:  # type: ignore[override]
        """Every job: the live ones, then those ended (from the store where it holds them); for
        reports and results, never for a step."""
        yield from self.live.values()
        yield from self.ended.values()
        if self.store is not None:
            states = [s.value for s in ENDED_STATES]
            for job, _ in self.store.jobs(f"state in ({', '.join('?' * len(states))})", states):
                if job.id not in self.ended and job.id not in self.live:
                    yield job
