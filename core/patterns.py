"""Regular expressions over what jobs print: RE2 (google-re2), whose matching is linear in the
text, so that no pattern and no line can backtrack for seconds while holding the GIL (Python's
`re` takes minutes for `(a+)+$` on 30 characters). RE2 has no backreferences and no lookaround;
a user's pattern is checked at registration (`check`) and compiled once (`compiled`).

Numbers read from job output pass `count`: only finite, non-negative values are progress.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Optional, Sequence

import re2

#: a progress pattern's length at most, in characters
PATTERN_MAX_CHARS = 500
#: a progress pattern's compiled size at most (RE2's program size; `samples=(\d+)` is 16)
PROGRAM_MAX = 2000
PATTERN_CACHE = 512

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


def fixed(pattern: str) -> Any:
    """One of the harvester's own patterns, compiled for RE2 (an error here is a bug: raises)."""
    return re2.compile(pattern, _OPTIONS)


@functools.lru_cache(maxsize=PATTERN_CACHE)
def _compile(pattern: str) -> tuple[Any, str]:
    """(the compiled pattern, '') or (None, why it is refused)."""
    if len(pattern) > PATTERN_MAX_CHARS:
        return None, f"at most {PATTERN_MAX_CHARS} characters"
    try:
        rx = re2.compile(pattern, _OPTIONS)
    except re2.error as e:
        why = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        return None, (f"not a pattern RE2 accepts ({why}); progress patterns use RE2 syntax: "
                      "no backreferences, no lookahead or lookbehind")
    if rx.programsize > PROGRAM_MAX:
        return None, f"too complex ({rx.programsize} RE2 instructions, at most {PROGRAM_MAX}): use fewer repetitions"
    if rx.groups < 1:
        return None, "needs a group for the samples, e.g. samples=(\\d+)"
    return rx, ""


def check(pattern: str) -> str:
    """The pattern, if it can be a progress pattern; else ValueError with the reason."""
    rx, why = _compile(pattern)
    if rx is None:
        raise ValueError(why)
    return pattern


def refused(pattern: str) -> str:
    """Why the pattern cannot be matched ('' when it can): one stored before these rules."""
    return _compile(pattern)[1]


def count(text: Optional[str], scale: float = 1.0) -> Optional[float]:
    """A count read from job output, times `scale`: None unless a finite, non-negative number
    (`nan`, `inf`, `-5`, `1e999` and overflowing products are no progress)."""
    if text is None:
        return None
    try:
        value = float(text) * scale
    except (ValueError, OverflowError):
        return None
    return value + 0.0 if math.isfinite(value) and value >= 0 else None     # + 0.0: -0 is 0


def last_count(pattern: str, lines: Sequence[str], scale: float = 1.0) -> Optional[float]:
    """Group 1 of the last line matching `pattern` that holds a valid count (`count`), times
    `scale`; None when none does or the pattern is refused."""
    rx, _ = _compile(pattern)
    if rx is None:
        return None
    for line in reversed(lines):
        m = rx.search(line)
        if m is not None:
            value = count(m.group(1), scale)
            if value is not None:
                return value
    return None
