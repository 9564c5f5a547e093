"""Small trace and job-set files written into a test's own folder, and the repository root."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

JOBSET_HEADER = ("job,model,submit_time,min_nodes,max_nodes,total_samples,scale_up_seconds,"
                 "scale_down_seconds,nodes,samples_per_second")


def write_trace(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path.write_text("time,node,state\n" + "".join(f"{t},{n},{s}\n" for t, n, s in rows))
    return path


def write_jobset(path: Path, rows: list[str]) -> Path:
    path.write_text(JOBSET_HEADER + "\n" + "".join(r + "\n" for r in rows))
    return path
