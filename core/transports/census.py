"""What a worker holds on this host, for the site's limits on a job (core/dispatchers/limits.py):
how many processes it has, and how much disk a folder of it takes. Mechanism only, by reading
/proc and walking the folder; the policy (the caps, what follows) is the dispatcher's.

A worker's processes are those in its session or process group (the worker leads both) and
those its cleanup finds (its cgroup's members, or the processes its mark names): together they
take in children that called setsid() and daemons that left the worker's process tree.
"""
from __future__ import annotations

import os
import stat
from typing import Iterable, Mapping, Optional

#: what `folder_size` reads at most per call: its cost is bounded whatever the job writes
MAX_ENTRIES = 100_000


def by_session(leaders: Iterable[int]) -> dict[int, set[int]]:
    """For each leader PID, the live (non-zombie) processes whose session or process group it
    leads: one pass over /proc for all of them."""
    want = set(leaders)
    out: dict[int, set[int]] = {p: set() for p in want}
    if not want:
        return out
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                raw = f.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()     # state, ppid, pgrp, session, ...
        if len(fields) < 4 or fields[0] == "Z":
            continue
        for leader in {int(fields[2]), int(fields[3])} & want:
            out[leader].add(int(entry.name))
    return out


def count(handles: Iterable[tuple[int, str]], members: Mapping[str, Iterable[int]]) -> dict[int, int]:
    """For each (leader PID, mark), how many distinct processes it has: its session's and process
    group's, and `members[mark]` (what its cleanup found)."""
    pairs = list(handles)
    sessions = by_session(p for p, _ in pairs)
    return {pid: len(sessions.get(pid, set()) | set(members.get(mark, ()) if mark else ())) for pid, mark in pairs}


def folder_size(path: str, max_entries: int = MAX_ENTRIES) -> tuple[Optional[int], bool]:
    """The bytes of disk the files under `path` take (st_blocks, as du counts them; links not
    followed), and whether all was read: the walk stops after `max_entries` entries, and then the
    sum is a lower bound. (None, True) when there is no such folder."""
    total, seen, stack = 0, 0, [path]
    try:
        os.lstat(path)
    except OSError:
        return None, True
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                seen += 1
                if seen > max_entries:
                    return total, False
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
    return total, True
