"""The harvester's own life in the event log, decided from what the store says of the last run:
a new run; a run taken up again; and, before that, a crash when the last run never recorded a
clean stop (killed, crashed, the machine went down). Each running or queued job gets the restart
and the crash in its own log too, so its page says why it paused."""
from __future__ import annotations

from typing import Optional, Sequence

from .model import Event, EventKind
from .timeutil import iso


def life_events(now: float, starts: int, clean_stop: Optional[bool], last_saved: Optional[float],
                jobs: Sequence[str]) -> list[Event]:
    """Events for this start (`starts`: earlier starts on this store; `clean_stop`: whether the
    last one recorded its stop, None where the store predates the record)."""
    if starts == 0:
        return [Event(now, EventKind.HARVESTER_START, detail="a new run on this store")]
    out: list[Event] = []
    if clean_stop is False:
        when = f" after {iso(last_saved)}" if last_saved is not None else ""
        crash = f"the harvester stopped without a clean shutdown{when} (killed or crashed); found at restart"
        out += [Event(now, EventKind.HARVESTER_CRASH, detail=crash)]
        out += [Event(now, EventKind.HARVESTER_CRASH, job=j, detail=crash) for j in jobs]
    restart = f"harvester start {starts + 1} on this store: the run is taken up again"
    out += [Event(now, EventKind.HARVESTER_RESTART, detail=restart)]
    out += [Event(now, EventKind.HARVESTER_RESTART, job=j, detail=restart) for j in jobs]
    return out
