"""What the harvester knows of a Slurm node and a Slurm job: plain records, whatever version of
Slurm they were read from (core/slurm/parse.py turns its output into these)."""
from __future__ import annotations

import re
from dataclasses import dataclass

#: a node in one of these conditions is not free for a pilot even when its state says idle
NOT_FREE_FLAGS = frozenset({"drain", "draining", "drained", "completing", "planned", "not_responding",
                            "reserved", "maintenance", "powered_down", "powering_down", "powering_up",
                            "power_down", "reboot_requested", "reboot_issued", "fail", "invalid_reg",
                            "no_respond", "down", "future", "perfctrs"})
#: job states after which a job holds nothing (squeue shows them for MinJobAge seconds)
ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
                   "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"})
#: ended states that say the pilot itself went wrong (not preempted, cancelled or timed out)
FAILED = frozenset({"FAILED", "BOOT_FAIL", "NODE_FAIL", "OUT_OF_MEMORY", "SPECIAL_EXIT"})
#: a pilot that ended so was taken off its node by Slurm or staff, through no fault of its own
NOT_ITS_FAULT = frozenset({"PREEMPTED", "CANCELLED", "TIMEOUT", "DEADLINE"})

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
    def unreachable(self) -> bool:
        """Slurm cannot reach the node's slurmd (`not_responding`: a dead host, or one whose jobs
        Slurm kills once SlurmdTimeout is up) or has marked it down: not a node to train on."""
        return self.state == "down" or "not_responding" in self.flags

    @property
    def runs_a_job(self) -> bool:
        """Allocated to a job that is not ending (a pilot's end shows `completing` first)."""
        return self.state in ("allocated", "mixed") and "completing" not in self.flags

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
    reason: str = ""                 # Slurm's reason: Resources, NonZeroExitCode, ...

    @property
    def node(self) -> str:
        """The node a (one-node) pilot runs on; '' while it is pending."""
        return self.nodes

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def suspended(self) -> bool:
        return self.state == "SUSPENDED"

    @property
    def not_its_fault(self) -> bool:
        return self.state in NOT_ITS_FAULT

    @property
    def failed(self) -> bool:
        """It ended through a fault of its own or its node's (not preempted, cancelled, timed out)."""
        return self.state in FAILED
