"""The harvester's log: one line per record on stderr, with its level and logger, for the journal
(`journalctl -u harvester`) or any collector. `text`: `2024-05-01 12:00:00,123 INFO core.controller:
message`; `json`: one object per line (`time`, `level`, `logger`, `message`, and `exception` with
the traceback when there is one). A message or traceback over several lines stays on one line
(its line breaks written as `\\n`), so that a record is never split across journal entries."""
from __future__ import annotations

import json
import logging
import sys
import time

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class OneLine(logging.Formatter):
    """The text format, each record on one line."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\r", "").replace("\n", "\\n")


class JsonLines(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                       + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        return json.dumps(out, default=str)


def setup(fmt: str = "text", level: str = "info") -> None:
    """The root logger to stderr in `fmt` (text or json) from `level` up; APScheduler's routine
    chatter (a tick skipped while the last one runs) from warnings up."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if fmt == "json" else OneLine(TEXT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.captureWarnings(True)
