"""Debian packages a test needs, installed with apt-get on first use (`make test` installs most
of them up front): one way for every test support module, failing loudly with apt's own words."""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Sequence

import pytest


def have(programs: Sequence[str]) -> bool:
    """Whether every program is on PATH or in /usr/sbin (root's daemons)."""
    return all(shutil.which(p) or os.path.exists(f"/usr/sbin/{p}") for p in programs)


def can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def install(packages: Sequence[str], timeout: float = 900) -> None:
    """apt-get update and install; the test fails with apt's output if either fails."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}", pytrace=False)


def ensure(programs: Sequence[str], packages: Sequence[str], what: str) -> None:
    """Install `packages` if a program is missing; the test fails where that cannot be done."""
    if have(programs):
        return
    if not can_install():
        pytest.fail(f"{what} is not installed and cannot be installed here (needs root and apt-get): "
                    f"apt-get install {' '.join(packages)}", pytrace=False)
    install(packages)
