"""Reading Slurm's output the same way on every supported version (22.05 through 26.05).

The harvester reads the stable text formats (`sinfo --Node --Format`, `squeue --format`), not
`--json`: the JSON changed shape in 23.02 (`sinfo --json` lost its `nodes`), in 23.11 (`job_state`
became a list, numbers became `{"set", "infinite", "number"}`) and follows a versioned OpenAPI
schema, while the text fields have kept their names and meaning for a decade, honour the filter
options (22.05's `--json` ignored them), and are what PSI/J and Parsl read. State values are
still taken in every form Slurm prints them: `idle+planned`, `IDLE+DRAIN`, `idle*`, or a list
`["IDLE", "DRAIN"]`.

Anything that does not parse raises `Unreadable` with the offending line: the CLI adds the
version, so the user reads one line naming both instead of a wrong verdict later."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence, Union

from ..pilots.base import Unparsable
from .records import SlurmJob, SlurmNode

#: the oldest Slurm whose output this module reads, and the newest it was run against
OLDEST = (22, 5)
NEWEST_TESTED = (26, 5)

#: `sinfo --Node --noheader --Format=...`: one line per node and partition, `|` after each
#: field, `:0` for no truncation. StateComplete prints the base state and every flag.
SINFO_FIELDS = ("NodeList", "StateComplete", "Partition", "NodeAddr", "Gres")
SINFO_FORMAT = ",".join(f"{f}:0|" for f in SINFO_FIELDS)
#: `squeue --noheader --format=...`: the job name last, so that a `|` in it cannot shift a field
SQUEUE_FORMAT = "%i|%T|%N|%P|%u|%r|%j"

VERSION = re.compile(r"\b(\d{2})\.(\d{2})(?:\.(\d+))?")
#: flags sinfo's short forms print as a suffix of the state (`idle*`, `idle~`, `mixed-`)
SUFFIXES = {"*": "not_responding", "~": "powered_down", "#": "powering_up", "!": "power_down",
            "%": "powering_down", "$": "maintenance", "@": "reboot_requested", "^": "reboot_issued",
            "-": "planned"}
#: base node states; anything else in a state value is a flag
BASES = frozenset({"idle", "allocated", "alloc", "mixed", "down", "error", "future", "unknown",
                   "drained", "draining", "completing"})


#: job flags that squeue's %T prints instead of the base state, in Slurm's own order of precedence
JOB_FLAGS_SHOWN = ("COMPLETING", "CONFIGURING", "RESIZING", "RESV_DEL_HOLD", "REQUEUED", "REQUEUE_FED",
                   "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED", "POWER_UP_NODE", "STAGE_OUT")


class Unreadable(Unparsable):
    """Slurm printed something this module cannot read; the message quotes it."""


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.patch}"

    @property
    def release(self) -> tuple[int, int]:
        return self.major, self.minor


def parse_version(text: str) -> SlurmVersion:
    """`slurm 24.11.5` or `slurm-wlm 22.05.8` (what `sinfo --version` prints)."""
    m = VERSION.search(text)
    if m is None:
        raise Unreadable(f"no version in {text.strip()[:80]!r}")
    return SlurmVersion(int(m[1]), int(m[2]), int(m[3] or 0))


def check_version(v: SlurmVersion) -> None:
    """Unreadable for a Slurm older than the oldest one read here."""
    if v.release < OLDEST:
        raise Unreadable(f"Slurm {v} is older than {OLDEST[0]}.{OLDEST[1]:02d}, the oldest this harvester reads")


def node_state(value: Union[str, Sequence[str]]) -> tuple[str, tuple[str, ...]]:
    """(base state, flags), lower case, from `idle+planned`, `IDLE+DRAIN`, `idle*`, `drained`
    or `["IDLE", "DRAIN"]`; the base is the first known base state, else the first item."""
    items = value.split("+") if isinstance(value, str) else [str(v) for v in value]
    words: list[str] = []
    marks: list[str] = []
    for item in items:
        word = item.strip().lower()
        while word and word[-1] in SUFFIXES:
            marks.append(SUFFIXES[word[-1]])
            word = word[:-1]
        if word:
            words.append(word)
    words += marks
    if not words:
        raise Unreadable(f"an empty node state: {value!r}")
    base = next((w for w in words if w in BASES), words[0])
    flags = [w for w in words if w != base]
    return ("allocated" if base == "alloc" else base), tuple(dict.fromkeys(flags))


def job_state(value: Union[str, Sequence[str]]) -> str:
    """`RUNNING` from `RUNNING`, `running` or `["RUNNING"]` (23.11+'s JSON); from a list with
    flags the word squeue's %T prints (`["CANCELLED", "COMPLETING"]` -> `COMPLETING`)."""
    items = [value] if isinstance(value, str) else [str(v).strip().upper() for v in value]
    shown = [f for f in JOB_FLAGS_SHOWN if f in items[1:]]
    state = shown[0] if shown else str(items[0]).strip().upper() if items else ""
    if not state or not state.replace("_", "").isalpha():
        raise Unreadable(f"not a job state: {value!r}")
    return state


def parse_nodes(text: str) -> list[SlurmNode]:
    """Nodes from sinfo's SINFO_FORMAT lines, in Slurm's order, one record per node with all of
    its partitions (the default partition's `*` dropped)."""
    seen: dict[str, SlurmNode] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) < len(SINFO_FIELDS) or not fields[0].strip():
            raise Unreadable(f"sinfo line {number} has not the {len(SINFO_FIELDS)} fields asked for: {line[:120]!r}")
        name, state, partition, address, gres = (f.strip() for f in fields[:len(SINFO_FIELDS)])
        base, flags = node_state(state)
        partition = partition.rstrip("*")
        old = seen.get(name)
        if old is not None:
            if partition and partition not in old.partitions:
                seen[name] = SlurmNode(name, old.state, old.flags, old.partitions + (partition,),
                                       old.address, old.gres)
            continue
        seen[name] = SlurmNode(name, base, flags, (partition,) if partition else (),
                               "" if address in ("(null)", "N/A") else address,
                               "" if gres in ("(null)", "N/A") else gres)
    return list(seen.values())


def parse_jobs(text: str) -> list[SlurmJob]:
    """Jobs from squeue's SQUEUE_FORMAT lines."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("|", 6)
        if len(fields) != 7 or not fields[0].strip():
            raise Unreadable(f"squeue line {number} has not the 7 fields asked for: {line[:120]!r}")
        jid, state, nodes, partition, user, reason, name = fields
        out.append(SlurmJob(jid.strip(), name, job_state(state), _unset(nodes), partition.strip(),
                            user.strip(), _unset(reason)))
    return out


def _unset(value: str) -> str:
    v = value.strip()
    return "" if v in ("(null)", "None", "N/A") else v
