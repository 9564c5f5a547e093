"""The last lines of a worker's log, in time and memory bounded by what is read: a job that
writes a 30 MB line, or gigabytes of output, costs one read of at most `MAX_READ_BYTES` from the
file's end, and every line handed on is at most `MAX_LINE_BYTES` (longer ones cut and marked).

Mechanism shared by the transports (a local file, the bytes `tail -c` sent over ssh) and by the
logs of ended jobs (core/worklogs.py), so that progress matching, failure naming and the logs
endpoint all see the same bounded text.
"""
from __future__ import annotations

import os
import stat
from typing import BinaryIO

#: bytes read from a log's end at most, per read: lines that long on average come back fewer
MAX_READ_BYTES = 1 << 20
#: a line longer than this is cut to its first MAX_LINE_BYTES and marked (`cut_mark`)
MAX_LINE_BYTES = 8 << 10
#: the start of a line whose beginning lies before what was read
EARLIER = "…"
BLOCK = 8 << 10
_BREAKS = (b"\n", b"\r")


def cut_mark(dropped: int) -> str:
    """What ends a line cut to MAX_LINE_BYTES: how many of its bytes were left out."""
    return f" …[cut {dropped} bytes]"


def read_end(f: BinaryIO, lines: int, max_bytes: int = MAX_READ_BYTES) -> tuple[bytes, bool]:
    """(the bytes at the end of the open file holding its last `lines` lines, or its last
    `max_bytes`; whether they begin at a line's start). Each block is scanned once: linear in
    the bytes read."""
    end = pos = f.seek(0, os.SEEK_END)
    blocks: list[bytes] = []
    breaks = 0           # line breaks seen: \r\n split across two blocks counts twice, hence + blocks
    while pos > 0 and breaks <= lines + len(blocks) and end - pos < max_bytes:
        step = min(BLOCK, pos, max_bytes - (end - pos))
        pos -= step
        f.seek(pos)
        block = f.read(step)
        blocks.append(block)
        breaks += block.count(b"\n") + block.count(b"\r") - block.count(b"\r\n")
    whole = pos == 0
    if not whole:
        f.seek(pos - 1)
        whole = f.read(1) in _BREAKS
    return b"".join(reversed(blocks)), whole


def last_lines(data: bytes, lines: int, whole: bool = True, max_line: int = MAX_LINE_BYTES) -> list[str]:
    """The last `lines` lines of `data` (split as str.splitlines does), each cut to `max_line`
    bytes. `whole`: `data` begins at a line's start; if not, its first line, where it is kept,
    starts with EARLIER."""
    if lines <= 0 or not data:
        return []
    text = data.decode("utf-8", "replace")
    out = text.splitlines()
    partial = not whole
    if len(out) > lines:
        out, partial = out[-lines:], False
    out = [_cut(line, max_line) for line in out]
    if partial and out:
        out[0] = EARLIER + out[0]
    return out


def _cut(line: str, max_line: int) -> str:
    """The line, or its first `max_line` bytes and how many more there were."""
    if len(line) <= max_line // 4:
        return line                              # at most 4 bytes a character: short enough
    raw = line.encode("utf-8", "replace")
    if len(raw) <= max_line:
        return line
    return raw[:max_line].decode("utf-8", "ignore") + cut_mark(len(raw) - max_line)


def tail_path(path: str, lines: int, flags: int = 0, max_bytes: int = MAX_READ_BYTES) -> list[str]:
    """The last `lines` lines of the regular file at `path`; [] when it cannot be read or is
    no regular file (a FIFO would block). `flags`: more os.open flags (O_NOFOLLOW)."""
    if lines <= 0:
        return []
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | flags)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        with os.fdopen(os.dup(fd), "rb") as f:
            data, whole = read_end(f, lines, max_bytes)
    except OSError:
        return []
    finally:
        os.close(fd)
    return last_lines(data, lines, whole)
