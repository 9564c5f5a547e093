"""Files only this Unix user may read, written so that a crash leaves the old file or the whole
new one, never a part: the login key, the pilot hub's identity, a job's coordinator identity."""
from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text` at once, readable by this Unix user only."""
    tmp = private_copy(path, text)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def link_private(path: Path, text: str) -> None:
    """Put a whole private file at `path` unless one is there already (a racing process's
    file wins if it came first)."""
    tmp = private_copy(path, text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def private_copy(path: Path, text: str) -> Path:
    """`text` in a new file beside `path`, mode 0600, flushed to disk."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp
