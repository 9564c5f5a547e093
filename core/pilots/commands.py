"""A batch scheduler's command-line tools, run the one way both providers need: from a folder
of the site's choosing (or PATH), with an environment of their own (SLURM_CONF, PBS_CONF_FILE),
each under a timeout. A scheduler that does not answer, cannot be run or refuses raises the
provider's Unavailable error with its last word, so the source turns stale instead of hanging."""
from __future__ import annotations

import os
import subprocess
from typing import Callable, Mapping, Optional, Sequence, TypeVar

from .base import SchedulerUnavailable, SchedulerUnreadable, Unparsable

T = TypeVar("T")


class Commands:
    #: what a provider raises when its scheduler cannot be asked, and when its output cannot be read
    unavailable: type[SchedulerUnavailable] = SchedulerUnavailable
    unreadable: type[SchedulerUnreadable] = SchedulerUnreadable
    title = "the scheduler"

    def __init__(self, env: Mapping[str, str], timeout_s: float, bin_dir: str) -> None:
        self.env = {**os.environ, **env}
        self.timeout_s = timeout_s
        self.bin_dir = bin_dir

    def _call(self, argv: Sequence[str], stdin: Optional[str] = None,
              env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
        cmd = [os.path.join(self.bin_dir, argv[0]) if self.bin_dir else argv[0], *argv[1:]]
        try:
            return subprocess.run(cmd, env={**self.env, **(env or {})}, input=stdin,
                                  capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise self.unavailable(f"{argv[0]} did not answer within {self.timeout_s:g} s") from None
        except OSError as e:
            raise self.unavailable(f"cannot run {cmd[0]}: {e.strerror or e}") from e

    def _run(self, argv: Sequence[str], stdin: Optional[str] = None,
             env: Optional[Mapping[str, str]] = None) -> str:
        """The command's output; Unavailable with its last error line if it failed."""
        r = self._call(argv, stdin, env)
        if r.returncode != 0:
            err = r.stderr.strip().splitlines()
            raise self.unavailable(f"{argv[0]}: {err[-1] if err else f'exit status {r.returncode}'}")
        return r.stdout

    def version(self) -> object:
        raise NotImplementedError

    def _read(self, what: str, parse: Callable[[str], list[T]], argv: Sequence[str]) -> list[T]:
        """`argv`'s output parsed; Unreadable naming what, the scheduler and its version if it cannot be."""
        version = self.version()
        out = self._run(argv)
        try:
            return parse(out)
        except Unparsable as e:
            raise self.unreadable(f"cannot read the {what} of {self.title} {version}: {e}") from None
