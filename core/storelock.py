"""One harvester per store: an exclusive advisory lock on `<db>.lock` (of the path with its
symlinks resolved) and, on this host, on a lock file named by the store's inode (its hard links),
held while the harvester runs, so a second process on the same --db is refused before it touches the store (with
--fresh it would wipe the first one's run; on Slurm it would cancel the first one's pilots). The file is removed on release; a process that locked it just as
it was removed sees that its inode is gone and locks the new one."""
from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from pathlib import Path
from typing import Optional

from .errors import StoreError


class StoreLock:
    def __init__(self, db: str | Path) -> None:
        self.db = str(db)
        self.path = Path(os.path.realpath(self.db) + ".lock")    # the same file through a symlink too
        self._held: list[tuple[Path, int]] = []

    @property
    def held(self) -> bool:
        return bool(self._held)

    def acquire(self) -> None:
        """Take the lock (a no-op when held); StoreError when another process holds it, under
        this name, a symlink's or (on this host) a hard link's: the store's inode is locked too."""
        if self._held:
            return
        self._held.append((self.path, self._take(self.path)))
        inode = self._inode_path()
        if inode is None:
            return
        try:
            self._held.append((inode, self._take(inode)))
        except StoreError:
            self.release()
            raise

    def _inode_path(self) -> Optional[Path]:
        """A lock file named by the store's device and inode, in a folder every account may
        write (sticky, like /tmp), for the names of the store that are hard links; None when the
        store does not exist yet or that folder cannot be had."""
        try:
            st = os.stat(self.db)
            folder = Path(tempfile.gettempdir()) / "harvest-store-locks"
            folder.mkdir(mode=0o1777, exist_ok=True)
        except OSError:
            return None
        return folder / f"{st.st_dev}-{st.st_ino}.lock"

    def _take(self, path: Path) -> int:
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as e:
                todo = "create the folder" if e.errno == errno.ENOENT else "make the store's folder writable"
                raise StoreError(self.db, f"cannot create the lock file {path} ({e.strerror}): {todo}, "
                                          "or give another --db") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise StoreError(self.db, f"in use by another harvester (pid {holder}); stop it first, or give "
                                          "this one another --db") from None
            if _is_current(path, fd):
                break
            os.close(fd)         # its holder removed it as we opened it: lock the new file
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def holder(self) -> Optional[int]:
        """The PID of another live process that holds this store's lock, read without locking or
        writing anything (a check before a start); None when there is none: no lock file, no PID
        in it, or one no longer running."""
        try:
            pid = int(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            return None
        if pid <= 0 or pid == os.getpid():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass                  # another account's process: alive
        return pid

    def release(self) -> None:
        """Remove each lock file (still holding it, so nobody locks the removed file), then drop it."""
        for path, fd in reversed(self._held):
            path.unlink(missing_ok=True)
            os.close(fd)
        self._held = []


def _is_current(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
