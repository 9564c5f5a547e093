"""The grid update each browser gets, built once per pair of snapshots and shared.

Every viewer of the cluster page polls the grid once a second with the key of the snapshot it
holds, so at any moment the viewers hold one of a few recent snapshots: building the per-cell
diff and encoding it for each of them would repeat the same work once per viewer, and
with hundreds of viewers that work is most of the server's CPU. Here the update from one
snapshot to another is built by the first viewer that asks for it; viewers asking for the same
pair meanwhile wait for that build instead of starting their own, and later ones get the same
object. A few recent pairs are kept (the viewers of one snapshot hold one of the last few), so
the memory stays bounded whatever the number of viewers.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable, Generic, Hashable, TypeVar

T = TypeVar("T")
#: pairs kept: a viewer polls once a second and the replay ticks every 0.5 s, so the viewers of
#: the current snapshot hold one of its last few predecessors (or none: a new page)
DEFAULT_KEEP = 8


class UpdateCache(Generic[T]):
    """A small, thread-safe, least-recently-used map from a pair of snapshots to its update,
    each value built once (concurrent askers of a pair being built wait for it)."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep at least one update, not {keep}")
        self.keep = keep
        self.builds = 0                      # how many values were built (tests, benchmarks)
        self._entries: OrderedDict[Hashable, Future] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """The value for `key`, calling `build` (outside the lock) only if no one has yet. A
        build that raises is not kept: every waiter gets the error and the next ask builds again."""
        with self._lock:
            entry = self._entries.get(key)
            mine = entry is None
            if mine:
                entry = self._entries[key] = Future()
                self.builds += 1
                while len(self._entries) > self.keep:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(key)
        if mine:
            try:
                entry.set_result(build())
            except BaseException as e:
                with self._lock:
                    if self._entries.get(key) is entry:
                        del self._entries[key]
                entry.set_exception(e)
        return entry.result()
