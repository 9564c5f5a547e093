"""The harvester's log: one line per record on stderr, with its level and logger, for the journal
(`journalctl -u harvester`) or any collector. `text`: `2024-05-01 12:00:00,123 INFO core.controller:
message`; `json`: one object per line (`time`, `level`, `logger`, `message`, and `exception` with
the traceback when there is one). A message or traceback over several lines stays on one line
(its line breaks written as `\\n`), so that a record is never split across journal entries."""
from __future__ import annotations

import json
import logging
import sys
import threading
import time

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: APScheduler's logger, and the start of what it says when a tick comes while the last one runs
SCHEDULER_LOGGER = "apscheduler.scheduler"
SKIPPED = "maximum number of running instances reached"


class SkippedTicks(logging.Filter):
    """APScheduler warns each time a tick is due while the last one still runs (a slow step at a
    high replay speed: twice a second). That is routine, not a fault: such a record is counted
    (`count`, served as harvest_ticks_skipped_total) and written only at DEBUG."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if SKIPPED not in str(record.msg):
            return True
        with self._lock:
            self.count += 1
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


#: the one filter on APScheduler's logger (installed by `setup`), and its count
skipped_ticks = SkippedTicks()


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
    chatter from warnings up, and a tick skipped while the last one runs only counted
    (SkippedTicks), unless `level` is debug."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if fmt == "json" else OneLine(TEXT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    scheduler = logging.getLogger(SCHEDULER_LOGGER)
    if skipped_ticks not in scheduler.filters:
        scheduler.addFilter(skipped_ticks)
    logging.captureWarnings(True)
