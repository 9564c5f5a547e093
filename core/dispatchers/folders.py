"""The workers' folder (`DB.workers/`) and each job's folder in it are the harvester's own: 0700,
and the logs in them 0600, so that no other account on the host lists the jobs or reads their
output. Where jobs run as their owners' accounts (`--run-as`) the workers' folder and such a
job's folder are 0711 instead: the account enters them to reach its checkpoint folder (its own,
0700), and lists nothing. Folders made by an earlier version (0755) are put right at start.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)
PRIVATE, PASSABLE, PRIVATE_FILE = 0o700, 0o711, 0o600


def prepare(logdir: Path, run_as: bool) -> None:
    """Make the workers' folder with its mode, and put right the modes of the job folders and
    files in it that are more open than theirs (one pass, once per start: folders already right
    are not read)."""
    top = PASSABLE if run_as else PRIVATE
    logdir.mkdir(mode=top, parents=True, exist_ok=True)
    _set(logdir, top)
    fixed = 0
    with os.scandir(logdir) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                fixed += _job_folder(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                fixed += _tighten(Path(entry.path), PRIVATE_FILE)
    if fixed:
        log.info("made %d folder(s) and file(s) under %s private to the harvester's account", fixed, logdir)


def _job_folder(folder: Path) -> int:
    """A job's folder: passable where its checkpoint folder is another account's, else private;
    its files (logs, the kept coordinator's identity) the harvester's only."""
    ckpt = folder / "checkpoint"
    owner_elsewhere = ckpt.is_dir() and ckpt.stat().st_uid != os.geteuid()
    mode = PASSABLE if owner_elsewhere else PRIVATE
    if not _set(folder, mode):
        return 0
    fixed = 1
    for f in folder.iterdir():
        if f.is_file() and not f.is_symlink():
            fixed += _tighten(f, PRIVATE_FILE)
    return fixed


def _set(path: Path, mode: int) -> bool:
    """`path` (ours) gets exactly `mode`; whether it changed."""
    st = path.stat()
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) == mode:
        return False
    os.chmod(path, mode)
    return True


def _tighten(path: Path, mode: int) -> int:
    """Take from `path`'s mode what `mode` does not grant (1 when it changed; ours only)."""
    st = path.stat()
    now = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid() or now & ~mode == 0:
        return 0
    os.chmod(path, now & mode)
    return 1
