"""What the controller asks of whatever runs the jobs: one interface, one module per backend
(simulated for replay and demos; local processes and SSH come with the worker runtime)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional, Sequence

from ..model import Event, Job


class Dispatcher(ABC):
    name: str = ""

    @abstractmethod
    def resize(self, job: Job, nodes: Sequence[str], now: float) -> None:
        """Run `job` on exactly `nodes` from now on (start when it had none, stop at none)."""

    def resume(self, job: Job, nodes: Sequence[str], now: float) -> None:
        """After a harvester restart: `job` ran on `nodes` when the last run stopped. A
        dispatcher whose workers outlive the harvester adopts them; the rest start it again."""
        self.resize(job, nodes, now)

    @abstractmethod
    def vacate(self, job: Job, lost: Sequence[str], now: float) -> None:
        """The main scheduler took `lost` back: get off them at once, before any re-plan."""

    @abstractmethod
    def stop(self, job: Job, now: float) -> None:
        """The job ends (done, cancelled, failed): release everything it holds."""

    @abstractmethod
    def progress(self, job: Job, now: float) -> float:
        """Samples the job has processed so far (net of any lost progress)."""

    @abstractmethod
    def rate(self, job: Job) -> float:
        """Samples/s the job runs at right now."""

    @abstractmethod
    def poll(self, now: float) -> list[Event]:
        """Jobs that finished or failed since the last poll."""

    def samples(self, now: float) -> list:
        """RateSample / PauseSample measurements since the last call (for the profiler)."""
        return []

    def next_event_time(self, now: float) -> Optional[float]:
        """When the dispatcher will next have something to report (simulation only)."""
        return None

    def host_of(self, node: str) -> Optional[str]:
        """The host `node`'s workers run on, as this host names it (None: not known or no workers)."""
        return None

    #: whether the job's workers report progress over HTTP (`accept_report`)
    takes_reports = False
    #: whether it holds nodes out after faults of their own, which staff may clear (`clear_node`)
    holds_nodes_out = False

    def node_states(self) -> dict[str, str]:
        """Nodes it holds out for reasons of their own, and why (for the grid and /api/cluster)."""
        return {}

    def clear_node(self, node: str) -> bool:
        """Staff vouch for a node it holds out: offered again. Whether it was held out."""
        return False

    def carry_over(self, old: Job, new: Job) -> float:
        """Before `new`, a resubmission of the ended job `old`, is registered: make what `old`
        left to resume from `new`'s (real workers: a copy of its checkpoint folder, carryover.py),
        and say at how many samples `new` starts. OSError when that cannot be done. Simulated
        workers keep no checkpoint: `new` starts where `old` stopped."""
        return min(old.samples_done, new.total_samples)

    def forget_carried(self, new: Job) -> None:
        """Undo `carry_over` for a `new` whose registration was refused after it."""

    def status(self, job_id: str) -> Optional[dict]:
        """What the job's workers say of themselves (generation, members, ...), if they are real."""
        return None

    def logs(self, job_id: str, lines: int = 40) -> dict[str, list[str]]:
        """The last `lines` of each running worker's log, rank 0's first ({}: none)."""
        return {}

    def accept_report(self, job_id: str, authorization: Optional[str], body: bytes) -> int:
        """A progress report from a job's workers: an HTTP status (204 taken, 401, 400, 404)."""
        return 404

    def begin_life(self, life: int) -> None:
        """The harvester's start number on this store (1, 2, ...): files it names per start (worker
        logs) carry it, so a restart never overwrites what an earlier start wrote."""

    def close(self) -> None:
        """Stop everything still running (the harvester shuts down)."""
