"""What the harvester knows of a PBS vnode and a PBS job: plain records (core/pbs/parse.py
reads them from `pbsnodes -av -F json` and `qstat -f -F json`)."""
from __future__ import annotations

from dataclasses import dataclass

#: vnode states (PBS joins several with ',') under which PBS cannot reach the node's MoM
UNREACHABLE = frozenset({"down", "state-unknown", "unresolvable", "stale"})
#: vnode states under which some job holds the node
BUSY = frozenset({"job-busy", "job-exclusive", "resv-exclusive", "busy"})
#: job states: R running, E exiting, F finished, X ended (array subjob), S suspended, Q queued,
#: H held, W waiting, T moving, B array begun, M moved, U user-busy suspended
#: ended: finished, or moved away. Not E (exiting): PBS may still requeue an exiting job.
ENDED = frozenset({"F", "X", "M"})


@dataclass(frozen=True)
class PbsNode:
    name: str                        # the vnode's name: what `-l select=1:vnode=NAME` asks for
    states: tuple[str, ...]          # as PBS lists them: ('free',), ('down', 'offline'), ...
    jobs: tuple[str, ...] = ()       # job ids on it (PBS lists each job once per cpu it holds)
    ncpus: int = 0                   # resources_available.ncpus: 0 takes no job (a host's natural vnode)
    ngpus: int = 0                   # resources_available.ngpus
    address: str = ""                # its MoM's host: where its processes are reached
    queue: str = ""                  # the queue it is tied to ('' : any)

    @property
    def gpus(self) -> int:
        return self.ngpus

    @property
    def free(self) -> bool:
        """Free, nothing on it, and able to take a job: only such a vnode may get a pilot."""
        return self.states == ("free",) and not self.jobs and self.ncpus > 0

    @property
    def unreachable(self) -> bool:
        return bool(UNREACHABLE.intersection(self.states))

    @property
    def runs_a_job(self) -> bool:
        return bool(self.jobs) or bool(BUSY.intersection(self.states))

    @property
    def label(self) -> str:
        return ",".join(self.states)


@dataclass(frozen=True)
class PbsJob:
    id: str                          # `123.server` or `123[4].server`
    name: str
    job_state: str                   # one letter: R, Q, E, F, S, H, ...
    vnode: str                       # the (first) vnode it runs on ('' while queued)
    queue: str
    user: str                        # Job_Owner without its @host
    reason: str = ""                 # PBS's comment
    run_count: int = 0               # times it started: above 0 and queued again means requeued
    exit_status: int | None = None   # for an ended job, where PBS says

    @property
    def node(self) -> str:
        return self.vnode

    @property
    def state(self) -> str:
        return {"R": "RUNNING", "Q": "QUEUED", "E": "EXITING", "F": "FINISHED", "X": "FINISHED",
                "S": "SUSPENDED", "H": "HELD", "W": "WAITING", "M": "MOVED"}.get(self.job_state, self.job_state)

    @property
    def running(self) -> bool:
        return self.job_state == "R"

    @property
    def ended(self) -> bool:
        return self.job_state in ENDED

    @property
    def suspended(self) -> bool:
        return self.job_state in ("S", "U")

    @property
    def failed(self) -> bool:
        """Ended with an exit status of its own (0 < status < 256: not a signal, not PBS's own
        negative codes for a node that failed it, a requeue or a deletion)."""
        return self.ended and self.exit_status is not None and 0 < self.exit_status < 256

    @property
    def not_its_fault(self) -> bool:
        """Ended by a signal (PBS's 256 + signal: preempted, deleted, out of walltime)."""
        return self.ended and self.exit_status is not None and self.exit_status >= 256
