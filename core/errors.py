"""Errors about bad input that name where the problem is, so a person can fix the file."""
from __future__ import annotations


class InputError(ValueError):
    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path, self.line, self.message = str(path), line, message
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
