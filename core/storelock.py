"""One harvester per store: an exclusive advisory lock on `<db>.lock`, held while the harvester
runs, so a second process on the same --db is refused before it touches the store (with
--fresh it would wipe the first one's run; on Slurm it would cancel the first one's pilots). The file is removed on release; a process that locked it just as
it was removed sees that its inode is gone and locks the new one."""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Optional

from .errors import StoreError


class StoreLock:
    def __init__(self, db: str | Path) -> None:
        self.db = str(db)
        self.path = Path(self.db + ".lock")
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock (a no-op when held); StoreError when another process holds it."""
        if self._fd is not None:
            return
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as e:
                todo = "create the folder" if e.errno == errno.ENOENT else "make the store's folder writable"
                raise StoreError(self.db, f"cannot create the lock file {self.path} ({e.strerror}): {todo}, "
                                          "or give another --db") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise StoreError(self.db, f"in use by another harvester (pid {holder}); stop it first, or give "
                                          "this one another --db") from None
            if self._is_current(fd):
                break
            os.close(fd)         # its holder removed it as we opened it: lock the new file
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def _is_current(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the lock file (still holding it, so nobody locks the removed file), then drop it."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None
