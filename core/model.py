"""Domain records shared by every part of the engine: nodes, jobs, allocations, events.

Plain dataclasses on purpose: policies are pure functions of these records, mechanisms
(dispatchers, sources, the store) move them around.
"""
from __future__ import annotations

import enum
import functools
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Optional

import numpy as np


#: how a job's command is run: our elastic runtime (regroups in place) or torchrun's contract
#: (an unmodified script, restarted from its checkpoint on every change of its nodes)
LAUNCHER_RUNTIME, LAUNCHER_TORCHRUN = "runtime", "torchrun"
LAUNCHERS = (LAUNCHER_RUNTIME, LAUNCHER_TORCHRUN)
#: a restart-based job's progress: group 1 of the last matching line of rank 0's output
DEFAULT_PROGRESS_PATTERN = r"samples=(\d+)"
#: what a restart is assumed to cost before one was measured (seconds, up and down)
RESTART_COST_PRIOR_S = 30.0


class JobState(str, enum.Enum):
    QUEUED = "queued"        # registered, waiting for one of the max_jobs slots
    RUNNING = "running"      # holds a slot; may hold 0 nodes while none are worth giving it
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


class NodeState(str, enum.Enum):
    IDLE = "idle"            # offered by the node source (the main scheduler does not use it)
    BUSY = "busy"            # taken back by the main scheduler


class EventKind(str, enum.Enum):
    NODE_JOIN = "node_join"
    NODE_LEAVE = "node_leave"
    JOB_SUBMIT = "job_submit"
    JOB_CANCEL = "job_cancel"
    JOB_DONE = "job_done"
    JOB_FAILED = "job_failed"
    TICK = "tick"
    PROBE = "probe"          # the advisor tries a size it has no sample at (logged, not handled)
    JOB_REQUEUE = "job_requeue"  # a job with no node gave its running slot back (logged, not handled)
    HARVESTER_START = "harvester_start"      # a new run on this store (logged, not handled)
    HARVESTER_CRASH = "harvester_crash"      # found at a restart: the last run did not stop cleanly
    HARVESTER_RESTART = "harvester_restart"  # the run on this store taken up again
    WORKERS_ADOPTED = "workers_adopted"      # a restart found a job's workers training on (logged)
    JOB_TROUBLE = "job_trouble"              # a job's workers hit a problem that has not failed it (logged)
    JOB_RESCALED = "job_rescaled"            # a job's workers regrouped at a new size, and how long it took (logged)


#: why a node left (Event.cause): it failed (its workers were lost for a reason of the node; not the
#: main scheduler's doing), its owner took it back by hand, or its batch scheduler preempted the harvester
LEFT_LOST, LEFT_RECLAIMED, LEFT_PREEMPTED = "lost", "reclaimed", "preempted"

#: order in which the controller handles events of one batch: a leave is always first.
EVENT_PRIORITY = {
    EventKind.NODE_LEAVE: 0,
    EventKind.JOB_FAILED: 1,
    EventKind.JOB_DONE: 2,
    EventKind.JOB_CANCEL: 3,
    EventKind.NODE_JOIN: 4,
    EventKind.JOB_SUBMIT: 5,
    EventKind.TICK: 6,
    EventKind.PROBE: 7,
    EventKind.JOB_REQUEUE: 8,
    EventKind.HARVESTER_START: 9,
    EventKind.HARVESTER_CRASH: 9,
    EventKind.HARVESTER_RESTART: 9,
    EventKind.WORKERS_ADOPTED: 9,
    EventKind.JOB_TROUBLE: 9,
    EventKind.JOB_RESCALED: 9,
}
#: kinds the controller only logs: they change no plan
LOGGED_ONLY = frozenset({EventKind.PROBE, EventKind.JOB_REQUEUE, EventKind.HARVESTER_START, EventKind.HARVESTER_CRASH,
                         EventKind.HARVESTER_RESTART, EventKind.WORKERS_ADOPTED, EventKind.JOB_TROUBLE,
                         EventKind.JOB_RESCALED})


@dataclass(frozen=True)
class Curve:
    """Throughput (samples/s) against node count: piecewise linear through (0, 0) and the
    points, flat after the last point. Validation lives in core.schemas; this is the math."""

    nodes: tuple[int, ...]
    samples_per_second: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.samples_per_second) or not self.nodes:
            raise ValueError("curve needs as many throughputs as node counts, at least one")
        if any(n <= 0 for n in self.nodes) or any(b <= a for a, b in zip(self.nodes, self.nodes[1:])):
            raise ValueError("curve node counts must be positive and strictly increasing")
        if any(s < 0 for s in self.samples_per_second):
            raise ValueError("curve throughputs must be non-negative")

    def __call__(self, n: float) -> float:
        if n <= 0:
            return 0.0
        xs, ys = self.nodes, self.samples_per_second
        if n >= xs[-1]:
            return float(ys[-1])
        i = bisect_right(xs, n)
        x0, y0 = (0, 0.0) if i == 0 else (xs[i - 1], ys[i - 1])
        x1, y1 = xs[i], ys[i]
        return float(y0 + (y1 - y0) * (n - x0) / (x1 - x0))

    def rates(self, n: "np.ndarray") -> "np.ndarray":
        """S at many sizes at once (np.interp is flat past the last point, as the curve is)."""
        return np.interp(n, (0, *self.nodes), (0.0, *self.samples_per_second))

    def to_dict(self) -> dict:
        return {"nodes": list(self.nodes), "samples_per_second": list(self.samples_per_second)}

    @classmethod
    def from_dict(cls, d: dict) -> "Curve":
        return cls(tuple(int(n) for n in d["nodes"]), tuple(float(s) for s in d["samples_per_second"]))


@dataclass
class Job:
    """A malleable training job as the controller tracks it."""

    id: str
    min_nodes: int
    max_nodes: int
    total_samples: float
    curve: Curve                      # what the allocator believes (user-given or learned)
    scale_up_seconds: float = 18.0
    scale_down_seconds: float = 12.0
    priority: float = 1.0
    submit_time: float = 0.0
    name: str = ""
    owner: str = ""
    state: JobState = JobState.QUEUED
    samples_done: float = 0.0
    start_time: Optional[float] = None
    end_time: Optional[float] = None
    true_curve: Optional[Curve] = None  # simulation only: how the job really scales
    command: tuple[str, ...] = ()       # real workers: the training script's argv on each node
    global_batch: int = 0               # real workers: samples per step, whatever the world size
    given_curve: Optional[Curve] = None  # the user's curve as given (None: learn it from scratch)
    launcher: str = LAUNCHER_RUNTIME    # real workers: see LAUNCHERS
    progress_pattern: str = DEFAULT_PROGRESS_PATTERN   # torchrun jobs: where progress is read
    stop_grace_seconds: float = 30.0    # torchrun jobs: SIGTERM -> SIGKILL, time to checkpoint
    samples_per_step: float = 0.0       # torchrun jobs: > 0: the progress pattern counts steps of this many samples
    run_as: str = ""                    # real workers: the owner's Unix account ('': the harvester's own)
    failure: Optional[dict] = None      # why it failed (core.failures.Failure as a dict), kept after its end
    story: Optional[dict] = None        # real workers: its losses, generations and last metrics, kept after its end
    resubmitted_from: str = ""          # the failed or cancelled job it continues (from its checkpoint), if any
    requeues: int = 0                   # times a failure of its nodes only sent it back to the queue (core.requeue)

    def __post_init__(self) -> None:
        if self.min_nodes < 1 or self.max_nodes < self.min_nodes:
            raise ValueError(f"job {self.id}: need 1 <= min_nodes <= max_nodes")
        if self.total_samples <= 0:
            raise ValueError(f"job {self.id}: total_samples must be positive")


@dataclass(frozen=True)
class Event:
    time: float
    kind: EventKind
    node: Optional[str] = None
    job: Optional[str] = None
    detail: str = ""
    failure: Optional[dict] = None      # JOB_FAILED / JOB_TROUBLE: the named reason (core.failures)
    cause: str = ""                     # NODE_LEAVE: LEFT_LOST, LEFT_RECLAIMED or LEFT_PREEMPTED ('' = preempted)


@dataclass(frozen=True)
class RateSample:
    """Throughput measured while a job ran at `nodes` (samples/s) over the `seconds` before
    `time`: what the profiler learns from (a longer window is a surer sample)."""

    time: float
    job: str
    nodes: int
    rate: float
    seconds: float = 30.0


@dataclass(frozen=True)
class PauseSample:
    """Seconds of training lost in one rescale (`kind` "up" = grow, "down" = shrink)."""

    time: float
    job: str
    kind: str
    seconds: float


@dataclass(frozen=True)
class Node:
    """One node as the controller sees it: offered or not, and which job holds it."""

    name: str
    state: NodeState
    since: Optional[float] = None      # when it last changed state
    job: Optional[str] = None          # holder, only ever set on an idle node

    @property
    def rack(self) -> str:
        return rack_of(self.name)


@dataclass
class Allocation:
    """The nodes each job holds after a decision, with what changed."""

    time: float
    assignment: dict[str, list[str]]
    changes: dict[str, tuple[int, int]] = field(default_factory=dict)  # job -> (from, to)


_RACK = re.compile(r"^([A-Za-z]+\d+)n\d+$")


def rack_of(node: str) -> str:
    """Summit-style rack of a node name (`a02n07` -> `a02`); other names are their own rack."""
    m = _RACK.match(node)
    return m.group(1) if m else node


_DIGITS = re.compile(r"(\d+)")


@functools.lru_cache(maxsize=1 << 16)
def node_order(node: str) -> tuple:
    """The machine's order of node names, numbers compared as numbers (`n2` before `n10`), the
    order batch schedulers list and pick nodes in. Cached: placement sorts by it on every solve."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in _DIGITS.split(node) if p)
