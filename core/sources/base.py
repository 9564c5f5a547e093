"""Node sources: where idle nodes come from (trace replay, a static list, a batch scheduler).

One interface, one module per backend. A replayed source is pulled by the replay loop; live
sources (a static list, Slurm) are polled by the live loop for the same Event records.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Callable, Collection, Iterator, Optional

from ..model import Event

#: SourceStatus.state values
SOURCE_OK, SOURCE_STALE, SOURCE_DRY_RUN = "ok", "stale", "dry-run"


@dataclass(frozen=True)
class SourceStatus:
    """How much the harvester can trust what its source says now, for the dashboard: `stale`
    when the batch scheduler cannot be asked (the nodes and jobs held are kept meanwhile)."""
    name: str
    state: str = SOURCE_OK
    detail: str = ""
    since: Optional[float] = None     # wall clock of the last change of state
    held: Optional[int] = None        # nodes the source holds at a cost (pilots); None: not such a source
    used: Optional[int] = None        # of those, nodes the jobs use

    def to_dict(self) -> dict:
        return asdict(self)


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
    #: staff play the node owner by hand (`reclaim`, `release`): a static list, not a scheduler
    operated_by_hand: bool = False
    clears_failures: bool = False     # staff may clear a node it skips after failures (`clear`)

    @abstractmethod
    def node_names(self) -> list[str]:
        """Every node this source may offer, in the machine's order (for the grid)."""

    @abstractmethod
    def initial_idle(self) -> list[str]:
        """Nodes idle when the source starts."""

    @abstractmethod
    def poll(self, now: float) -> list[Event]:
        """Joins and leaves since the last poll (leaves must be acted on before anything else)."""

    def capacity(self) -> int:
        """The most nodes this source can ever offer at once (a job needing more can never run)."""
        return len(self.node_names())

    def start(self, wake: Optional[Callable[[], None]] = None) -> None:
        """Begin watching. A source that learns of a leave between polls calls `wake()` so that
        the live loop polls it at once instead of at its next tick."""

    def status(self) -> SourceStatus:
        return SourceStatus(self.name)

    def node_states(self) -> dict[str, str]:
        """What the source itself says about each node (e.g. Slurm's state), for the grid."""
        return {}

    def want(self, nodes: int, in_use: Collection[str]) -> None:
        """The jobs could use `nodes` nodes and hold `in_use` now (each live tick): a source that
        holds nodes at a cost (Slurm pilots) holds no more than that; others ignore it."""

    def address_of(self, node: str) -> Optional[str]:
        """Where `node` is reached, as its scheduler says (None: the source does not know)."""
        return None

    def reclaim(self, node: str, now: float) -> None:
        """The owner wants `node` back (only where `operated_by_hand`); KeyError for an unknown node."""
        raise NotImplementedError(f"{self.name} nodes are not operated by hand")

    def release(self, node: str, now: float) -> None:
        """The owner gives `node` again (only where `operated_by_hand`)."""
        raise NotImplementedError(f"{self.name} nodes are not operated by hand")

    def clear(self, node: str) -> bool:
        """Staff cleared a node the source skips after failures (only where `clears_failures`);
        whether it was skipped. KeyError for an unknown node."""
        raise NotImplementedError(f"{self.name} skips no node after failures")

    def close(self) -> None:
        """Let go of whatever the source holds (pilot jobs, connections)."""
