"""Processes: a module of this repository run as `python -m` from its root, and the worker
processes a job left behind."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.files import ROOT


def run_module(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def last_json(r: subprocess.CompletedProcess) -> dict:
    """A bench's result: the last stdout line of a run that must have succeeded."""
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def leftovers(job_id: str) -> list[int]:
    """Live processes whose environment names this job (every worker gets HARVEST_JOB)."""
    out = []
    marker = f"HARVEST_JOB={job_id}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in env and state != "Z":
            out.append(int(pid))
    return out


def worker_pid(job_id: str, node: str):
    """The PID of the job's worker on `node` (its environment names both), or None."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"HARVEST_JOB={job_id}".encode() in env and f"HARVEST_NODE={node}".encode() in env:
            return int(pid)
    return None


def environ_of(pid: int) -> dict[str, str]:
    """A process's environment as it was started."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)


def processes_with_cmdline(tag: str) -> dict[int, str]:
    """Live processes whose command line holds `tag`: {pid: command line}."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if tag in cmd and state != "Z":
            out[int(entry.name)] = cmd.strip()
    return out


@pytest.fixture
def tag() -> Iterator[str]:
    """A number no other process has in its command line; whatever holds it is killed at the end."""
    t = f"{os.getpid()}{random.randint(100000, 999999)}"
    yield t
    for pid in processes_with_cmdline(t):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
