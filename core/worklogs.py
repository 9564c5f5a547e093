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
from pathlib import Path
from typing import Optional, Sequence

from .logtail import MAX_READ_BYTES, tail_path

#: a worker key's log file: key, the harvester's start number, incarnation or generation
LOG_NAME = re.compile(r"^(?P<key>.+)-s(?P<life>\d{1,9})-g?(?P<n>\d{1,9})\.log$")
#: the most workers whose logs one answer carries (rank 0's first)
MAX_WORKERS = 256
#: bytes read from a file's end at most: lines longer than this on average come back fewer
MAX_BYTES = MAX_READ_BYTES


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
    """The last `lines` lines of the file, reading only its end (at most MAX_BYTES, each line
    cut to logtail.MAX_LINE_BYTES); [] when it cannot be read, is not a regular file, or is a
    link."""
    return tail_path(str(path), lines, getattr(os, "O_NOFOLLOW", 0), MAX_BYTES)


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
