"""ISO-8601 <-> epoch seconds, as the data files and the store write times."""
from __future__ import annotations

from datetime import datetime, timezone
from functools import lru_cache


@lru_cache(maxsize=65536)
def parse_iso(text: str) -> float:
    """`2021-02-10T00:48:48Z` -> epoch seconds (UTC when no zone is given)."""
    dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
