"""Running a worker as another Unix account: the site's launcher, a command prefix such as
`sudo -n -u {user} --preserve-env={env} --`, put before the job's argv on the node.

Mechanism only: which account a job runs as is decided when it is registered (the users file's
`unix` field, see core/admission.py) and kept on the job; this module only turns "argv as user U
with these variables" into the argv to start. The prefix is a list of literal words (never a
shell), in which `{user}` is the account and `{env}` the comma-separated names of the variables
the harvester passes (sudo resets the environment; `--preserve-env=NAMES` keeps exactly those,
so their values never appear on a command line).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Iterable, Sequence

#: the placeholders a launcher may hold
PLACEHOLDERS = ("user", "env")
#: a POSIX account name as useradd accepts it (no leading '-', at most 32 characters)
UNIX_NAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
_FIELD = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True)
class RunAs:
    """A launcher prefix, checked once (`parse`), applied per worker (`argv`)."""
    words: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> "RunAs":
        """The launcher from its text as a site writes it (split like a shell would, run without
        one); ValueError naming what is wrong."""
        try:
            words = tuple(shlex.split(text))
        except ValueError as e:
            raise ValueError(f"cannot split {text!r} into words ({e})") from None
        if not words:
            raise ValueError("give the launcher's words, e.g. 'sudo -n -u {user} --preserve-env={env} --'")
        if any("\0" in w for w in words):
            raise ValueError("NUL byte in the launcher")
        for w in words:
            for name in _FIELD.findall(w.replace("{{", "").replace("}}", "")):
                if name not in PLACEHOLDERS:
                    raise ValueError(f"unknown placeholder {{{name}}} in {w!r}: use {{user}} and {{env}}")
        try:
            for w in words:
                w.format(user="u", env="e")
        except (ValueError, IndexError, KeyError) as e:
            raise ValueError(f"bad braces in {text!r} ({e}): write a literal brace as {{{{ or }}}}") from None
        if not any("{user}" in w for w in words):
            raise ValueError("the launcher must name the account with {user}")
        return cls(words)

    def argv(self, user: str, env_names: Iterable[str], argv: Sequence[str]) -> list[str]:
        """`argv` prefixed to run as `user` with the variables `env_names` kept."""
        if not UNIX_NAME.match(user):
            raise ValueError(f"{user!r} is not a Unix account name")
        names = ",".join(sorted(env_names))
        return [w.format(user=user, env=names) for w in self.words] + list(argv)

    def __str__(self) -> str:
        return shlex.join(self.words)
