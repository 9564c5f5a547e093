"""A pilot job as the source submits it, and what its output says when it failed: the batch
script, the environment that tells it where the hub is, and the last line of its log. The same
for every scheduler; each provider adds its own submit options (core/slurm/provider.py,
core/pbs/provider.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .settings import PilotSettings
from .wire import ENV_GRACE, ENV_HUB, ENV_HUB_SHA256, ENV_ORPHAN, ENV_TOKEN

PILOT_SCRIPT = """#!{python}
import sys
sys.path.insert(0, {root!r})
from core.pilots.pilot_job import main
sys.exit(main())
"""
#: how much of a failed pilot's log is read for its last line
LOG_TAIL_BYTES = 4096


@dataclass
class Pilot:
    job: str
    node: str
    submitted: float            # time.monotonic() when the submission returned (or when it said hello)
    running: bool = False       # it said hello
    releasing: bool = False     # cancelled as surplus: its node goes when it says goodbye
    adopted: bool = False       # left running by an earlier run: its node is held until it redials
    hello_at: Optional[float] = None  # time.monotonic() of its hello
    burst: int = 0              # the submissions it went with (core/pilots/joins.py); 0: none (adopted, or its hello came first)


def script(s: PilotSettings) -> str:
    return PILOT_SCRIPT.format(python=s.python, root=s.workdir)


def environment(s: PilotSettings, port: int, fingerprint: str, token: str) -> dict[str, str]:
    """What a pilot needs to find the hub and prove itself (added to the job's environment)."""
    return {ENV_HUB: f"{s.dial_host}:{port}", ENV_HUB_SHA256: fingerprint, ENV_TOKEN: token,
            ENV_GRACE: str(s.worker_grace_s), ENV_ORPHAN: str(s.orphan_timeout_s)}


def log_path(s: PilotSettings, job: str) -> str:
    return f"{s.log_dir}/pilot-{job}.log"


def last_line(path: str) -> str:
    """The last non-blank line of a file (its last LOG_TAIL_BYTES), cut to 300 characters; ''."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def why_failed(s: PilotSettings, pilot: Pilot, how: str, path: str = "") -> str:
    """`pilot 781 on pn1 ended before it connected: FAILED (NonZeroExitCode); its log: ...`.
    `path`: its log file (default: where a Slurm pilot's goes)."""
    if not s.log_dir:
        return f"pilot {pilot.job} on {pilot.node} {how}; no log (--slurm-pilot-logs names a folder for them)"
    path = path or log_path(s, pilot.job)
    line = last_line(path)
    where = (f"its log: {line}" if line else "its log is empty" if Path(path).exists()
             else f"no log at {path} (can the node write to {s.log_dir}, and is it shared with this host?)")
    return f"pilot {pilot.job} on {pilot.node} {how}; {where}"
