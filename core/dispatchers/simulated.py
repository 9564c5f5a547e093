"""Simulated dispatcher for replay and demos: progress is computed, not measured.

A job's progress is the integral of its true curve at its current size, minus each rescale's
cost (`scale_up/down_seconds` x throughput before the change) and minus BFTrainer's
preemption charge (a job that loses nodes to the main scheduler loses `scale_down_seconds`
of progress). Both charges use the true curve; the allocator only sees what it believes. A pause
that starts while another is under way extends it instead of adding to it, as a regroup does
(a reclaim, and the refill decided with it, end in one new generation).

With `measure` set it also reports what a profiler would see: every `every_s` of running at one
size (counted from the end of the rescale pause) a throughput sample of the true rate with
log-normal noise of sd `noise`, a shorter sample when the size changes after at least `min_s`
(noisier: sd x sqrt(every_s / its length)), and each rescale's pause with the same noise. The
noise of a sample is a function of (seed, job, time) only, so a resumed replay draws the same
numbers.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..model import Event, EventKind, Job, PauseSample, RateSample
from .base import Dispatcher


@dataclass(frozen=True)
class Measurement:
    """How the simulated profiler measures: sd of the log noise, seconds per sample, seed."""

    noise: float = 0.03
    every_s: float = 30.0
    seed: int = 0
    min_s: float = 10.0

    def __post_init__(self) -> None:
        if not (0 <= self.noise < 1) or self.every_s <= 0 or not (0 < self.min_s <= self.every_s):
            raise ValueError("measurement noise must be in [0, 1), every_s positive and 0 < min_s <= every_s")

    def factor(self, job: str, t: float, what: str, window: Optional[float] = None) -> float:
        if self.noise == 0:
            return 1.0
        sd = self.noise * math.sqrt(self.every_s / window) if window else self.noise
        key = zlib.crc32(f"{self.seed}:{job}:{what}:{t:.6f}".encode())
        return math.exp(sd * float(np.random.default_rng(key).standard_normal()))


@dataclass
class _Run:
    job: Job
    nodes: int = 0
    samples: float = 0.0
    since: float = 0.0
    rate: float = 0.0
    measure_from: float = 0.0      # the current measuring window started here
    fresh: bool = True             # no sample yet at this size: the first window is short
    paused_until: float = 0.0      # end of the rescale pause under way (a later one extends it)


def true_rate(job: Job, n: int) -> float:
    curve = job.true_curve or job.curve
    return curve(n) if n >= job.min_nodes else 0.0


class SimulatedDispatcher(Dispatcher):
    name = "simulated"

    def __init__(self, measure: Optional[Measurement] = None) -> None:
        self._runs: dict[str, _Run] = {}
        self.rescales = 0
        self.preemptions = 0
        self.lost_samples = 0.0
        self.measure = measure
        self._pending: list = []

    def adopt(self, job: Job, nodes: int, now: float) -> None:
        """Take over a job restored from the store, at the progress it recorded."""
        self._runs[job.id] = _Run(job, nodes, job.samples_done, now, true_rate(job, nodes), now)

    def _advance(self, run: _Run, now: float) -> None:
        if now > run.since:
            run.samples = min(run.job.total_samples, run.samples + run.rate * (now - run.since))
        run.since = max(run.since, now)

    def _charge(self, run: _Run, seconds: float, kind: str, now: float) -> float:
        """A rescale pause of `seconds` from `now`; returns when the job trains again. A pause
        that starts while another is under way (a reclaim mid-regroup, a re-plan right after a
        reclaim) extends it rather than adding to it: the regroup simply ends on the last
        membership (core.runtime.regroup: a pending regroup wins over a failed generation)."""
        end = max(run.paused_until, now + seconds)
        lost = min(run.samples, (end - max(now, run.paused_until)) * run.rate)
        run.paused_until = end
        run.samples -= lost
        self.lost_samples += lost
        if self.measure is not None:
            self._pending.append(PauseSample(now, run.job.id, kind,
                                             seconds * self.measure.factor(run.job.id, now, kind)))
        return end

    def _close_window(self, run: _Run, now: float) -> None:
        """The size changes: what was measured since the last full window is a shorter sample."""
        m = self.measure
        if m is None or run.rate <= 0:
            return
        for smp in self._due(run.job.id, run, now):
            self._pending.append(smp)
        length = now - run.measure_from
        if length >= m.min_s:
            self._pending.append(RateSample(now, run.job.id, run.nodes,
                                            run.rate * m.factor(run.job.id, now, "rate", length), length))

    def _due(self, jid: str, run: _Run, now: float) -> list:
        """Samples due by `now`: a short first one at a new size (as soon as a profiler would
        have a rough figure), then one per full window."""
        m = self.measure
        out = []
        if m is None or run.rate <= 0:
            return out
        while True:
            w = m.min_s if run.fresh else m.every_s
            if run.measure_from + w > now + 1e-9:
                return out
            run.measure_from += w
            run.fresh = False
            out.append(RateSample(run.measure_from, jid, run.nodes,
                                  run.rate * m.factor(jid, run.measure_from, "rate", w), w))

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
        resumes = now
        self._close_window(run, now)
        if run.nodes > 0 and run.rate > 0:
            self.rescales += 1
            up = n > run.nodes
            resumes = self._charge(run, job.scale_up_seconds if up else job.scale_down_seconds,
                                   "up" if up else "down", now)
        run.nodes = n
        run.rate = true_rate(job, n)
        run.measure_from, run.fresh = resumes, True

    def vacate(self, job: Job, lost: Sequence[str], now: float) -> None:
        run = self._run(job, now)
        if not lost:
            return
        self.preemptions += len(lost)
        self._close_window(run, now)
        resumes = self._charge(run, job.scale_down_seconds, "down", now)
        run.nodes = max(0, run.nodes - len(lost))
        run.rate = true_rate(job, run.nodes)
        run.measure_from, run.fresh = resumes, True

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
        if self.measure is not None:
            every = self.measure.every_s
            times += [r.measure_from + (self.measure.min_s if r.fresh else every)
                      for r in self._runs.values() if r.rate > 0]
        return min(times) if times else None

    def samples(self, now: float) -> list:
        """Throughput samples due by `now` (one per `every_s` at one size) and pauses since the
        last call."""
        out, self._pending = self._pending, []
        for jid, run in self._runs.items():
            out += self._due(jid, run, now)
        return out

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
