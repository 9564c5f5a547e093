"""Simulated dispatcher for replay and demos: progress is computed, not measured.

A job's progress is the integral of its true curve at its current size, minus each rescale's
cost (`scale_up/down_seconds` x throughput before the change) and minus BFTrainer's
preemption charge (a job that loses nodes to the main scheduler loses `scale_down_seconds`
of progress). Both charges use the true curve; the allocator only sees what it believes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..model import Event, EventKind, Job
from .base import Dispatcher


@dataclass
class _Run:
    job: Job
    nodes: int = 0
    samples: float = 0.0
    since: float = 0.0
    rate: float = 0.0


def true_rate(job: Job, n: int) -> float:
    curve = job.true_curve or job.curve
    return curve(n) if n >= job.min_nodes else 0.0


class SimulatedDispatcher(Dispatcher):
    name = "simulated"

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self.rescales = 0
        self.preemptions = 0
        self.lost_samples = 0.0

    def adopt(self, job: Job, nodes: int, now: float) -> None:
        """Take over a job restored from the store, at the progress it recorded."""
        self._runs[job.id] = _Run(job, nodes, job.samples_done, now, true_rate(job, nodes))

    def _advance(self, run: _Run, now: float) -> None:
        if now > run.since:
            run.samples = min(run.job.total_samples, run.samples + run.rate * (now - run.since))
        run.since = max(run.since, now)

    def _charge(self, run: _Run, seconds: float) -> None:
        lost = min(run.samples, seconds * run.rate)
        run.samples -= lost
        self.lost_samples += lost

    def _run(self, job: Job, now: float) -> _Run:
        run = self._runs.get(job.id)
        if run is None:
            run = self._runs[job.id] = _Run(job, 0, job.samples_done, now)
        self._advance(run, now)
        return run

    def resize(self, job: Job, nodes: Sequence[str], now: float) -> None:
        run = self._run(job, now)
        n = len(nodes)
        if n == run.nodes:
            return
        if run.nodes > 0 and run.rate > 0:
            self.rescales += 1
            self._charge(run, job.scale_up_seconds if n > run.nodes else job.scale_down_seconds)
        run.nodes = n
        run.rate = true_rate(job, n)

    def vacate(self, job: Job, lost: Sequence[str], now: float) -> None:
        run = self._run(job, now)
        if not lost:
            return
        self.preemptions += len(lost)
        self._charge(run, job.scale_down_seconds)
        run.nodes = max(0, run.nodes - len(lost))
        run.rate = true_rate(job, run.nodes)

    def stop(self, job: Job, now: float) -> None:
        run = self._runs.pop(job.id, None)
        if run is not None:
            self._advance(run, now)
            job.samples_done = run.samples

    def progress(self, job: Job, now: float) -> float:
        run = self._runs.get(job.id)
        if run is None:
            return job.samples_done
        self._advance(run, now)
        return run.samples

    def rate(self, job: Job) -> float:
        run = self._runs.get(job.id)
        return run.rate if run else 0.0

    def _eta(self, run: _Run) -> Optional[float]:
        if run.rate <= 0:
            return None
        return run.since + max(0.0, run.job.total_samples - run.samples) / run.rate

    def next_event_time(self, now: float) -> Optional[float]:
        times = [t for t in (self._eta(r) for r in self._runs.values()) if t is not None]
        return min(times) if times else None

    def poll(self, now: float) -> list[Event]:
        done = []
        for jid, run in self._runs.items():
            self._advance(run, now)
            left = run.job.total_samples - run.samples
            if left <= max(1e-6, 1e-9 * run.job.total_samples) or (
                    run.rate > 0 and left / run.rate <= 1e-6):
                run.samples = run.job.total_samples
                done.append(Event(now, EventKind.JOB_DONE, job=jid))
        return done
