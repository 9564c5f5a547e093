"""Jobs that run as their owner's Unix account inside a Slurm pilot (`--source slurm --run-as`).

The site's launcher (core/transports/runas.py, e.g. `sudo -n -u {user} --preserve-env={env} --`)
is applied by the pilot on the node, not by the harvester: `{env}` must name every variable the
worker gets, and besides the job's own these are the pilot's Slurm binding (its SLURM_* and the
GPUs Slurm bound to it, DEVICE_ENV), which only the pilot knows. So the dispatcher's launcher is
a `PilotLauncher`: it returns the job's argv unchanged, tagged with the account and the
launcher's words (`LaunchAs`), and the pilot transport sends both to the pilot (`start` with
`run_as`), which puts the launcher before the argv with the names it passes (`names_kept`).

Only the standard library: the pilot imports this.
"""
from __future__ import annotations

import os
import shlex
from typing import Iterable, Mapping, Sequence

from ..transports.base import DEVICE_ENV
from ..transports.runas import UNIX_NAME, RunAs

#: the pilot's own variables a job run as another account keeps (besides the job's own): its
#: Slurm job and the devices Slurm bound to it, and the locale. Not PATH, HOME, USER, LOGNAME,
#: SHELL or TMPDIR: those are the pilot's account's, and the launcher sets the owner's.
KEPT_PREFIXES = ("SLURM_", "LC_")
KEPT_NAMES = (*DEVICE_ENV, "LANG", "LANGUAGE", "TZ")


class LaunchAs(list):
    """A job's argv (the list itself) with the account it runs as and the launcher's words: what
    `PilotLauncher.argv` gives the dispatcher, which hands it to the pilot transport unchanged."""

    def __init__(self, argv: Iterable[str], user: str, words: Sequence[str]) -> None:
        super().__init__(argv)
        self.user = user
        self.words = tuple(words)

    def wire(self) -> dict:
        """What the pilot is sent (`run_as` of a start request)."""
        return {"user": self.user, "launcher": list(self.words)}


class PilotLauncher(RunAs):
    """The site's launcher as the dispatcher sees it on Slurm: it leaves the argv to the pilot."""

    @classmethod
    def of(cls, launcher: RunAs) -> "PilotLauncher":
        return cls(launcher.words)

    def argv(self, user: str, env_names: Iterable[str], argv: Sequence[str]) -> list[str]:
        if not UNIX_NAME.match(user):
            raise ValueError(f"{user!r} is not a Unix account name")
        return LaunchAs(argv, user, self.words)


def names_kept(environ: Mapping[str, str]) -> set[str]:
    """The pilot's variables (of `environ`) a worker run as another account keeps."""
    return {k for k in environ if k.startswith(KEPT_PREFIXES) or k in KEPT_NAMES}


def launch_argv(run_as: Mapping, argv: Sequence[str], env: Mapping[str, str],
                environ: Mapping[str, str] = os.environ) -> list[str]:
    """In the pilot: `argv` behind the launcher of a start request's `run_as`, with `{env}` the
    job's variables and the pilot's kept ones (ValueError for a malformed request)."""
    words = run_as.get("launcher")
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ValueError("run_as.launcher must be a list of words")
    launcher = RunAs.parse(shlex.join(words))
    return launcher.argv(str(run_as.get("user", "")), set(env) | names_kept(environ), argv)
