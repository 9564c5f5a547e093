"""The Slurm commands the harvester runs, as typed calls: `sinfo --json` and `squeue --json` to
read the cluster, `sbatch` and `scancel` to act. Every call has a timeout; a controller that
cannot be asked raises SlurmUnavailable.

Slurm 22.05 quirks handled here: with --json, sinfo and squeue ignore their filter options
(everything comes back, finished jobs included, and we filter), and when slurmctld is down
they still exit 0 after ~9 s of retries, with the failure in the JSON's `errors`.

Job ids can come from a pilot's hello, which is input from the network: every id is checked
here as well (`JOB_ID`) before it reaches a command line, so that no value can ever be read by
scancel or squeue as an option (`--me` would cancel every job of the harvester's user).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

#: a node in one of these conditions is not free for a pilot even when its state says idle
NOT_FREE_FLAGS = frozenset({"drain", "draining", "drained", "completing", "planned", "not_responding",
                            "reserved", "maintenance", "powered_down", "powering_down", "powering_up",
                            "power_down", "reboot_requested", "reboot_issued", "fail", "invalid_reg",
                            "no_respond", "down"})
#: job states after which a job holds nothing (squeue shows them for MinJobAge seconds)
ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
                   "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"})
#: a Slurm job id: digits, or `<array job>_<task>` digits for an array task (scancel takes both;
#: a pilot's own SLURM_JOB_ID is always plain digits). Nothing else, so never an option.
JOB_ID = re.compile(r"[0-9]{1,18}(?:_[0-9]{1,18})?")
#: a job name or user name as a filter value: one item (no comma, no blank), never an option
FILTER_VALUE = re.compile(r"[^\s,-][^\s,]{0,255}")


#: one GRES of a node's `gres`: name, optional type, optional count, optional `(S:0-1)`-style suffix
GRES_ITEM = re.compile(r"(?P<name>[^:()]+)(?::(?P<type>[^:()]+))??(?::(?P<count>[0-9]+))?(?:\(.*\))?")


def gpu_count(gres: str) -> int:
    """How many GPUs a node's GRES string declares: `gpu:4` -> 4, `gpu:a100:4(S:0-1)` -> 4,
    `gpu:a100:2,gpu:v100:2` -> 4, `gpu` -> 1 (Slurm's default count), `(null)`, '' or
    `nic:1` -> 0. Items are split at commas outside parentheses (a socket list `(S:0,2)` is
    one item); an item Slurm would not print (`gpu:x:y:z`) counts nothing."""
    total = 0
    for item in _split_outside_parens(gres):
        m = GRES_ITEM.fullmatch(item.strip())
        if m is not None and m["name"] == "gpu":
            total += int(m["count"]) if m["count"] is not None else 1
    return total


def _split_outside_parens(text: str) -> list[str]:
    items, cur, depth = [], "", 0
    for c in text:
        depth += (c == "(") - (c == ")")
        if c == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += c
    return [i for i in items + [cur] if i.strip()]


class BadJobId(ValueError):
    """A value that is not a Slurm job id where one was expected; nothing was run."""


def valid_job_id(job: object) -> bool:
    return isinstance(job, str) and JOB_ID.fullmatch(job) is not None


def check_job_ids(jobs: Sequence[str]) -> list[str]:
    """The ids, if every one is a Slurm job id; BadJobId otherwise."""
    bad = [j for j in jobs if not valid_job_id(j)]
    if bad:
        raise BadJobId(f"not a Slurm job id: {', '.join(repr(j)[:40] for j in bad[:5])}")
    return list(jobs)


class SlurmUnavailable(RuntimeError):
    """slurmctld could not be asked: not running, unreachable, too slow, or it refused."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str                       # base state: idle, allocated, mixed, down, ...
    flags: tuple[str, ...]           # lower case: drain, completing, planned, not_responding, ...
    partitions: tuple[str, ...]
    address: str = ""                # NodeAddr: where the node is reached ('' when Slurm does not say)
    gres: str = ""                   # Gres as Slurm prints it: `gpu:a100:4(S:0-1),nic:1`; '' for none

    @property
    def gpus(self) -> int:
        """GPUs the node has (its `gpu` GRES, every type summed); 0 without."""
        return gpu_count(self.gres)

    @property
    def free(self) -> bool:
        """Idle and nothing pending on it: only such a node may get a pilot."""
        return self.state == "idle" and not NOT_FREE_FLAGS.intersection(self.flags)

    @property
    def label(self) -> str:
        return "+".join((self.state, *self.flags))


@dataclass(frozen=True)
class SlurmJob:
    id: str
    name: str
    state: str                       # RUNNING, PENDING, COMPLETING, COMPLETED, PREEMPTED, ...
    nodes: str                       # hostlist as Slurm prints it ('' while pending)
    partition: str
    user: str
    reason: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED


class SlurmCli:
    """`conf`: the slurm.conf to use (SLURM_CONF), else the site default."""

    def __init__(self, conf: str = "", timeout_s: float = 5.0) -> None:
        self.env = {**os.environ, **({"SLURM_CONF": conf} if conf else {})}
        self.timeout_s = timeout_s

    def _run(self, argv: Sequence[str], stdin: Optional[str] = None,
             env: Optional[Mapping[str, str]] = None) -> str:
        try:
            r = subprocess.run(list(argv), env={**self.env, **(env or {})}, input=stdin,
                               capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{argv[0]} did not answer within {self.timeout_s:g} s") from None
        except OSError as e:
            raise SlurmUnavailable(f"cannot run {argv[0]}: {e}") from e
        if r.returncode != 0:
            err = r.stderr.strip().splitlines()
            raise SlurmUnavailable(f"{argv[0]}: {err[-1] if err else f'exit status {r.returncode}'}")
        return r.stdout

    def _json(self, argv: Sequence[str], key: str) -> list[dict]:
        out = self._run(argv)
        try:
            data = json.loads(out)
        except ValueError:
            raise SlurmUnavailable(f"{argv[0]} --json printed no JSON") from None
        errors = data.get("errors") or []
        if errors:
            e = errors[0]
            raise SlurmUnavailable(f"{argv[0]}: {e.get('description') or e.get('error') or e}")
        return list(data.get(key) or [])

    def nodes(self) -> list[SlurmNode]:
        """Every node, in Slurm's own order."""
        return [SlurmNode(str(n["name"]), str(n.get("state", "")).lower(),
                          tuple(str(f).lower() for f in n.get("state_flags") or ()),
                          tuple(n.get("partitions") or ()), str(n.get("address") or n.get("hostname") or ""),
                          str(n.get("gres") or ""))
                for n in self._json(["sinfo", "--json"], "nodes")]

    def jobs(self, name: str = "", user: str = "") -> list[SlurmJob]:
        """Jobs slurmctld knows (ended ones included for a while), optionally only those with
        this name and user (the filter options are passed for newer Slurm versions that honour
        them with --json, and applied here for those that do not)."""
        for what, value in (("job name", name), ("user name", user)):
            if value and not FILTER_VALUE.fullmatch(value):
                raise ValueError(f"not a Slurm {what}: {value!r}")
        argv = ["squeue", "--json"] + ([f"--name={name}"] if name else []) + ([f"--user={user}"] if user else [])
        out = []
        for j in self._json(argv, "jobs"):
            job = SlurmJob(str(j["job_id"]), str(j.get("name", "")), str(j.get("job_state", "")),
                           str(j.get("nodes") or ""), str(j.get("partition", "")),
                           str(j.get("user_name", "")), str(j.get("state_reason", "")))
            if (not name or job.name == name) and (not user or job.user == user):
                out.append(job)
        return out

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
