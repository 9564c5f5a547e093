"""When a node may get another pilot: pilots that fail count against their node.

A pilot that ends before it connects, or soon after, says something is wrong on that node (or
everywhere: a bad --slurm-python, an output folder the node lacks). Submitting a new one at
every poll would flood slurmctld and the accounting database, so each failure doubles the
node's wait (`base_s`, 2 x, 4 x, ... up to `cap_s`), a pilot that ran well clears it, staff may
clear it by hand, and no more than `per_minute` pilots are submitted in any minute overall.
Pure bookkeeping on a clock passed in (time.monotonic()), so it is tested without Slurm."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

#: a pilot that connected and then ended within this many seconds counts as failed
SHORT_LIFE_S = 30.0


@dataclass(frozen=True)
class NodeFailure:
    failures: int          # pilots in a row that failed on the node
    until: float           # monotonic: no pilot before then
    reason: str            # the last failure, in words


class PilotBackoff:
    def __init__(self, base_s: float = 20.0, cap_s: float = 600.0, per_minute: int = 120) -> None:
        self.base_s, self.cap_s, self.per_minute = base_s, cap_s, per_minute
        self._nodes: dict[str, NodeFailure] = {}
        self._sent: deque[float] = deque()

    def failed(self, node: str, reason: str, now: float) -> NodeFailure:
        """A pilot failed on `node`: its wait doubles (from `base_s`, at most `cap_s`)."""
        n = (self._nodes[node].failures if node in self._nodes else 0) + 1
        f = self._nodes[node] = NodeFailure(n, now + min(self.cap_s, self.base_s * 2 ** (n - 1)), reason)
        return f

    def succeeded(self, node: str) -> None:
        """A pilot held `node` well: its failures are forgotten."""
        self._nodes.pop(node, None)

    def clear(self, node: str) -> bool:
        """Staff cleared the node; whether it was failing."""
        return self._nodes.pop(node, None) is not None

    def waiting(self, node: str, now: float) -> bool:
        """Whether `node` must not get a pilot yet."""
        f = self._nodes.get(node)
        return f is not None and now < f.until

    def failure(self, node: str) -> Optional[NodeFailure]:
        return self._nodes.get(node)

    def failing(self) -> dict[str, NodeFailure]:
        """Every node whose last pilot failed (waiting or free to try again)."""
        return dict(self._nodes)

    def room(self, now: float) -> int:
        """How many pilots may be submitted now without passing `per_minute` in any minute."""
        while self._sent and self._sent[0] <= now - 60.0:
            self._sent.popleft()
        return max(0, self.per_minute - len(self._sent))

    def submitted(self, now: float) -> None:
        self._sent.append(now)
