"""A resubmitted job continues the failed or cancelled one it was made from (issue 56, `harvest
resubmit`): before its first start, the old job's checkpoint folder (`<logdir>/<old>/checkpoint`,
which nothing removes when a job ends) is copied into its own, so it resumes from the old job's
last checkpoint and never shares a folder with it (a job may be resubmitted twice). The copy
runs on the harvester's host, as the nodes see the same folder at the same path; it never
follows a link (a job's account could plant one to the harvester's files), and `checkpoint.json`
(the elastic runtime's step sidecar) goes first, so the step it says is never past the one in
`checkpoint.pt` copied after it, even while the old job's last worker still writes.

Where the new job starts: a runtime job at the samples of the checkpoint's step (exact, the
coordinator counts steps x global batch); a torchrun job at the old job's last progress (its
script's checkpoint format is its own; its first progress line says where it resumed).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import time
from pathlib import Path

from ..model import LAUNCHER_TORCHRUN, Job
from ..runtime.protocol import samples_after
from .restarts import checkpoint_dir

log = logging.getLogger(__name__)
#: the elastic runtime's step sidecar (core/runtime/checkpoint.py CHECKPOINT_META, without its torch import)
STEP_FILE = "checkpoint.json"


def carry(logdir: Path, old: Job, new: Job) -> float:
    """Copy `old`'s checkpoint folder into `new`'s (not made yet): the samples `new` starts at
    (0.0: `old` left no checkpoint, `new` starts from the beginning). OSError when the folder
    cannot be read or written; nothing of `new`'s is left then."""
    src, dst = checkpoint_dir(logdir, old.id), checkpoint_dir(logdir, new.id)
    if src.is_symlink() or not src.is_dir():
        return 0.0
    t0 = time.monotonic()
    try:
        files, size = _copy(src, dst)
    except OSError:
        forget(logdir, new)
        raise
    log.info("job %s: copied the checkpoint of job %s (%d file(s), %.1f MB) in %.2f s", new.id, old.id, files,
             size / 1e6, time.monotonic() - t0)
    if not files:
        return 0.0
    if new.launcher == LAUNCHER_TORCHRUN:
        return min(float(old.samples_done), float(new.total_samples))
    try:
        step = int(json.loads((dst / STEP_FILE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0           # no runtime checkpoint written yet: it starts from step 0
    if step <= 0 or not new.global_batch:
        return 0.0
    return float(samples_after(step, int(new.total_samples), int(new.global_batch)))


def forget(logdir: Path, new: Job) -> None:
    """Remove what `carry` made for `new` (its registration was refused after the copy)."""
    shutil.rmtree(logdir / new.id, ignore_errors=True)


def _copy(src: Path, dst: Path) -> tuple[int, int]:
    """`src`'s tree into `dst` (which must not exist yet): files with their modes and times, links
    as links; as root, each entry keeps its owner (the job's account). (files, bytes)."""
    dst.parent.mkdir(mode=0o700, parents=True, exist_ok=True)     # the job's folder: the harvester's (folders.py)
    dst.mkdir(parents=True)
    files = size = 0
    names = sorted(os.listdir(src), key=lambda n: (n != STEP_FILE, n))
    for name in names:
        s, d = src / name, dst / name
        st = os.lstat(s)
        if name.startswith(".") and name.endswith(".tmp"):
            continue                                    # a save in progress: not a checkpoint
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(s), d)
        elif stat.S_ISDIR(st.st_mode):
            n, b = _copy(s, d)
            files, size = files + n, size + b
        elif stat.S_ISREG(st.st_mode):
            shutil.copy2(s, d, follow_symlinks=False)
            files, size = files + 1, size + st.st_size
        else:
            continue                                    # a socket, a fifo: nothing to resume from
        if os.geteuid() == 0:
            os.lchown(d, st.st_uid, st.st_gid)
    shutil.copystat(src, dst, follow_symlinks=False)
    if os.geteuid() == 0:
        sst = os.lstat(src)
        os.lchown(dst, sst.st_uid, sst.st_gid)
    return files, size
