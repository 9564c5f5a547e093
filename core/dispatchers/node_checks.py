"""The checks of held-out nodes (node_health.py keeps the book): a check is any command at all
over the node's transport, run off the controller's thread; a node whose check passes comes
back (a join), one whose check fails waits longer; staff may clear one by hand."""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from ..model import Event, EventKind
from ..transports.base import NodeSpec, Transport, TransportError
from .node_health import NodeHealth

log = logging.getLogger(__name__)
#: a held-out node's check: any command at all over its transport, within this
NODE_CHECK_TIMEOUT_S = 10.0


def check(transport: Transport, spec: Optional[NodeSpec], health: NodeHealth, post: Callable[[Event], None],
          node: str) -> None:
    """Check held-out `node` (`spec`: None when it left the inventory: it is let go)."""
    if spec is None:
        health.passed(node)
        return
    try:
        rc, _, err = transport.run(spec, ["true"], NODE_CHECK_TIMEOUT_S)
        why = "" if rc == 0 else (err.strip().splitlines() or [f"exit status {rc}"])[-1]
    except TransportError as e:
        why = e.message
    except Exception as e:         # a check must never kill the pool's thread
        why = f"{type(e).__name__}: {e}"
    if why:
        wait_s = health.failed(node, why)
        log.info("node %s still held out: its check failed (%s); checked again in %.0f s", node, why, wait_s)
        return
    sick = health.passed(node)
    if sick is not None:
        out_s = time.time() - sick.since
        log.info("node %s is back: a check passed %.0f s after it was lost (%s)", node, out_s, sick.reason)
        post(Event(time.time(), EventKind.NODE_JOIN, node=node, detail=(
            f"back: a check passed {out_s:.0f} s after it was lost ({sick.reason})")))


def clear(health: NodeHealth, post: Callable[[Event], None], node: str) -> bool:
    """Staff vouch for a held-out node: it is offered again at once. False if it was not held out."""
    sick = health.clear(node)
    if sick is None:
        return False
    log.info("node %s cleared by staff: offered again (was lost: %s)", node, sick.reason)
    post(Event(time.time(), EventKind.NODE_JOIN, node=node, detail="cleared by staff"))
    return True
