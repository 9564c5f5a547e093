"""The Slurm commands the harvester runs, as typed calls: `sinfo` and `squeue` in their stable
text formats to read the cluster (core/slurm/parse.py says why and reads them), `sbatch` and
`scancel` to act. Every call has a timeout; a controller that cannot be asked raises
SlurmUnavailable, and output that cannot be read raises SlurmUnreadable naming Slurm's version.

Job ids can come from a pilot's hello, which is input from the network: every id is checked
here as well (`JOB_ID`) before it reaches a command line, so that no value can ever be read by
scancel or squeue as an option (`--me` would cancel every job of the harvester's user).
"""
from __future__ import annotations

import re
from typing import Mapping, Optional, Sequence

from ..pilots.base import BadJobId, SchedulerUnavailable, SchedulerUnreadable
from ..pilots.commands import Commands
from .parse import (SINFO_FORMAT, SQUEUE_FORMAT, SlurmVersion, Unreadable, check_version, parse_jobs,
                    parse_nodes, parse_version)
from .records import SlurmJob, SlurmNode, gpu_count

__all__ = ["BadJobId", "SlurmCli", "SlurmJob", "SlurmNode", "SlurmUnavailable", "SlurmUnreadable",
           "check_job_ids", "gpu_count", "valid_job_id"]

#: a Slurm job id: digits, or `<array job>_<task>` digits for an array task (scancel takes both;
#: a pilot's own SLURM_JOB_ID is always plain digits). Nothing else, so never an option.
JOB_ID = re.compile(r"[0-9]{1,18}(?:_[0-9]{1,18})?")
#: a job name or user name as a filter value: one item (no comma, no blank), never an option
FILTER_VALUE = re.compile(r"[^\s,-][^\s,]{0,255}")


def valid_job_id(job: object) -> bool:
    return isinstance(job, str) and JOB_ID.fullmatch(job) is not None


def check_job_ids(jobs: Sequence[str]) -> list[str]:
    """The ids, if every one is a Slurm job id; BadJobId otherwise."""
    bad = [j for j in jobs if not valid_job_id(j)]
    if bad:
        raise BadJobId(f"not a Slurm job id: {', '.join(repr(j)[:40] for j in bad[:5])}")
    return list(jobs)


class SlurmUnavailable(SchedulerUnavailable):
    """slurmctld could not be asked: not running, unreachable, too slow, or it refused."""


class SlurmUnreadable(SlurmUnavailable, SchedulerUnreadable):
    """Slurm answered with something this harvester cannot read (a version older than it
    supports, or output it does not parse); the message names the version."""


class SlurmCli(Commands):
    """`conf`: the slurm.conf to use (SLURM_CONF), else the site default; `bin_dir`: the folder
    of Slurm's commands, else PATH."""

    unavailable = SlurmUnavailable
    unreadable = SlurmUnreadable
    title = "Slurm"

    def __init__(self, conf: str = "", timeout_s: float = 5.0, bin_dir: str = "") -> None:
        super().__init__({"SLURM_CONF": conf} if conf else {}, timeout_s, bin_dir)
        self._version: Optional[SlurmVersion] = None

    def version(self) -> SlurmVersion:
        """Slurm's version (`sinfo --version`, asked once); SlurmUnreadable if older than supported."""
        if self._version is None:
            out = self._run(["sinfo", "--version"])
            try:
                v = parse_version(out)
                check_version(v)
            except Unreadable as e:
                raise SlurmUnreadable(str(e)) from None
            self._version = v
        return self._version

    def nodes(self) -> list[SlurmNode]:
        """Every node in a partition (hidden ones included), in Slurm's own order."""
        return self._read("nodes", parse_nodes, ["sinfo", "--all", "--Node", "--noheader",
                                                 f"--Format={SINFO_FORMAT}"])

    def jobs(self, name: str = "", user: str = "") -> list[SlurmJob]:
        """Jobs slurmctld knows (ended ones included for MinJobAge), optionally only those with
        this name and user."""
        for what, value in (("job name", name), ("user name", user)):
            if value and not FILTER_VALUE.fullmatch(value):
                raise ValueError(f"not a Slurm {what}: {value!r}")
        argv = (["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"]
                + ([f"--name={name}"] if name else []) + ([f"--user={user}"] if user else []))
        return [j for j in self._read("jobs", parse_jobs, argv)
                if (not name or j.name == name) and (not user or j.user == user)]

    def submit(self, options: Sequence[str], script: str, env: Mapping[str, str]) -> str:
        """sbatch the script (given on stdin) with these options; `env` is added to the job's
        environment (sbatch exports its own). Returns the job id."""
        out = self._run(["sbatch", "--parsable", *options], stdin=script, env=env)
        job = out.strip().split(";")[0]
        if not job.isdigit():
            raise SlurmUnavailable(f"sbatch printed {out.strip()!r}, not a job id")
        return job

    def cancel(self, jobs: Sequence[str]) -> None:
        """scancel these jobs; BadJobId (and nothing cancelled) if any is not a job id."""
        if jobs:
            self._run(["scancel", "--", *check_job_ids(jobs)])

    def hostnames(self, hostlist: str) -> list[str]:
        """Expand a hostlist expression (`node[1-4,7]`) the way Slurm does."""
        if not hostlist or hostlist.startswith("-"):
            raise ValueError(f"not a hostlist: {hostlist!r}")
        return self._run(["scontrol", "show", "hostnames", hostlist]).split()
