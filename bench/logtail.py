"""Reading a log's last 40 lines: the block-joining reader the harvester had (each 8 KiB block
joined onto what was read, newlines counted again over all of it) against core/logtail.py's
(each block scanned once, at most MAX_READ_BYTES), on logs of one line without a newline.

    python -m bench.logtail [--sizes 5,10,20,30] [--skip-before]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import deque
from pathlib import Path

from core.logtail import tail_path

LINES = 40


def before(path: str, lines: int, block: int = 8192) -> list[str]:
    """The reader before issue 57 (core/transports/local.py tail_file), for comparison only."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        pos, data = f.tell(), b""
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    return list(deque(data.decode("utf-8", "replace").splitlines(), maxlen=lines))


def _timed(fn, path: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = fn(path, LINES)
    return time.perf_counter() - t0, sum(len(line) for line in out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="5,10,20,30", help="log sizes in MB, comma-separated")
    ap.add_argument("--skip-before", action="store_true", help="time only the bounded reader")
    args = ap.parse_args()
    print(f"{'MB':>4} {'before s':>9} {'chars':>10} {'now s':>8} {'chars':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for mb in (int(s) for s in args.sizes.split(",")):
            path = str(Path(tmp) / f"{mb}.log")
            with open(path, "wb") as f:
                for _ in range(mb):
                    f.write(b"x" * (1 << 20))
            old = ("-", "-") if args.skip_before else tuple(f"{v:.3f}" if isinstance(v, float) else v
                                                           for v in _timed(before, path))
            now_s, now_chars = _timed(tail_path, path)
            print(f"{mb:>4} {old[0]:>9} {old[1]:>10} {now_s:>8.4f} {now_chars:>7}")


if __name__ == "__main__":
    main()
