"""What the harvester's pilots did since it started, as counters a site's Prometheus scrapes:
how hard it leans on slurmctld (pilots sent and cancelled), how often main jobs took a node back,
and how fast it got off a node once Slurm said so."""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

#: pilot outcomes counted: sent with sbatch, cancelled by the harvester, preempted (the pilot
#: said Slurm signalled it), lost (its connection ended without a word)
OUTCOMES = ("submitted", "cancelled", "preempted", "lost")
#: vacate histogram bounds (seconds): fine below a second, where the goal is
VACATE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                    1.0, 2.0, 5.0, 10.0)


@dataclass
class PilotStats:
    """Counters only ever grow; `connections` is the hub's count now and `peak_connections` its
    most since the start. `vacate` counts, per bucket, the seconds from the pilot's signal (its
    own clock, the same host's or an NTP-synced one) to its connection's end: the harvester's
    part of giving a node back, its workers stopped."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    connections: int = 0
    peak_connections: int = 0
    vacate_buckets: list[int] = field(default_factory=lambda: [0] * (len(VACATE_BUCKETS_S) + 1))
    vacate_sum_s: float = 0.0
    vacate_count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, outcome: str, n: int = 1) -> None:
        if outcome not in self.counts:
            raise KeyError(outcome)
        with self._lock:
            self.counts[outcome] += n

    def connected(self, delta: int) -> None:
        with self._lock:
            self.connections += delta
            self.peak_connections = max(self.peak_connections, self.connections)

    def vacated(self, seconds: float) -> None:
        seconds = max(0.0, seconds)          # clocks a few microseconds apart
        with self._lock:
            self.vacate_buckets[bisect.bisect_left(VACATE_BUCKETS_S, seconds)] += 1
            self.vacate_sum_s += seconds
            self.vacate_count += 1

    def snapshot(self) -> dict:
        """A consistent copy for a scrape: counts, connections now and at peak, and the vacate
        histogram as cumulative (upper bound, count) pairs ending with +Inf."""
        with self._lock:
            cumulative, total = [], 0
            for bound, n in zip((*VACATE_BUCKETS_S, float("inf")), self.vacate_buckets):
                total += n
                cumulative.append((bound, total))
            return {"counts": dict(self.counts), "connections": self.connections,
                    "peak_connections": self.peak_connections, "vacate_buckets": cumulative,
                    "vacate_sum_s": self.vacate_sum_s, "vacate_count": self.vacate_count}
