"""Writing the controller's batches to the store without ever stopping the run: a write that
fails keeps its rows, merged into the next batch, and says why (`problem`) until one works."""
from __future__ import annotations

import logging
from typing import Optional

from .store import Batch, Store, StoreWriteError

log = logging.getLogger("core.controller")


class StoreWriter:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._unwritten: Optional[Batch] = None   # a flush that failed, written again by the next
        self.problem: Optional[str] = None        # why the last write failed; None once one works
        self.failing_since: Optional[float] = None

    def write(self, batch: Batch, now: float) -> None:
        """Write this batch after any that failed before."""
        if self._unwritten is not None:
            batch = self._unwritten.merge(batch)
        try:
            self.store.write(batch)
        except StoreWriteError as e:
            if self.problem is None:
                log.error("store write failed, keeping %d rows to write again: %s", batch.rows, e)
                self.failing_since = now
            self._unwritten, self.problem = batch, str(e)
            return
        if self.problem is not None:
            log.warning("store writes again (%d rows kept while it failed are saved)", batch.rows)
        self._unwritten = self.problem = self.failing_since = None

    @property
    def unsaved_rows(self) -> int:
        """Rows kept in memory because the store failed (0 while it works)."""
        return self._unwritten.rows if self._unwritten is not None else 0
