"""A job's worker logs as its files on disk, for a job whose workers are gone (it ended, or the
harvester was restarted): the dispatcher answers only for the workers it runs now.

Read-only. The dispatcher writes `LOGDIR/JOB/KEY-sLIFE-INC.log` (elastic runtime: one per
incarnation of a worker key) or `KEY-sLIFE-gGEN.log` (torchrun: one per generation); the newest
of each key is its last life's last incarnation or generation. Only the end of each file is
read, a link is never followed, and at most `MAX_WORKERS` keys are read.
"""
from __future__ import annotations

import os
import re
import stat
from collections import deque
from pathlib import Path
from typing import Optional, Sequence

#: a worker key's log file: key, the harvester's start number, incarnation or generation
LOG_NAME = re.compile(r"^(?P<key>.+)-s(?P<life>\d{1,9})-g?(?P<n>\d{1,9})\.log$")
#: the most workers whose logs one answer carries (rank 0's first)
MAX_WORKERS = 256
#: bytes read from a file's end at most: lines longer than this on average come back fewer
MAX_BYTES = 1 << 20
_BLOCK = 8192


def newest_logs(logdir: Path, job_id: str) -> dict[str, Path]:
    """Each worker key's newest log file of the job, {key: path}; {} when there is none."""
    if not job_id or job_id in (".", "..") or "/" in job_id or "\\" in job_id or "\0" in job_id:
        return {}
    best: dict[str, tuple[tuple[int, int], Path]] = {}
    try:
        with os.scandir(Path(logdir) / job_id) as entries:
            for entry in entries:
                m = LOG_NAME.match(entry.name)
                if m is None or not entry.is_file(follow_symlinks=False):
                    continue
                rank = (int(m["life"]), int(m["n"]))
                if m["key"] not in best or rank > best[m["key"]][0]:
                    best[m["key"]] = (rank, Path(entry.path))
    except OSError:
        return {}
    return {k: p for k, (_, p) in best.items()}


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of the file, reading only its end (at most MAX_BYTES); [] when it
    cannot be read, is not a regular file, or is a link."""
    if lines <= 0:
        return []
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            pos = f.seek(0, os.SEEK_END)
            data, read = b"", 0
            while pos > 0 and data.count(b"\n") <= lines and read < MAX_BYTES:
                step = min(_BLOCK, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
                read += step
        except OSError:
            return []
    text = data.decode("utf-8", "replace")
    out = text.splitlines()
    if pos > 0 and len(out) > 1:
        out = out[1:]             # the first line read may be the end of a longer one (kept if alone)
    return list(deque(out, maxlen=lines))


def _natural(key: str) -> tuple:
    """node2 before node10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key))


def job_logs(logdir: Path, job_id: str, lines: int, order: Optional[Sequence[str]] = None) -> dict[str, list[str]]:
    """The last `lines` of each worker key's newest log of the job, in `order` (its last
    generation's members, rank 0's first) where known, then by name; at most MAX_WORKERS."""
    found = newest_logs(logdir, job_id)
    rank = {k: i for i, k in enumerate(order or ())}
    keys = sorted(found, key=lambda k: (rank.get(k, len(rank)), _natural(k)))[:MAX_WORKERS]
    return {k: tail(found[k], lines) for k in keys}
