"""The simulated Slurm of bench.scale: the Summit trace's node states served to the real harvester
through fake `sinfo`, `squeue`, `sbatch`, `scancel` and `scontrol` commands.

Each fake command is a few lines of bash (`fake_commands`) that send their argv (and, for sbatch,
the hub's address, fingerprint and token from the environment the harvester gave it) to the
feed server in the bench process over `/dev/tcp`, print its answer and exit with its code: each
call costs the harvester a fork, a bash and a cat, as a real Slurm command costs it a fork and an
exec, never a Python start. The answers are Slurm 24.11's text formats (core/slurm/parse.py,
tests/data/slurm/24.11): every node twice in sinfo (partitions `main*` and `scavenger`, as the
test Slurm of bench.facility has them), the pilots in squeue.

The machine (`take_machine`): the first `nodes` of the Summit node list, tiled past 4,734 nodes
(`--nodes 10624`: Aurora). Tile k (k >= 1) names its nodes with the letter TILE_PREFIXES[k - 1]
before the Summit name (`ta01n01`, the grid lays them out as more rows) and replays the trace k
days later than tile 0 (k days earlier where that window would run past the trace's end;
`--tile-shift-days` sets the day), so that the tiles do not go idle and busy in lock step. With
`--tile-shift-days 0` they do: a moment with most of Summit idle is then a cold start of
thousands of pilots per tile (more than 10,000 at 10,624 nodes). A node the trace never mentions before the window
is busy (the trace lists idle periods), and so is one it never mentions at all.

The world (`Feed`), all on the bench's event loop: a node the trace has busy runs a main job
(`allocated`); an idle one is `idle` unless a pilot runs there (`allocated` too). sbatch answers
a job id (as `sbatch --parsable` does) and the pilot starts after a short start delay drawn
from a seeded generator (`START_DELAY_S`), or once its node is idle again; when the trace makes a
node busy, its pilot is preempted (the fleet sends `leaving` and hangs up) and leaves squeue;
scancel ends a pilot the same way (a real pilot says `leaving` on scancel's SIGTERM too)."""
from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from core.sources.trace import read_node_list, read_transitions

DAY_S = 86400.0
#: the letter before the Summit name of tile k's nodes (tile 0 keeps the Summit names)
TILE_PREFIXES = "tuvwxyz"
VERSION = "slurm 24.11.5"
PARTITIONS = ("main*", "scavenger")
#: sbatch -> the pilot running: a few ms to a few hundred ms (slurmctld's scheduling pass, the
#: prolog, Python's start)
START_DELAY_S = (0.005, 0.3)
#: the fields a fake command sends before its argv: its name and the hub variables sbatch exports
ENV_FIELDS = ("HARVEST_PILOT_HUB", "HARVEST_PILOT_HUB_SHA256", "HARVEST_PILOT_TOKEN")
COMMANDS = ("sinfo", "squeue", "sbatch", "scancel", "scontrol")

FAKE = """#!/bin/bash
# bench.scale's simulated Slurm: ask the feed server in the bench process, print its answer.
exec 3<>/dev/tcp/127.0.0.1/{port} || exit 1
printf '%s\\0' "$#" "${{0##*/}}" {env} "$@" >&3
IFS= read -r rc <&3
if [ "$rc" = 0 ]; then cat <&3; else cat <&3 >&2; fi
exit "${{rc:-1}}"
"""


@dataclass
class Machine:
    """The played slice: node names in machine order, which are idle when the window opens, and
    the changes after it (seconds of trace time after the window's start, node, idle?)."""
    names: list[str]
    idle0: dict[str, bool]
    changes: list[tuple[float, str, bool]]
    shifts_days: list[float]

    @property
    def idle_at_start(self) -> int:
        return sum(self.idle0.values())


def tile_name(k: int, summit: str) -> str:
    return summit if k == 0 else f"{TILE_PREFIXES[k - 1]}{summit}"


def take_machine(trace: Path, node_list: Path, nodes: int, start: float, hours: float,
                 shift_days: float = 1.0) -> Machine:
    """The first `nodes` nodes of the (tiled) machine over [start, start + hours), tile k shifted
    by k * `shift_days` (module doc; 0: the tiles in lock step, every tile idle when tile 0 is)."""
    base = read_node_list(node_list)
    tiles = -(-nodes // len(base))
    if tiles > len(TILE_PREFIXES) + 1:
        raise SystemExit(f"--nodes {nodes}: at most {len(base) * (len(TILE_PREFIXES) + 1)} nodes (tiles of {len(base)})")
    first, last = trace_span(trace)
    span = hours * 3600.0
    shifts = []
    for k in range(tiles):
        s = k * shift_days * DAY_S
        s = s if start + s + span <= last else -s
        if start + s < first:
            raise SystemExit(f"tile {k} of the machine falls outside the trace ({start + s} < {first})")
        shifts.append(s)
    members: dict[str, list[int]] = {}
    names: list[str] = []
    for i in range(nodes):
        k, summit = divmod(i, len(base))
        names.append(tile_name(k, base[summit]))
        members.setdefault(base[summit], []).append(k)
    idle0 = dict.fromkeys(names, False)
    changes: list[tuple[float, str, bool]] = []
    for t, node, idle, _ in read_transitions(trace):
        for k in members.get(node, ()):
            at = t - (start + shifts[k])
            if at < 0:
                idle0[tile_name(k, node)] = idle
            elif at < span:
                changes.append((at, tile_name(k, node), idle))
    changes.sort(key=lambda c: c[0])
    return Machine(names, idle0, changes, [s / DAY_S for s in shifts])


def trace_span(trace: Path) -> tuple[float, float]:
    """The first and last time of the trace."""
    first = last = None
    for t, _, _, _ in read_transitions(trace):
        first = t if first is None else first
        last = t
    if first is None:
        raise SystemExit(f"{trace} holds no transitions")
    return first, last


def fake_commands(folder: Path, port: int) -> Path:
    """The fake Slurm commands in `folder` (the harvester's --slurm-bin), talking to `port`."""
    folder.mkdir(parents=True, exist_ok=True)
    env = " ".join(f'"${{{v}-}}"' for v in ENV_FIELDS)
    for name in COMMANDS:
        p = folder / name
        p.write_text(FAKE.format(port=port, env=env))
        p.chmod(0o755)
    return folder


@dataclass
class PilotJob:
    id: str
    node: str
    name: str
    env: dict[str, str]
    state: str = "PENDING"


@dataclass
class FeedStats:
    calls: Counter = field(default_factory=Counter)        # command -> calls
    serve_s: Counter = field(default_factory=Counter)      # command -> seconds spent answering
    preempted: int = 0
    cancelled: int = 0
    started: int = 0


class Feed:
    """The simulated Slurm's state and its command server (on the bench's event loop). `start_pilot(job)`
    and `stop_pilot(job id, why)` are the fleet's; the fleet calls `pilot_ended(job id)` when a
    pilot ends by itself."""

    def __init__(self, machine: Machine, user: str, start_pilot: Callable[[PilotJob], None],
                 stop_pilot: Callable[[str, str], None], seed: int = 0) -> None:
        self.names = machine.names
        self.busy = {n: not machine.idle0[n] for n in machine.names}
        self.user = user
        self.start_pilot, self.stop_pilot = start_pilot, stop_pilot
        self.jobs: dict[str, PilotJob] = {}
        self.running_on: dict[str, str] = {}        # node -> the running pilot's job id
        self.rng = random.Random(seed)
        self.stats = FeedStats()
        self._next_id = 1000
        self._sinfo: Optional[str] = None
        self.server: Optional[asyncio.AbstractServer] = None

    # ---- the world -------------------------------------------------------------------------
    def set_idle(self, node: str, idle: bool) -> None:
        """The trace changed a node: busy preempts its pilot; idle lets a waiting pilot start."""
        if self.busy[node] == (not idle):
            return
        self.busy[node] = not idle
        self._sinfo = None
        if not idle:
            job = self.running_on.pop(node, None)
            if job is not None:
                self.jobs.pop(job, None)
                self.stats.preempted += 1
                self.stop_pilot(job, "preempted")
        else:
            for j in self.jobs.values():
                if j.node == node and j.state == "PENDING":
                    self._start_later(j)
                    break

    def _start_later(self, job: PilotJob) -> None:
        asyncio.get_running_loop().call_later(self.rng.uniform(*START_DELAY_S), self._try_start, job.id)

    def _try_start(self, jid: str) -> None:
        job = self.jobs.get(jid)
        if job is None or job.state != "PENDING" or self.busy[job.node] or job.node in self.running_on:
            return
        job.state = "RUNNING"
        self.running_on[job.node] = jid
        self._sinfo = None
        self.stats.started += 1
        self.start_pilot(job)

    def pilot_ended(self, jid: str) -> None:
        job = self.jobs.pop(jid, None)
        if job is not None and self.running_on.get(job.node) == jid:
            del self.running_on[job.node]
            self._sinfo = None

    def idle_count(self) -> int:
        return sum(1 for b in self.busy.values() if not b)

    # ---- the commands ----------------------------------------------------------------------
    def sinfo(self, args: list[str]) -> tuple[int, str]:
        if "--version" in args:
            return 0, VERSION + "\n"
        if self._sinfo is None:
            lines = []
            for n in self.names:
                state = "allocated" if self.busy[n] or n in self.running_on else "idle"
                lines += [f"{n}|{state}|{p}|localhost|(null)|" for p in PARTITIONS]
            self._sinfo = "\n".join(lines) + "\n"
        return 0, self._sinfo

    def squeue(self, args: list[str]) -> tuple[int, str]:
        name = next((a.split("=", 1)[1] for a in args if a.startswith("--name=")), None)
        lines = [f"{j.id}|{j.state}|{j.node if j.state == 'RUNNING' else ''}|scavenger|{self.user}|"
                 f"{'None' if j.state == 'RUNNING' else 'Resources'}|{j.name}"
                 for j in self.jobs.values() if name is None or j.name == name]
        return 0, "".join(line + "\n" for line in lines)

    def sbatch(self, args: list[str], env: dict[str, str]) -> tuple[int, str]:
        opts = dict(zip(args, args[1:]))
        node, name = opts.get("--nodelist", ""), opts.get("--job-name", "sbatch")
        if node not in self.busy:
            return 1, f"sbatch: error: invalid node name specified: {node!r}\n"
        self._next_id += 1
        job = PilotJob(str(self._next_id), node, name, env)
        self.jobs[job.id] = job
        self._start_later(job)
        return 0, f"{job.id}\n"

    def scancel(self, args: list[str]) -> tuple[int, str]:
        for jid in (a for a in args if a != "--"):
            job = self.jobs.pop(jid, None)
            if job is not None and job.state == "RUNNING":
                if self.running_on.get(job.node) == jid:
                    del self.running_on[job.node]
                    self._sinfo = None
                self.stats.cancelled += 1
                self.stop_pilot(jid, "cancelled")
        return 0, ""

    def answer(self, command: str, env: dict[str, str], args: list[str]) -> tuple[int, str]:
        if command == "sinfo":
            return self.sinfo(args)
        if command == "squeue":
            return self.squeue(args)
        if command == "sbatch":
            return self.sbatch(args, env)
        if command == "scancel":
            return self.scancel(args)
        return 1, f"{command}: not simulated by bench.scale\n"

    # ---- the server ------------------------------------------------------------------------
    async def serve(self) -> int:
        """Listen on a free loopback port (returned) for the fake commands."""
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0, backlog=1024)
        return self.server.sockets[0].getsockname()[1]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            count = int((await reader.readuntil(b"\0"))[:-1])
            fields = [(await reader.readuntil(b"\0"))[:-1].decode() for _ in range(count + 1 + len(ENV_FIELDS))]
            command, env, args = fields[0], dict(zip(ENV_FIELDS, fields[1:1 + len(ENV_FIELDS)])), fields[1 + len(ENV_FIELDS):]
            t0 = time.perf_counter()
            rc, out = self.answer(command, env, args)
            self.stats.calls[command] += 1
            self.stats.serve_s[command] += time.perf_counter() - t0
            writer.write(f"{rc}\n{out}".encode())
            await writer.drain()
        except (asyncio.IncompleteReadError, ValueError, ConnectionError):
            pass
        finally:
            writer.close()

    async def play(self, machine: Machine, compress: float, clock0: float) -> None:
        """The trace's changes, each at clock0 + trace offset / compress (monotonic)."""
        for at, node, idle in machine.changes:
            wait = clock0 + at / compress - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self.set_idle(node, idle)

