"""Unix accounts a test makes for itself, and sudo to run processes as them: jobs that run as
their owner's account (`--run-as`) are tested with real accounts, created and removed here."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from contextlib import contextmanager
from typing import Iterator

import pytest

from tests.support import apt

SUDO = "sudo"
#: `python -m app --run-as` as a Debian site would write it
LAUNCHER = "sudo -n -u {user} --preserve-env={env} --"


def ensure_sudo() -> None:
    """apt-get install sudo if it is missing (`make test` installs it too); the test skips where
    that cannot be done (no root or no apt-get), since accounts cannot be made there either."""
    if os.geteuid() != 0:
        pytest.skip("creating Unix accounts and running jobs as them needs root")
    if shutil.which(SUDO):
        return
    if not shutil.which("apt-get"):
        pytest.skip("sudo is missing and cannot be installed here (no apt-get)")
    apt.install([SUDO], timeout=600)


@contextmanager
def unix_account(prefix: str = "harvtest") -> Iterator[str]:
    """A new account (no home, no login shell, its own group) named after this test process, so
    parallel runs never share one; at the end its processes are killed (by PID) and it is removed,
    and the test fails if any process of it was still running."""
    ensure_sudo()
    name = f"{prefix}{os.getpid()}"
    subprocess.run(["userdel", name], capture_output=True)        # left by a run that was killed
    subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    uid = pwd.getpwnam(name).pw_uid
    try:
        yield name
    finally:
        left = subprocess.run(["pgrep", "-u", str(uid)], capture_output=True, text=True).stdout.split()
        for pid in left:
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        subprocess.run(["userdel", name], capture_output=True)
        assert not left, f"processes of {name} were left running: {left}"
