"""What the pilot machinery needs from a batch scheduler, and nothing more: the one interface
each scheduler's provider implements (core/slurm/provider.py, core/pbs/provider.py), the node
and job records it reads, and the errors it raises. Everything else (the book of pilots,
back-off, the hub, adoption after a restart, the workers' transport) is the same for every
scheduler and lives beside this file, so another scheduler (LSF, Flux) is one more provider."""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Mapping, Optional, Protocol, Sequence

from . import script
from .settings import PilotSettings

#: a batch job id as a pilot may give it in its hello: Slurm's `123` or `123_4`, PBS's `123.server`
#: or `123[4].server`. Never an option, never blank; each provider checks its own form again
#: before an id reaches a command line.
JOB_ID = re.compile(r"[0-9]{1,18}(?:_[0-9]{1,18}|\[[0-9]{0,18}\])?(?:\.[A-Za-z0-9][A-Za-z0-9.-]{0,253})?")


def batch_job_id(job: object) -> bool:
    """Whether `job` has the form of some supported scheduler's job id."""
    return isinstance(job, str) and JOB_ID.fullmatch(job) is not None


class SchedulerUnavailable(RuntimeError):
    """The scheduler could not be asked: not running, unreachable, too slow, or it refused."""


class SchedulerUnreadable(SchedulerUnavailable):
    """The scheduler answered with something this harvester cannot read; the message names its version."""


class Unparsable(ValueError):
    """A scheduler printed something its provider's parser cannot read (the line, or what was wrong)."""


class BadJobId(ValueError):
    """A value that is not a job id of this scheduler where one was expected; nothing was run."""


class BatchNode(Protocol):
    """A node as the scheduler describes it (SlurmNode, PbsNode)."""
    name: str
    address: str

    @property
    def free(self) -> bool: ...           # idle, nothing pending on it: it may get a pilot

    @property
    def unreachable(self) -> bool: ...    # down or not responding: not a node to train on

    @property
    def runs_a_job(self) -> bool: ...     # some job (a main job) runs there now

    @property
    def gpus(self) -> int: ...

    @property
    def label(self) -> str: ...           # its state in the scheduler's own words


class BatchJob(Protocol):
    """A pilot job as the scheduler describes it (SlurmJob, PbsJob)."""
    id: str
    reason: str

    @property
    def node(self) -> str: ...            # the node it runs on ('' while it waits)

    @property
    def state(self) -> str: ...           # in the scheduler's words, for messages

    @property
    def running(self) -> bool: ...

    @property
    def ended(self) -> bool: ...          # it holds nothing any more

    @property
    def suspended(self) -> bool: ...      # stopped by the scheduler for a main job (preemption by suspension)

    @property
    def failed(self) -> bool: ...         # it ended through its own fault or its node's

    @property
    def not_its_fault(self) -> bool: ...  # preempted, cancelled, out of time: no failure of its node


class Scheduler(ABC):
    """One batch scheduler, as the pilot source uses it. Every call has a timeout and raises
    SchedulerUnavailable when the scheduler cannot be asked."""
    name: str = ""              # the source's name: "slurm", "pbs"
    title: str = ""             # for people: "Slurm", "PBS"
    queue_word: str = "queue"   # what pilots are submitted to: "partition", "queue"
    #: the scheduler puts a preempted pilot back in its queue (PBS's requeue): the harvester
    #: deletes it once it has left, so that it never comes back onto the node a main job took
    requeues_preempted: bool = False

    def __init__(self, settings: PilotSettings) -> None:
        self.settings = settings

    @abstractmethod
    def version(self) -> str:
        """The scheduler's version; SchedulerUnreadable if this harvester cannot read it."""

    @abstractmethod
    def nodes(self) -> list[BatchNode]:
        """Every node the scheduler knows, in its own order."""

    @abstractmethod
    def jobs(self, name: str, user: str) -> list[BatchJob]:
        """The live (and recently ended) jobs of this name and user: the pilots."""

    @abstractmethod
    def submit(self, node: str, known: Optional[BatchNode], script: str, env: Mapping[str, str]) -> str:
        """Submit a pilot pinned to `node` running `script`, with `env` added; its job id."""

    @abstractmethod
    def cancel(self, jobs: Sequence[str]) -> None:
        """Cancel these pilots; BadJobId (and nothing cancelled) if any is not a job id."""

    def cancel_suspended(self, jobs: Sequence[str]) -> None:
        """Cancel pilots the scheduler suspended for a main job (they cannot leave by themselves)."""
        self.cancel(jobs)

    def log_path(self, job: str) -> str:
        """Where this pilot's output goes (`settings.log_dir`), read for its last words when it failed."""
        return script.log_path(self.settings, job)

    @abstractmethod
    def watch(self, nodes: list[BatchNode]) -> list[str]:
        """The nodes to harvest (`settings.watch` checked against `nodes`); SettingError naming it."""
