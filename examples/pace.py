"""How long a step of an example job lasts at least: a stand-in for a bigger model in demos and
tests. Imports nothing but the standard library, so examples/torchrun_digits.py loads it by its
path like examples/data.py and stays a script that can be copied anywhere with them."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional


class Pace:
    """The least time a step takes: --step-seconds, or the number in --pace-file while that file
    holds one (read again whenever it changes), so a demo or a test can hold a job slow while it
    watches the job regroup and then let it finish at full speed."""

    def __init__(self, seconds: float, path: Optional[str] = None) -> None:
        self.default, self.path = seconds, path
        self.value, self.seen = seconds, None

    def seconds(self) -> float:
        if self.path is None:
            return self.default
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)     # a rename is a new inode, however quick
        except OSError:
            key = None
        if key != self.seen:
            self.seen, self.value = key, self.default
            if key is not None:
                try:
                    self.value = max(0.0, float(Path(self.path).read_text()))
                except (OSError, ValueError):
                    self.seen = None        # half-written or unreadable: the default until it reads
        return self.value

    def hold(self, started: float) -> None:
        """Sleep out the rest of a step that began at `started` (time.monotonic())."""
        floor = self.seconds()
        if floor:
            time.sleep(max(0.0, floor - (time.monotonic() - started)))
