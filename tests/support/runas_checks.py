"""What the run-as tests (tests/test_slurm_run_as.py, tests/test_pbs_run_as.py) share: the job a
mapped login registers (the real elastic worker under the system's python, which every account
can run) and how a test reads who a rank runs as and what it runs under."""
from __future__ import annotations

import json
import os
import sysconfig
from pathlib import Path
from typing import Optional

from tests.support.accounts import SUDO
from tests.support.server import ROOT, USERS, write_users
from tests.support.slurm import parent, processes_with_env

#: the elastic worker as another account runs it: the system's python (3.11, like the venv's),
#: the checkout and the venv's packages on its path
PYTHON = "/usr/bin/python3"
COMMAND = ["/usr/bin/env", f"PYTHONPATH={ROOT}:{sysconfig.get_paths()['purelib']}", PYTHON,
           "examples/digits_cnn.py", "--step-seconds", "0.05", "--log-every", "1000000", "--checkpoint-every", "1"]

def users_file(path: Path, unix: dict[str, str]) -> Path:
    """The test's users, `unix` mapping logins to accounts, written as `python -m app.users` does (0600)."""
    write_users(path, {**USERS, "carol": "user"})
    data = json.loads(path.read_text())
    for u in data["users"]:
        if u["name"] in unix:
            u["unix"] = unix[u["name"]]
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    return path


def register(app, login: str, max_nodes: int = 2) -> tuple[int, dict]:
    return app.request("POST", "/api/jobs", {
        "name": f"{login}'s digits", "min_nodes": 1, "max_nodes": max_nodes, "total_samples": 64 * 10**6,
        "curve": f"1:100, {max_nodes}:{100 * max_nodes}", "scale_up_seconds": 0, "scale_down_seconds": 0,
        "global_batch": 64, "command": COMMAND}, token=app.token(login))


def uids(pid: int) -> Optional[tuple[int, ...]]:
    """Real, effective, saved and file-system uid of `pid` (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return tuple(int(x) for x in line.split()[1:])
    except OSError:
        return None
    return None


def ranks(job: str, node: Optional[str] = None) -> dict[int, bytes]:
    """The job's worker processes (on `node`): those with its variables, less the launcher (sudo
    keeps them too, as the pilot's account)."""
    return {pid: env for pid, env in processes_with_env(f"HARVEST_JOB={job}").items()
            if exe(pid) not in ("", SUDO) and (node is None or f"HARVEST_NODE={node}".encode() in env.split(b"\0"))}


def exe(pid: int) -> str:
    """The name of the program `pid` runs ('' once it is gone)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


def describe(pids) -> list[tuple]:
    """What a test that waited in vain says about `pids`: program, uids, parent, command line."""
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120].decode()
        except OSError:
            cmd = "?"
        out.append((pid, exe(pid), uids(pid), parent(pid), cmd))
    return out


def env_of(env: bytes) -> dict[str, str]:
    return dict(v.decode().partition("=")[::2] for v in env.split(b"\0") if b"=" in v)


def ancestors(pid: int) -> list[int]:
    out = []
    while (pid := parent(pid) or 0) > 1:
        out.append(pid)
    return out
