"""Whose fault a lost node is: the node's, the job's, or neither's. Pure policy on named
failures (core/failures.py); the dispatcher acts on the verdicts.

- The node's (`node_caused`): it did not answer, its heartbeats stopped, or a signal that nobody
  in the job sends killed its workers (SIGKILL, SIGTERM, SIGHUP, SIGINT). The node is held out
  until a check passes (node_health.py); the job shrinks and trains on. It never counts
  against the job.
- Neither's (`consequence`): a rank saw a peer vanish, or a group that could not form because a
  member died. The node is fine and the job is not at fault.
- The job's own: everything else (an exception, an error status, out of memory, a crash signal
  such as SIGSEGV). A job over a cap of the site's (`limit`: its processes, its checkpoint
  folder; limits.py) fails at once, whatever killed its processes after. The job fails when the same error comes from every node it held, within
  `SAME_FAULT_S` of the first, or when its own errors follow it across `max_nodes` distinct
  nodes within the crash window; one node's error alone does not fail it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Collection, Optional

from .. import failures
from ..failures import Failure

#: errors from every node of the job within this many seconds of the first are one error, "everywhere"
SAME_FAULT_S = 10.0
#: signals that come from outside the script (an operator, a node going down, a scheduler): the node's
EXTERNAL_SIGNALS = frozenset({"SIGKILL", "SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT", "SIGPWR"})
_SIGNAL_NAME = re.compile(r"\b(SIG[A-Z]+)\b")
_ADDRESSES = re.compile(r"\[rank\d+\]:?\s*|(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?|0x[0-9a-f]+|\bpid \d+|\b\d{4,}\b", re.I)


def node_caused(failure: Failure) -> bool:
    """Lost for a reason of the node: not answering, silent, or killed from outside."""
    if failure.kind == failures.LIMIT:
        return False              # the harvester killed them for the job's own excess
    if failure.kind in (failures.UNREACHABLE, failures.HUNG):
        return True
    if failure.kind == failures.SIGNAL:
        m = _SIGNAL_NAME.search(failure.message)
        return m is None or m.group(1) in EXTERNAL_SIGNALS
    return False


def consequence(failure: Failure) -> bool:
    """A rank that failed because another one went away: nobody's fault on this node."""
    return failure.kind in (failures.PEER_LOST, failures.RENDEZVOUS) and not failures.loopback_rendezvous(failure)


def signature(failure: Failure) -> str:
    """What makes two nodes' errors "the same": the kind and the error line, less rank prefixes
    ("[rank2]: "), addresses, PIDs and long numbers (which differ from rank to rank)."""
    return failure.kind + ":" + _ADDRESSES.sub("#", failure.message.split("; last line:")[0])[:300]


@dataclass
class JobFaults:
    """One job's own errors, by node (see the module docstring)."""
    window_s: float
    max_nodes: int
    seen: list[tuple[float, str, str]] = field(default_factory=list)     # (time, node, signature)
    members: dict[str, frozenset[str]] = field(default_factory=dict)     # signature -> nodes held at its first

    def add(self, node: str, failure: Failure, held: Collection[str], now: float) -> Optional[str]:
        """A node's workers failed for the job's own reason; `held`: the nodes the job held just
        before. Why the job fails now, or None (it shrinks and trains on)."""
        sig = signature(failure)
        self.seen = [s for s in self.seen if now - s[0] < self.window_s]
        recent = {n for t, n, s in self.seen if s == sig and now - t < SAME_FAULT_S}
        if not recent:
            self.members[sig] = frozenset(held) | {node}
        self.seen.append((now, node, sig))
        same = recent | {node}
        everyone = self.members.get(sig, frozenset({node}))
        if same >= everyone:
            return (f"the same error on every node of the job ({len(same)})" if len(same) > 1 else
                    "the job's only node failed with its own error")
        nodes = {n for _, n, _ in self.seen}
        if len(nodes) >= self.max_nodes:
            return f"its own errors on {len(nodes)} distinct nodes within {self.window_s:g} s"
        return None

