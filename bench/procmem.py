"""A process's memory as the kernel counts it, for the benchmarks that watch a server."""
from __future__ import annotations

from pathlib import Path


def memory_mib(pid: int) -> tuple[float, float]:
    """(resident, peak resident) MiB of `pid`, from /proc (VmRSS, VmHWM; kB there)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024.0
    return fields["VmRSS"], fields["VmHWM"]
