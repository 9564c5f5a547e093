"""A --pace-file for the example jobs (examples/pace.py): a test holds a job at a slow pace while
it watches the job regroup, then lets the rest of the job run at full speed instead of sitting
out the pace for the thousand steps left."""
from __future__ import annotations

import os
from pathlib import Path


class PaceFile:
    def __init__(self, folder: Path, seconds: float) -> None:
        self.seconds = seconds
        self.path = Path(folder) / "pace"
        self.set(seconds)

    @property
    def args(self) -> list[str]:
        """The job's command-line options: the pace itself, and the file that can change it."""
        return ["--step-seconds", str(self.seconds), "--pace-file", str(self.path)]

    def set(self, seconds: float) -> None:
        """Write-then-rename, so a rank never reads half a number."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(f"{seconds}\n")
        os.replace(tmp, self.path)

    def release(self) -> None:
        self.set(0)
