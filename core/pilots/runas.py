"""Jobs that run as their owner's Unix account inside a Slurm pilot (`--source slurm --run-as`).

The site's launcher (core/transports/runas.py, e.g. `sudo -n -u {user} --preserve-env={env} --`)
is applied by the pilot on the node, not by the harvester: `{env}` must name every variable the
worker gets, and besides the job's own these are the pilot's Slurm binding (its SLURM_* and the
GPUs Slurm bound to it, DEVICE_ENV), which only the pilot knows. So the pilot transport's
`start_as` sends the account and the launcher's words (`start` with `run_as`), and the pilot
puts the launcher before the argv with the names it passes (`names_kept`).

Only the standard library: the pilot imports this.
"""
from __future__ import annotations

import os
import shlex
from typing import Mapping, Sequence

from ..transports.base import DEVICE_ENV
from ..transports.runas import RunAs
from .wire import SCHEDULER_PREFIXES

#: the pilot's own variables a job run as another account keeps (besides the job's own): its
#: batch job (SLURM_*, PBS_*) and the devices the scheduler bound to it, and the locale. Not PATH, HOME, USER, LOGNAME,
#: SHELL or TMPDIR: those are the pilot's account's, and the launcher sets the owner's.
KEPT_PREFIXES = (*SCHEDULER_PREFIXES, "LC_")
KEPT_NAMES = (*DEVICE_ENV, "LANG", "LANGUAGE", "TZ")


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
