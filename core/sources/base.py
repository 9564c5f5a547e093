"""Node sources: where idle nodes come from (trace replay, a static list, a batch scheduler).

One interface, one module per backend. A replayed source is pulled by the replay loop; live
sources (later: Slurm) push the same Event records into the controller.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator

from ..model import Event


class NodeSource(ABC):
    name: str = ""

    @abstractmethod
    def node_names(self) -> list[str]:
        """Every node this source may offer, in the machine's order (for the grid)."""

    @abstractmethod
    def initial_idle(self) -> list[str]:
        """Nodes idle when the source starts."""

    @abstractmethod
    def batches(self) -> Iterator[tuple[float, list[Event]]]:
        """(time, events) groups in time order; each group is handled as one re-allocation."""


class LiveNodeSource(ABC):
    """A source that runs in wall time: the live loop polls it for what changed since last time."""

    name: str = ""

    @abstractmethod
    def node_names(self) -> list[str]:
        """Every node this source may offer, in the machine's order (for the grid)."""

    @abstractmethod
    def initial_idle(self) -> list[str]:
        """Nodes idle when the source starts."""

    @abstractmethod
    def poll(self, now: float) -> list[Event]:
        """Joins and leaves since the last poll (leaves must be acted on before anything else)."""

    def close(self) -> None:
        """Let go of whatever the source holds (pilot jobs, connections)."""
