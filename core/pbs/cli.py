"""The PBS commands the harvester runs, as typed calls: `pbsnodes -av -F json` and `qselect` +
`qstat -f -F json` to read the cluster (pbsnodes and qselect are cheap; qstat carries a fixed
~200 ms, so it is asked only for our own pilots' ids), `qsub` and `qdel` to act. Every call
has a timeout; a server that cannot be asked raises PbsUnavailable, output that cannot be read
PbsUnreadable naming PBS's version. Job ids can come from a pilot's hello (input from the
network): every id is checked (`JOB_ID`) before it reaches a command line."""
from __future__ import annotations

import re
from typing import Mapping, Optional, Sequence

from ..pilots.base import BadJobId, SchedulerUnavailable, SchedulerUnreadable
from ..pilots.commands import Commands
from .parse import Unreadable, parse_jobs, parse_nodes, parse_version
from .records import PbsJob, PbsNode

#: a PBS job id: `123.server` or an array's `123[4].server`; never an option, never blank
JOB_ID = re.compile(r"[0-9]{1,18}(?:\[[0-9]{0,18}\])?\.[A-Za-z0-9][A-Za-z0-9.-]{0,253}")
#: a job name or user name as a filter value: one item, never an option
FILTER_VALUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,235}")
#: qdel's answers for a job that is over already or on its way out: nothing left to delete
GONE = ("Unknown Job Id", "Job has finished", "Request invalid for state of job")


class PbsUnavailable(SchedulerUnavailable):
    """The PBS server could not be asked: not running, unreachable, too slow, or it refused."""


class PbsUnreadable(PbsUnavailable, SchedulerUnreadable):
    """PBS answered with something this harvester cannot read; the message names the version."""


def valid_job_id(job: object) -> bool:
    return isinstance(job, str) and JOB_ID.fullmatch(job) is not None


def check_job_ids(jobs: Sequence[str]) -> list[str]:
    bad = [j for j in jobs if not valid_job_id(j)]
    if bad:
        raise BadJobId(f"not a PBS job id: {', '.join(repr(j)[:40] for j in bad[:5])}")
    return list(jobs)


class PbsCli(Commands):
    """`conf`: the pbs.conf to use (PBS_CONF_FILE), else the site default; `bin_dir`: the folder
    of PBS's commands, else PATH."""

    unavailable = PbsUnavailable
    unreadable = PbsUnreadable
    title = "PBS"

    def __init__(self, conf: str = "", timeout_s: float = 5.0, bin_dir: str = "") -> None:
        super().__init__({"PBS_CONF_FILE": conf} if conf else {}, timeout_s, bin_dir)
        self._version: Optional[str] = None

    def version(self) -> str:
        """PBS's version (`qstat --version`, asked once)."""
        if self._version is None:
            try:
                self._version = parse_version(self._run(["qstat", "--version"]))
            except Unreadable as e:
                raise PbsUnreadable(str(e)) from None
        return self._version

    def nodes(self) -> list[PbsNode]:
        """Every vnode, in PBS's order."""
        return self._read("nodes", parse_nodes, ["pbsnodes", "-av", "-F", "json"])

    def jobs(self, name: str, user: str, queue: str) -> list[PbsJob]:
        """The live jobs of this name and user in `queue`: qselect finds whether there are any
        (8 ms), then one `qstat -f -F json QUEUE` reads them (given several job ids, 23.06's
        qstat prints only the first in JSON; one call per id would cost ~200 ms each)."""
        for what, value in (("job name", name), ("user name", user), ("queue", queue)):
            if not FILTER_VALUE.fullmatch(value):
                raise ValueError(f"not a PBS {what}: {value!r}")
        if not [i for i in self._run(["qselect", "-N", name, "-u", user, "-q", queue]).split() if valid_job_id(i)]:
            return []
        jobs = self._read("jobs", parse_jobs, ["qstat", "-f", "-F", "json", queue])
        return [j for j in jobs if j.name == name and j.user == user]

    def submit(self, options: Sequence[str], argv: Sequence[str], env: Mapping[str, str]) -> str:
        """qsub the program `argv` with these options; `env` goes to the job (`-v`). The job id."""
        for k, v in env.items():
            if any(c in v for c in ",'\"\n"):
                raise ValueError(f"{k}: a value for qsub -v cannot hold commas, quotes or newlines")
        out = self._run(["qsub", *options, "-v", ",".join(f"{k}={v}" for k, v in env.items()), "--", *argv])
        job = out.strip()
        if not valid_job_id(job):
            raise PbsUnavailable(f"qsub printed {job[:100]!r}, not a job id")
        return job

    def cancel(self, jobs: Sequence[str], force: bool = False) -> None:
        """qdel these jobs (`-W force` with `force`); BadJobId (and nothing deleted) if any is not
        a job id. A job that is over already is no error."""
        if not jobs:
            return
        r = self._call(["qdel", *(["-W", "force"] if force else []), *check_job_ids(jobs)])
        errors = [ln for ln in r.stderr.strip().splitlines() if ln.strip() and not any(g in ln for g in GONE)]
        if r.returncode != 0 and errors:
            raise PbsUnavailable(f"qdel: {errors[-1]}")

    def queues(self) -> list[str]:
        """The server's queues (`qstat -Q`), to check the pilots' queue at start."""
        lines = self._run(["qstat", "-Q"]).splitlines()
        return [ln.split()[0] for ln in lines[2:] if ln.split()]
