"""Whether a torchrun generation's ranks formed their process group, read from rank 0's own store.

An unmodified script calls `init_process_group("env://")`: rank 0 starts a c10d TCPStore on
MASTER_ADDR:MASTER_PORT (the harvester picked both) and waits there until WORLD_SIZE ranks (the
world size the *script* gives, which the harvester cannot see) have dialled in; every rank counts
itself in the store's `init/` key, and gloo then publishes one address per rank
(`default_pg/0//cpu//0/<rank>`) before it connects them all. So, from outside and without
importing anything of the job's, one connection to that store tells which ranks arrived:

- `init/` below the ranks started: the missing ranks never reached init_process_group (named
  exactly where gloo's keys say which ranks did);
- every started rank counted, gloo's keys of ranks 1.. there and rank 0's not: rank 0 waits for
  ranks that were never started (a world size not read from WORLD_SIZE);
- every started rank counted and no key of the group at all: nothing formed a group (the W == 1
  case of the above, or a backend that never reached its first collective).

All three are `rendezvous` failures of the job's own (never `hung`, which says a node stopped
answering and sends the job back to the queue: core/requeue.py).

`read_store` speaks the store's wire protocol (VALIDATE, LIST_KEYS, GET) on a plain socket with a
short timeout: nothing is written to the job's store, the harvester's log gets none of c10d's
retry warnings, and anything unexpected (no store yet, another server on the port, another
protocol) reads as "not known", never as a verdict. Pure policy besides that one read.
"""
from __future__ import annotations

import re
import socket
import struct
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .. import failures
from ..failures import Failure

_VALIDATE, _GET, _LIST_KEYS = 0, 3, 17          # c10d::detail::QueryType
_MAGIC = 0x3C85F7CE                            # c10d::detail::validationMagicNumber
INIT_KEY = "init/"                             # TCPStore's count of the ranks that dialled in
_RANK_KEY = re.compile(r"^/?default_pg/.*/(?:cpu|cuda)//\d+/(\d+)$")   # gloo: one address per rank
_GROUP_KEY = re.compile(r"^/?default_pg/")
_MAX_KEYS = 100_000
_MAX_LEN = 1 << 20
SHOWN = 8                                      # ranks named in one message


@dataclass(frozen=True)
class StoreView:
    """What rank 0's store holds: `joined`, the ranks that counted themselves in (None where the
    store keeps no count); `published`, the ranks whose gloo group published its address;
    `group`, whether any other key of the default process group is there (an NCCL id: its first
    collective)."""
    joined: Optional[int]
    published: frozenset = field(default_factory=frozenset)
    group: bool = False


def read_store(host: str, port: int, timeout_s: float = 2.0) -> Optional[StoreView]:
    """One look at the c10d store on host:port; None where there is none or it does not answer
    like one."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sk:
            sk.settimeout(timeout_s)
            sk.sendall(struct.pack("<BIB", _VALIDATE, _MAGIC, _LIST_KEYS))
            count = _u64(sk)
            if count > _MAX_KEYS:
                return None
            keys = [_string(sk).decode("utf-8", "replace") for _ in range(count)]
            joined = None
            if INIT_KEY in keys:
                key = INIT_KEY.encode()
                sk.sendall(struct.pack("<BQ", _GET, len(key)) + key)
                joined = int(_string(sk).decode("ascii"))
    except (OSError, ValueError, UnicodeError, struct.error):
        return None
    published = frozenset(int(m.group(1)) for k in keys if (m := _RANK_KEY.match(k)))
    group = any(_GROUP_KEY.match(k) and not _RANK_KEY.match(k) for k in keys)
    return StoreView(joined, published, group)


def formed(view: Optional[StoreView], world: int) -> bool:
    """The generation's group formed: every rank published its address, or a collective began."""
    return view is not None and (view.group or view.published >= set(range(world)))


def verdict(view: Optional[StoreView], nodes: Sequence[str], address: str, waited_s: float) -> Optional[Failure]:
    """The failure of a generation whose group did not form within `waited_s` of its start, as
    `view` shows it (`nodes`: the node of each rank, rank order); None where it does not tell."""
    world = len(nodes)
    if view is None or view.joined is None or formed(view, world):
        return None
    if view.joined < world:
        arrived = set(view.published) | {0}                 # rank 0 hosts the store
        candidates = [r for r in range(world) if r not in arrived]
        missing = world - view.joined
        if not candidates or missing > len(candidates):
            return None
        exact = missing == len(candidates)
        who = _ranks(candidates, nodes) if exact else f"{missing} of {_ranks(candidates, nodes)}"
        first = nodes[candidates[0]]
        hint = (f"those ranks are alive but never reached rank 0's store: every rank must call "
                f"init_process_group with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from its environment, "
                f"and its node must reach {address} (a firewall, or the wrong interface: GLOO_SOCKET_IFNAME / "
                f"NCCL_SOCKET_IFNAME through --worker-env); their logs are on the job page")
        failure = failures.named(failures.RENDEZVOUS, (
            f"{who} never joined the rendezvous at {address} within {waited_s:.0f} s "
            f"({view.joined} of {world} ranks reached init_process_group)"), first, hint=hint)
        failure.address = address
        return failure
    started = "rank 0" if world == 1 else f"ranks 0-{world - 1}"
    never = f"rank{'s' if world > 1 else ''} {world} and up never arrive: none was started"
    hint = (f"the script sets its own world size (a hard-coded world_size=, a --world-size argument): give "
            f"init_process_group RANK and WORLD_SIZE from the environment, which the harvester sets anew "
            f"({world} now) on every restart")
    if view.published and view.published >= set(range(1, world)) and 0 not in view.published:
        failure = failures.named(failures.RENDEZVOUS, (
            f"rank 0 waits in the rendezvous at {address} for more ranks than the {world} started "
            f"(WORLD_SIZE={world}): {never}; {started} all reached init_process_group "
            f"({waited_s:.0f} s)"), nodes[0], hint=hint)
        failure.address = address
        return failure
    if not view.published:      # the script's doing, not a hung node's (blame.node_caused, requeue.py)
        failure = failures.named(failures.RENDEZVOUS, (
            f"no process group formed within {waited_s:.0f} s: {started} reached init_process_group at "
            f"{address}, no rank its first collective; where the script sets its own world size, rank 0 "
            f"waits there for more ranks than the {world} started (WORLD_SIZE={world}): {never}"), nodes[0],
            hint=hint + "; a script that calls init_process_group long before its first collective fails "
                        "this way too (--rendezvous-timeout)")
        failure.address = address
        return failure
    return None


def _ranks(ranks: list[int], nodes: Sequence[str]) -> str:
    """'rank 2 (node1)', 'ranks 2 (node1), 3 (node1)', at most SHOWN of them."""
    shown = ", ".join(f"{r} ({nodes[r]})" for r in ranks[:SHOWN])
    more = f" and {len(ranks) - SHOWN} more" if len(ranks) > SHOWN else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{more}"


def _u64(sk: socket.socket) -> int:
    return struct.unpack("<Q", _exactly(sk, 8))[0]


def _string(sk: socket.socket) -> bytes:
    n = _u64(sk)
    if n > _MAX_LEN:
        raise ValueError("a value longer than a store key")
    return _exactly(sk, n)


def _exactly(sk: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sk.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the store closed the connection")
        buf += chunk
    return bytes(buf)
