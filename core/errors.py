"""Errors about bad input that name where the problem is, so a person can fix the file."""
from __future__ import annotations

import re
from typing import Callable, Optional


class InputError(ValueError):
    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path, self.line, self.message = str(path), line, message
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")


class SettingsError(ValueError):
    """A setting out of range or at odds with another. `field` is its dotted path in
    `core.settings.HarvesterSettings` (`replay.hours`, `live.dispatch`); the message names other
    settings as `{path}`, which each front end renders in its own words (the CLI: its flags);
    `{{` and `}}` are literal braces (a launcher's own `{user}`)."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(self.render())

    def within(self, prefix: str) -> "SettingsError":
        """The same error one level down (`hours` inside `replay` -> `replay.hours`)."""
        err = SettingsError(f"{prefix}.{self.field}" if self.field else prefix,
                            _PLACEHOLDER.sub(lambda m: "{" + f"{prefix}.{m.group(1)}" + "}", self.message))
        return err

    def render(self, names: Optional[Callable[[str], str]] = None) -> str:
        """`field: message`, every setting named by `names(path)` (default: its last part)."""
        name = names or (lambda path: path.rsplit(".", 1)[-1])
        text = _PLACEHOLDER.sub(lambda m: name(m.group(1)), self.message).replace("{{", "{").replace("}}", "}")
        return f"{name(self.field)}: {text}" if self.field else text


_PLACEHOLDER = re.compile(r"(?<!\{)\{([a-z_][a-z0-9_.]*)\}(?!\})")


class StoreError(InputError):
    """The store file cannot be used (damaged, unreadable, read-only, in use): one line that
    names the file and says what to do, never a traceback."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(path, None, message)
