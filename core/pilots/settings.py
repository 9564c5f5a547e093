"""How the harvester uses a batch scheduler (Slurm, PBS): where its pilot jobs go and how many,
which nodes it watches, how often it asks, and whether it only says what it would harvest (dry
run). Checked when built, with an error that names the setting."""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import SettingsError

ROOT = Path(__file__).resolve().parent.parent.parent
#: partition or queue, QOS, account and job names as the schedulers accept them on a command line
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
WATCH_ITEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._,\[\]-]*$")
MAX_PILOTS = 100_000
MAX_SLOTS = 1024


class SettingError(SettingsError):
    """A pilot setting out of range; `field` names it (the CLI maps it to its option)."""


@dataclass(frozen=True)
class PilotSettings:
    partition: str = "scavenger"     # where pilots go: a low-priority partition (Slurm) or queue (PBS) that is preempted
    qos: str = ""                    # optional --qos of the pilots (preempt/qos sites)
    account: str = ""                # optional --account of the pilots
    max_pilots: int = 64             # pilots held or waiting at once
    time_limit_min: int = 60         # each pilot's --time; a new pilot replaces it after
    watch: tuple[str, ...] = ()      # partitions, node names or hostlists; () = the partition's nodes
    poll_s: float = 1.0              # how often the scheduler is read (leaves come at once anyway)
    submit_batch: int = 128          # pilots submitted per poll at most
    submit_parallel: int = 4         # submissions (sbatch, qsub) run at once: a cold start of thousands within a minute
    pending_timeout_s: float = 60.0  # a pilot not connected after this is cancelled
    release_grace_s: float = 60.0    # a pilot no job has wanted for this long is cancelled
    dry_run: bool = False            # submit nothing; show what would be harvested
    hub_host: str = "127.0.0.1"      # where the harvester listens for its pilots
    hub_port: int = 0                # 0: any free port
    advertise: str = ""              # the host pilots dial (default hub_host): reachable from nodes
    pilot_name: str = "harvest-pilot"  # job name of the pilots (a leftover with it is cancelled at start)
    python: str = sys.executable     # interpreter of the pilot batch script, on the nodes
    workdir: str = str(ROOT)         # the pilots' working directory (this checkout, on the nodes)
    log_dir: str = ""                # pilot output files; '' = /dev/null
    conf: str = ""                   # SLURM_CONF / PBS_CONF_FILE for the scheduler's commands; '' = the site's default
    bin_dir: str = ""                # folder of the scheduler's commands (sinfo, ... / qsub, ...); '' = PATH
    worker_grace_s: float = 0.0      # a preempted pilot's workers: SIGTERM, SIGKILL after this
    #   (0: at once. The main job waits for the node, and a preempted worker holds nothing its
    #   peers lack: they go on from the same step. Give seconds to let a job checkpoint first.)
    command_timeout_s: float = 5.0   # a scheduler command slower than this counts as the scheduler away
    hub_max_connections: int = 0     # connections to the hub at once; 0: 4 x max_pilots + 64, at most max_pilots + 4096
    slots: int = 0                   # ranks (worker processes) per node; 0: its GPUs (Slurm GRES gpu, PBS ngpus), 1 without
    orphan_timeout_s: float = 600.0  # a pilot that lost the harvester keeps its node and redials this long
    backoff_s: float = 20.0          # a node whose pilot failed waits this long, doubled per failure in a row
    backoff_cap_s: float = 600.0     # ... but never longer than this
    submit_per_minute: int = 120     # pilots submitted in any minute at most, all nodes together
    state_file: str = ""             # where the hub's port, token and certificate are kept ('' : nowhere)

    def __post_init__(self) -> None:
        for f in ("partition", "pilot_name"):
            if not NAME.match(getattr(self, f)):
                raise SettingError(f, f"{getattr(self, f)!r} is not a valid name (letters, digits, '.', '_', '-')")
        for f in ("qos", "account"):
            if getattr(self, f) and not NAME.match(getattr(self, f)):
                raise SettingError(f, f"{getattr(self, f)!r} is not a valid name")
        _whole(self, "max_pilots", 1, MAX_PILOTS)
        _whole(self, "time_limit_min", 1, 365 * 24 * 60)
        _whole(self, "submit_batch", 1, MAX_PILOTS)
        _whole(self, "submit_parallel", 1, 64)
        _whole(self, "hub_port", 0, 65535)
        _whole(self, "hub_max_connections", 0, 1_000_000)
        _whole(self, "slots", 0, MAX_SLOTS)
        if 0 < self.hub_max_connections < self.max_pilots + 1:
            raise SettingError("hub_max_connections", f"must be 0 (automatic) or more than max_pilots "
                                                      f"({self.max_pilots}), not {self.hub_max_connections}")
        _number(self, "poll_s", 0.1, 3600)
        _number(self, "pending_timeout_s", 1, 7 * 24 * 3600)
        _number(self, "release_grace_s", 0, 7 * 24 * 3600)
        _number(self, "worker_grace_s", 0, 600)
        _number(self, "command_timeout_s", 0.5, 600)
        _number(self, "orphan_timeout_s", 0, 7 * 24 * 3600)
        _number(self, "backoff_s", 0, 24 * 3600)
        _number(self, "backoff_cap_s", self.backoff_s, 7 * 24 * 3600)
        _whole(self, "submit_per_minute", 1, MAX_PILOTS)
        if not isinstance(self.watch, tuple) or not all(isinstance(w, str) and WATCH_ITEM.match(w)
                                                        for w in self.watch):
            raise SettingError("watch", "give partition names, node names or hostlists (node[1-8]), "
                                        "comma-separated")
        if not self.hub_host or any(c.isspace() for c in self.hub_host + self.advertise):
            raise SettingError("hub_host", "give a host name or address")
        if self.bin_dir and not Path(self.bin_dir).is_absolute():
            raise SettingError("bin_dir", f"give the folder's absolute path, not {self.bin_dir!r}")
        if not Path(self.python).is_absolute():
            raise SettingError("python", f"give the interpreter's absolute path, not {self.python!r}")

    @property
    def hub_connection_cap(self) -> int:
        """The most connections the hub keeps open at once (pilots, and connections that have
        not said hello yet); beyond it new ones are refused (or replace the oldest waiting one).
        Room for 3 more per pilot on a small site, 4,096 more on a whole machine (10,624 pilots:
        4 x N + 64 would want 42,560 descriptors)."""
        return self.hub_max_connections or min(4 * self.max_pilots + 64, self.max_pilots + 4096)

    @property
    def dial_host(self) -> str:
        """The address a pilot connects to."""
        return self.advertise or self.hub_host

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def split_list(text: str) -> tuple[str, ...]:
    """`main,node[1-4,7],gpu01` -> ('main', 'node[1-4,7]', 'gpu01'): commas inside brackets
    belong to a hostlist."""
    items, cur, depth = [], "", 0
    for c in text:
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += c
    items.append(cur.strip())
    return tuple(i for i in items if i)


def _whole(s: PilotSettings, f: str, lo: int, hi: int) -> None:
    v = getattr(s, f)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise SettingError(f, f"must be a whole number from {lo} to {hi:,}, not {v!r}")


def _number(s: PilotSettings, f: str, lo: float, hi: float) -> None:
    v = getattr(s, f)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise SettingError(f, f"must be a number from {lo:g} to {hi:g}, not {v!r}")
