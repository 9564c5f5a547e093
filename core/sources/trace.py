"""Replay of a node-state log (`time,node,state` with state idle|busy), read as a stream.

The Summit log in data/ holds 846,856 transitions; the reader keeps only per-node state, so a
two-week replay needs memory for the nodes, not for the log.
"""
from __future__ import annotations

import gzip
import io
import re
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

from ..errors import InputError, SettingsError
from ..model import Event, EventKind
from ..timeutil import parse_iso
from .base import NodeSource

STATES = ("idle", "busy")


def _open(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open(newline="")


def read_transitions(path: str | Path) -> Iterator[tuple[float, str, bool, int]]:
    """(time, node, idle?, line number) for every line; InputError names the bad line."""
    path = Path(path)
    try:
        fh = _open(path)
    except OSError as e:
        raise InputError(path, None, f"cannot read: {e.strerror}")
    with fh:
        try:
            header = fh.readline().strip()
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise InputError(path, 1, f"unreadable: {e}")
        if header.replace(" ", "") != "time,node,state":
            raise InputError(path, 1, f"expected header 'time,node,state', found {header[:60]!r}")
        last = -float("inf")
        lineno = 1
        try:
            for lineno, line in enumerate(fh, start=2):
                line = line.strip()
                if not line:
                    continue
                parts = line.split(",")
                if len(parts) != 3:
                    raise InputError(path, lineno, f"expected 3 fields (time,node,state), found {len(parts)}")
                ts, node, state = parts
                if state not in STATES:
                    raise InputError(path, lineno, f"unknown state {state!r}; expected idle or busy")
                if not node:
                    raise InputError(path, lineno, "empty node name")
                try:
                    t = parse_iso(ts)
                except ValueError:
                    raise InputError(path, lineno, f"bad time {ts!r}; expected ISO 8601 like 2021-02-10T00:48:48Z")
                if t < last:
                    raise InputError(path, lineno, f"time {ts} goes back in time")
                last = t
                yield t, node, state == "idle", lineno
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise InputError(path, lineno + 1, f"unreadable: {e}")


def machine_order(names: Iterable[str]) -> list[str]:
    """Names sorted as the machine is built: by rack, then node number (`a02n10` after `a02n9`)."""
    def key(name: str):
        return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
    return sorted(set(names), key=key)


def read_node_list(path: str | Path) -> list[str]:
    """A file of node names, one a line (`#` comments allowed), in machine order."""
    path = Path(path)
    try:
        names = [x.strip() for x in path.read_text().splitlines()]
    except OSError as e:
        raise InputError(path, None, f"cannot read: {e.strerror}")
    return machine_order(x for x in names if x and not x.startswith("#"))


def select_nodes(all_nodes: Sequence[str], first: Optional[int] = None,
                 racks: Optional[str] = None) -> list[str]:
    """First N nodes of the machine's order, or the nodes of the racks named (`a01,b02-b05`)."""
    nodes = list(all_nodes)
    if racks:
        from ..model import rack_of
        present = {rack_of(n) for n in nodes}
        wanted: set[str] = set()
        unknown: list[str] = []
        for part in racks.split(","):
            part = part.strip()
            m = re.fullmatch(r"([A-Za-z]+)(\d+)-([A-Za-z]*)(\d+)", part)
            if m:
                letters, a, _, b = m.groups()
                width = len(m.group(2))
                names = {f"{letters}{i:0{width}d}" for i in range(int(a), int(b) + 1)}
            else:
                names = {part} if part else set()
            if names and not names & present:
                unknown.append(part)
            wanted |= names
        if unknown:
            known = sorted(present)
            span = f"{known[0]} … {known[-1]}" if known else "none"
            raise SettingsError("racks", f"no such rack: {', '.join(unknown)} (this machine's racks: {span})")
        nodes = [n for n in nodes if rack_of(n) in wanted]
        if not nodes:
            raise SettingsError("racks", f"no node is in racks {racks}")
    if first is not None:
        if first <= 0:
            raise SettingsError("nodes", "must be positive")
        nodes = nodes[:first]
    return nodes


class TraceSource(NodeSource):
    """Idle/busy events of a log within [start, end), for a subset of its nodes.

    Transitions before `start` only set the initial state. Transitions that share a timestamp
    (or fall within `coalesce` seconds of the first) form one batch, reduced to its net effect
    per node, except that a node idle before the batch that was busy at any moment in it is
    reported as a leave (its job was preempted), and as a join too if it ends idle.
    """

    name = "trace"

    def __init__(self, path: str | Path, nodes: Sequence[str], start: Optional[float] = None,
                 end: Optional[float] = None, coalesce: float = 0.0,
                 resume_after: Optional[float] = None, resume_idle: Optional[Iterable[str]] = None) -> None:
        self.path = Path(path)
        self.nodes = list(nodes)
        self._allowed = set(self.nodes)
        self.start = start
        self.end = end
        self.coalesce = coalesce
        self.resume_after = resume_after
        self._resume_idle = None if resume_idle is None else list(resume_idle)
        self._idle0: Optional[list[str]] = None
        self._stream: Optional[Iterator] = None
        self.first_time: Optional[float] = None
        self.last_time: Optional[float] = None

    def node_names(self) -> list[str]:
        return list(self.nodes)

    def validate(self) -> tuple[int, Optional[float], Optional[float]]:
        """Read the whole log once: (lines, first time, last time); raises on the first bad line.
        The node names seen are kept in `seen_nodes` (the machine, when no node list is given)."""
        count, first, last = 0, None, None
        seen: dict[str, None] = {}
        for t, node, _, _ in read_transitions(self.path):
            count += 1
            first = t if first is None else first
            last = t
            seen[node] = None
        self.first_time, self.last_time = first, last
        self.seen_nodes = list(seen)
        return count, first, last

    def _prime(self) -> None:
        if self._stream is not None:
            return
        idle: dict[str, None] = {}
        stream = read_transitions(self.path)
        begin = self.resume_after if self.resume_after is not None else self.start
        pending = None
        for item in stream:
            t, node, is_idle, _ = item
            if begin is not None and (t > begin if self.resume_after is not None else t >= begin):
                pending = item
                break
            if begin is None:
                pending = item
                break
            if node in self._allowed:
                if is_idle:
                    idle[node] = None
                else:
                    idle.pop(node, None)
        self._idle0 = self._resume_idle if self._resume_idle is not None else list(idle)

        def chained():
            if pending is not None:
                yield pending
            yield from stream
        self._stream = chained()

    def initial_idle(self) -> list[str]:
        self._prime()
        return list(self._idle0 or [])

    def batches(self) -> Iterator[tuple[float, list[Event]]]:
        self._prime()
        state = {n: True for n in self._idle0 or []}
        batch: list[tuple[float, str, bool]] = []
        t0 = None
        for t, node, is_idle, _ in self._stream:
            if self.end is not None and t >= self.end:
                break
            if node not in self._allowed:
                continue
            if t0 is not None and t > t0 + self.coalesce:
                out = self._reduce(batch, state)
                if out:
                    yield out
                batch, t0 = [], None
            if t0 is None:
                t0 = t
            batch.append((t, node, is_idle))
        if batch:
            out = self._reduce(batch, state)
            if out:
                yield out

    @staticmethod
    def _reduce(batch: list[tuple[float, str, bool]], state: dict[str, bool]):
        t_last = batch[-1][0]
        before: dict[str, bool] = {}
        went_busy: set[str] = set()
        for _, node, is_idle in batch:
            if node not in before:
                before[node] = state.get(node, False)
            if not is_idle:
                went_busy.add(node)
            state[node] = is_idle
        events = []
        for node, was_idle in before.items():
            now_idle = state[node]
            if was_idle and (node in went_busy):
                events.append(Event(t_last, EventKind.NODE_LEAVE, node=node))
                if now_idle:
                    events.append(Event(t_last, EventKind.NODE_JOIN, node=node))
            elif not was_idle and now_idle:
                events.append(Event(t_last, EventKind.NODE_JOIN, node=node))
            if not now_idle:
                state.pop(node, None)
        return (t_last, events) if events else None

