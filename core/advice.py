"""The controller's side of the Job Profiling Advisor: measurements go in (and to the store),
the allocator's view of each job and the sizes worth probing come out. Without an advisor every
job is taken as given, so the controller never asks whether there is one."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

from .counters import Counters
from .jpa import JPA, Probe
from .model import Job, PauseSample, RateSample
from .objective import JobRequest
from .store import Batch

#: what a forced probe adds to its size's value: more than any plan's objective can be
PROBE_BONUS = 1e12


class Advice:
    def __init__(self, advisor: Optional[JPA]) -> None:
        self.advisor = advisor
        self.news: set[str] = set()          # jobs with a first sample at a size since the last step

    @property
    def on(self) -> bool:
        return self.advisor is not None

    def register(self, job: Job) -> None:
        if self.advisor is not None:
            self.advisor.register(job)
            self.request(job, ())

    def learn(self, samples: list, batch: Batch, counters: Counters) -> set[str]:
        """Hand measurements to the advisor and the store. Returns the jobs that got a
        throughput sample; those whose sample was the first at a size are news."""
        measured: set[str] = set()
        if self.advisor is None:
            return measured
        for smp in samples:
            if not isinstance(smp, (RateSample, PauseSample)):
                continue
            if isinstance(smp, RateSample):
                measured.add(smp.job)
            batch.sample(smp)
            counters.samples += 1
            if self.advisor.observe(smp):
                self.news.add(smp.job)
        return measured

    def take_news(self) -> bool:
        """Whether some job was measured at a new size (worth a re-plan); clears the news."""
        had = bool(self.news)
        self.news.clear()
        return had

    def probes(self, now: float, remaining: dict[str, float], measured: set[str], room: int,
               tfwd: float) -> dict[str, Probe]:
        if self.advisor is None:
            return {}
        return self.advisor.wanted_probes(now, remaining, measured, room=room, tfwd=tfwd)

    def request(self, job: Job, held: Sequence[str]) -> JobRequest:
        """The job as the allocator sees it: its own curve and costs, or the advisor's belief
        (which also becomes `job.curve`, the curve the dashboard shows as in use)."""
        if self.advisor is None or not self.advisor.known(job.id):
            return JobRequest(job.id, job.min_nodes, job.max_nodes, job.curve, job.scale_up_seconds,
                              job.scale_down_seconds, tuple(held), job.priority)
        b = self.advisor.belief(job.id)
        job.curve = b.curve
        return JobRequest(job.id, job.min_nodes, max(job.min_nodes, b.max_nodes), b.curve,
                          b.scale_up_seconds, b.scale_down_seconds, tuple(held), job.priority)

    @staticmethod
    def force(reqs: list[JobRequest], probes: dict[str, Probe], room: int) -> dict[str, int]:
        """Pin each job with a wanted probe to the probe's size (in place), as far as the free
        nodes go: a probe grows into free nodes only. Returns job -> forced size."""
        forced: dict[str, int] = {}
        for i, r in enumerate(reqs):
            probe = probes.get(r.id)
            if probe is not None and probe.size - r.current <= room:
                reqs[i] = replace(r, min_nodes=probe.size, max_nodes=probe.size, bonus=PROBE_BONUS)
                forced[r.id] = probe.size
                room -= max(0, probe.size - r.current)
        return forced

    def ran(self, job_id: str, size: int, now: float) -> Optional[str]:
        """The job runs at `size` from now; why, when that size is a probe or a first try."""
        return self.advisor.ran(job_id, size, now) if self.advisor is not None else None
