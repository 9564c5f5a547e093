"""The Slurm commands the harvester runs, as typed calls: `sinfo --json` and `squeue --json` to
read the cluster, `sbatch` and `scancel` to act. Every call has a timeout; a controller that
cannot be asked raises SlurmUnavailable.

Slurm 22.05 quirks handled here: with --json, sinfo and squeue ignore their filter options
(everything comes back, finished jobs included, and we filter), and when slurmctld is down
they still exit 0 after ~9 s of retries, with the failure in the JSON's `errors`.
"""
from __future__ import annotations

import json
import os
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


class SlurmUnavailable(RuntimeError):
    """slurmctld could not be asked: not running, unreachable, too slow, or it refused."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str                       # base state: idle, allocated, mixed, down, ...
    flags: tuple[str, ...]           # lower case: drain, completing, planned, not_responding, ...
    partitions: tuple[str, ...]

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
                          tuple(n.get("partitions") or ()))
                for n in self._json(["sinfo", "--json"], "nodes")]

    def jobs(self, name: str = "", user: str = "") -> list[SlurmJob]:
        """Jobs slurmctld knows (ended ones included for a while), optionally only those with
        this name and user (the filter options are passed for newer Slurm versions that honour
        them with --json, and applied here for those that do not)."""
        argv = ["squeue", "--json"] + (["--name", name] if name else []) + (["--user", user] if user else [])
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
        if jobs:
            self._run(["scancel", *jobs])

    def hostnames(self, hostlist: str) -> list[str]:
        """Expand a hostlist expression (`node[1-4,7]`) the way Slurm does."""
        return self._run(["scontrol", "show", "hostnames", hostlist]).split()
