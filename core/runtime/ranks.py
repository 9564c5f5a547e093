"""Ranks on nodes: how the worker processes of a multi-GPU node are named and numbered.

A node with `slots` GPUs runs one worker process per slot. The coordinator knows workers by a
*worker key*: the node name for a node with one slot (so 1-slot jobs look exactly as before),
`node:i` for slot i of a node with several (node names never contain ':', core/inventory.py).
The node stays the unit of allocation: a generation's members list every key of each node, one
node after the other, so the ranks of a node are consecutive and its slot order is its local
rank order. Everything a rank knows about its place (torchrun's names) follows from the members
list and its own key, see `place`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

SEP = ":"

#: torchrun's names for a rank's place, set in each worker's environment (updated every generation)
ENV_RANK, ENV_WORLD_SIZE = "RANK", "WORLD_SIZE"
ENV_LOCAL_RANK, ENV_LOCAL_WORLD_SIZE = "LOCAL_RANK", "LOCAL_WORLD_SIZE"
ENV_NODE_RANK, ENV_GROUP_RANK = "NODE_RANK", "GROUP_RANK"


def worker_key(node: str, slot: int, slots: int) -> str:
    """The coordinator's name of slot `slot` of `node` (which has `slots` slots)."""
    if not 0 <= slot < slots:
        raise ValueError(f"slot {slot} of {node} is outside 0..{slots - 1}")
    return node if slots == 1 else f"{node}{SEP}{slot}"


def keys_of(node: str, slots: int) -> list[str]:
    """Every worker key of `node`, in local-rank order."""
    return [worker_key(node, i, slots) for i in range(slots)]


def node_of(key: str) -> str:
    return key.split(SEP, 1)[0]


def slot_of(key: str) -> int:
    _, sep, slot = key.partition(SEP)
    return int(slot) if sep else 0


def nodes_of(keys: Iterable[str]) -> list[str]:
    """The distinct nodes of `keys`, in order of first appearance."""
    return list(dict.fromkeys(node_of(k) for k in keys))


@dataclass(frozen=True)
class Place:
    """Where one rank sits in a generation (torchrun's RANK, WORLD_SIZE, ... of it)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nodes: int

    def env(self) -> dict[str, str]:
        return {ENV_RANK: str(self.rank), ENV_WORLD_SIZE: str(self.world_size),
                ENV_LOCAL_RANK: str(self.local_rank), ENV_LOCAL_WORLD_SIZE: str(self.local_world_size),
                ENV_NODE_RANK: str(self.node_rank), ENV_GROUP_RANK: str(self.node_rank)}


def place(members: Sequence[str], key: str) -> Place:
    """The place of worker `key` among `members` (a generation's worker keys, ranks in order).
    The local rank is the key's slot (its device), not its position among the node's members:
    a node whose other ranks were left out keeps its device binding."""
    members = list(members)
    if key not in members:
        raise ValueError(f"{key} is not a member of {members}")
    node = node_of(key)
    nodes = nodes_of(members)
    return Place(rank=members.index(key), world_size=len(members), local_rank=slot_of(key),
                 local_world_size=sum(1 for k in members if node_of(k) == node),
                 node_rank=nodes.index(node), nodes=len(nodes))
