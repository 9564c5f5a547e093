"""How many ranks (GPUs) each node runs. The node stays the unit of allocation, of curves and of
the grid; a job on k nodes runs the sum of their slots as ranks. This only counts, for the
snapshot, the API and /metrics: nothing here decides anything."""
from __future__ import annotations

from typing import Collection, Mapping, Optional

from .inventory import MAX_SLOTS

__all__ = ["MAX_SLOTS", "Slots"]


class Slots:
    """Slots per node: `by_node` where known (an inventory's third column, Slurm's GRES), else
    `default`. On a machine where every node has the same count (Summit: 6 V100s per node) sums
    are a multiplication, so a 4,734-node snapshot pays nothing for them."""

    def __init__(self, by_node: Optional[Mapping[str, int]] = None, default: int = 1) -> None:
        if not 1 <= default <= MAX_SLOTS:
            raise ValueError(f"slots per node must be from 1 to {MAX_SLOTS}, not {default}")
        self.default = default
        self.by_node = {n: s for n, s in (by_node or {}).items() if s != default}
        self._row: tuple[tuple[str, ...], tuple[int, ...]] = ((), ())

    def __call__(self, node: str) -> int:
        return self.by_node.get(node, self.default)

    @property
    def same(self) -> Optional[int]:
        """The one count every node has, or None when the counts differ (checked per node)."""
        return None if self.by_node else self.default

    def total(self, nodes: Collection[str]) -> int:
        """Slots of `nodes` together: the ranks a job on them runs, the GPUs of a set of nodes."""
        if not self.by_node:
            return len(nodes) * self.default
        return sum(self.by_node.get(n, self.default) for n in nodes)

    def common(self, nodes: Collection[str]) -> Optional[int]:
        """The count all of `nodes` share, None when they differ; with no nodes, the machine's
        own when it has one (what a job that holds nothing yet would get per node)."""
        if not self.by_node or not nodes:
            return self.same
        counts = {self(n) for n in nodes}
        return counts.pop() if len(counts) == 1 else None

    def row(self, names: tuple[str, ...]) -> tuple[int, ...]:
        """Slots of `names` in their order; the same tuple while the node list stays the same, so
        every snapshot shares one."""
        if self._row[0] is not names and self._row[0] != names:
            self._row = (names, tuple(self(n) for n in names))
        return self._row[1]
