"""Workers that outlive the harvester (Slurm pilots): what is kept on disk so that a restarted
harvester serves each job's store on the same port with the same secret, and how the workers
that rejoined it are taken back. Used by `WorkerDispatcher.resume` and its poll."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

from ..privatefiles import write_private
from ..runtime import ranks
from ..transports.base import Handle, NodeSpec, Transport


class _Adopting(Protocol):
    handles: dict[str, Handle]
    incarnation: dict[str, int]
    target: list[str]


def kept_path(logdir: Path, job_id: str) -> Path:
    """Where a job's coordinator identity is kept while it runs (mode 0600)."""
    return logdir / job_id / "coordinator.json"


def keep(logdir: Path, job_id: str, port: int, secret: str, token: str) -> None:
    (logdir / job_id).mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(kept_path(logdir, job_id), json.dumps({"port": port, "secret": secret, "token": token}))


def load_kept(logdir: Path, job_id: str) -> Optional[dict]:
    """The kept identity, or None when there is none or it is not one."""
    try:
        kept = json.loads(kept_path(logdir, job_id).read_text())
        ok = isinstance(kept, dict) and isinstance(kept.get("port"), int) and 0 < kept["port"] < 65536 \
            and all(isinstance(kept.get(k), str) and len(kept[k]) >= 16 for k in ("secret", "token"))
    except (OSError, ValueError):
        return None
    return kept if ok else None


def take_rejoined(run: _Adopting, job_id: str, rejoined: dict[str, tuple[int, int]], transport: Transport,
                  specs: dict[str, NodeSpec], keys: Callable[[Sequence[str]], list[str]]) -> bool:
    """Take the handles of the workers that rejoined (their pilot listed them when it
    redialed); whether every node the job should have is back."""
    for key, (inc, _pid) in rejoined.items():
        node = ranks.node_of(key)
        if key in run.handles or node not in specs:
            continue
        h = transport.adoptable(specs[node], job_id, key, inc)
        if h is not None:
            run.handles[key] = h
            run.incarnation[key] = inc
    return all(k in run.handles for k in keys(run.target))


def settle(run: _Adopting, members: list[str], keys: Callable[[Sequence[str]], list[str]]
           ) -> tuple[list[str], list[str], list[str]]:
    """When adoption is over: (nodes whose every rank rejoined, in rank order, which become the
    run's target; nodes with only part of their ranks back, to be retired; the nodes the job
    asked for, adopted ones first, for the resize that follows)."""
    asked = run.target
    nodes = {ranks.node_of(k) for k in run.handles}
    whole = [n for n in nodes if all(k in run.handles for k in keys([n]))]
    order = {k: i for i, k in enumerate(members)}
    whole.sort(key=lambda n: min(order.get(k, len(order)) for k in keys([n])))
    want = [n for n in whole if n in asked] + [n for n in asked if n not in whole]
    return whole, sorted(nodes - set(whole)), want
