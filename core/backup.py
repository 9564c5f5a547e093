"""Back up a harvester's store while it runs, and put a backup back in place.

    python -m core.backup STORE BACKUP             # online: the harvester keeps running and writing
    python -m core.backup --restore BACKUP STORE   # the harvester stopped (refused while one holds STORE)

The copy is SQLite's online backup (the backup API in one step: one read transaction, which in
WAL mode never blocks the harvester's writes), written beside BACKUP as `BACKUP.part`, checked
with `PRAGMA integrity_check` and only then renamed to BACKUP: a BACKUP that exists is whole. The
files that belong to the run go with it: `<store>.secret` (the key that signs logins) and
`<store>.hub` (the Slurm hub's certificate and token) become `BACKUP.secret` and `BACKUP.hub`
(mode 0600). The users file and `<store>.workers/` (checkpoints) are ordinary files: copy them
as they are (docs/operators/service.md).

A restore takes the store's lock first (the one a harvester holds while it runs, core.storelock),
so it is refused while a harvester uses STORE, and no harvester can start while it works. It
checks the backup, moves the current store and its -wal and -shm files aside
(`STORE.before-restore-<time>`), copies the backup in (the backup API again), and the
`.secret`/`.hub` files with it. The next start with the same --db continues the backed-up run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Optional

from .errors import StoreError
from .store import read_only
from .storelock import StoreLock

#: files kept beside a store that belong to its run (suffixes of its path)
COMPANIONS = (".secret", ".hub")
BUSY_TIMEOUT_S = 30.0


def _open_existing(path: Path) -> sqlite3.Connection:
    """A connection to a store that must exist (a plain connect would create an empty one)."""
    if not path.is_file():
        raise StoreError(str(path), "no such store")
    return sqlite3.connect(f"file:{path.resolve()}?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S)


def check(path: Path) -> None:
    """PRAGMA integrity_check on a copy; StoreError unless it answers ok."""
    with closing(read_only(path)) as conn:
        rows = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
    if rows != ["ok"]:
        raise StoreError(str(path), f"the copy fails SQLite's integrity check: {'; '.join(rows[:3])}")


def _copy(src: sqlite3.Connection, dest: Path) -> int:
    """The whole database behind `src` into the new file `dest` (fsynced); its size in bytes."""
    dest.unlink(missing_ok=True)
    with closing(sqlite3.connect(dest)) as out:
        src.backup(out)                  # pages=-1: one step, one read transaction
        out.execute("PRAGMA journal_mode=DELETE")     # one self-contained file, no -wal beside it
    fd = os.open(dest, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return dest.stat().st_size


def _companions(src: Path, dest: Path) -> list[str]:
    copied = []
    for suffix in COMPANIONS:
        a, b = Path(str(src) + suffix), Path(str(dest) + suffix)
        if a.is_file():
            tmp = Path(str(b) + ".part")
            shutil.copyfile(a, tmp)
            os.chmod(tmp, 0o600)
            os.replace(tmp, b)
            copied.append(b.name)
    return copied


def backup(store: Path, dest: Path) -> str:
    """An online copy of `store` at `dest` (and its run's key files); a line saying what was done."""
    store, dest = Path(store), Path(dest)
    if dest.resolve() == store.resolve():
        raise StoreError(str(dest), "the backup would replace the store itself: name another file")
    t0 = time.monotonic()
    part = Path(str(dest) + ".part")
    try:
        with closing(_open_existing(store)) as src:
            size = _copy(src, part)
        check(part)
        os.chmod(part, 0o600)
        os.replace(part, dest)
    except sqlite3.Error as e:
        part.unlink(missing_ok=True)
        raise StoreError(str(store), f"cannot back up ({e})") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    extra = _companions(store, dest)
    with_ = f", with {', '.join(extra)}" if extra else ""
    return (f"backed up {store} to {dest} ({size / 1e6:.1f} MB, integrity ok{with_}) "
            f"in {time.monotonic() - t0:.2f} s")


def restore(source: Path, store: Path, now: Optional[float] = None) -> str:
    """Put the backup `source` in place of `store`, whose harvester must be stopped."""
    source, store = Path(source), Path(store)
    if not source.is_file():
        raise StoreError(str(source), "no such backup")
    check(source)
    lock = StoreLock(store)
    lock.acquire()                       # StoreError while a harvester runs on the store
    try:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(now))
        aside = []
        for suffix in ("", "-wal", "-shm", *COMPANIONS):
            p = Path(str(store) + suffix)
            if p.exists():
                target = Path(f"{store}.before-restore-{stamp}{suffix}")
                os.replace(p, target)
                aside.append(target.name)
        try:
            with closing(_open_existing(source)) as src:
                _copy(src, store)
            os.chmod(store, 0o600)
        except sqlite3.Error as e:
            raise StoreError(str(store), f"cannot restore ({e})") from None
        _companions(source, store)
    finally:
        lock.release()
    moved = f"; the old files moved aside: {', '.join(aside)}" if aside else ""
    return f"restored {source} to {store}{moved}"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m core.backup", description=__doc__.splitlines()[0])
    ap.add_argument("--restore", action="store_true",
                    help="put BACKUP back as STORE (give BACKUP first); the harvester must be stopped")
    ap.add_argument("source", type=Path, help="the store (or, with --restore, the backup)")
    ap.add_argument("dest", type=Path, help="the backup file (or, with --restore, the store)")
    args = ap.parse_args(argv)
    try:
        print(restore(args.source, args.dest) if args.restore else backup(args.source, args.dest))
    except (StoreError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
