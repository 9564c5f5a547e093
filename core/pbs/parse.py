"""Reading PBS's JSON (`pbsnodes -av -F json`, `qstat -f -F json`) into records. Anything that
is not the shape PBS prints raises `Unreadable` naming what was wrong, so the user reads one
line instead of a wrong verdict later. Job times are strings and node times numbers in PBS's
JSON; neither is needed here."""
from __future__ import annotations

import json
import re
from typing import Any

from ..pilots.base import Unparsable
from .records import PbsJob, PbsNode

#: `(vn042:ncpus=1)+(vn043:ncpus=1)`: the vnode of each chunk
EXEC_VNODE = re.compile(r"\(([^:()+]+)")
VERSION = re.compile(r"pbs_version\s*=\s*([0-9][0-9A-Za-z.\-]*)")


class Unreadable(Unparsable):
    """PBS printed something this harvester cannot read."""


def parse_version(text: str) -> str:
    """`pbs_version = 23.06.06` (what `qstat --version` prints) -> '23.06.06'."""
    m = VERSION.search(text)
    if m is None:
        raise Unreadable(f"not a PBS version: {text.strip()[:100]!r}")
    return m[1]


def _load(text: str, key: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as e:
        raise Unreadable(f"the {what} are not JSON: {e}") from None
    if not isinstance(data, dict):
        raise Unreadable(f"the {what} are not a JSON object")
    items = data.get(key, {})
    if not isinstance(items, dict) or not all(isinstance(v, dict) for v in items.values()):
        raise Unreadable(f"the {what}' {key!r} is not an object of objects")
    return items


def _whole(value: Any, default: int = 0) -> int:
    """PBS prints counts as numbers or strings ('2'); anything else counts as `default`."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parse_nodes(text: str) -> list[PbsNode]:
    """`pbsnodes -av -F json`: every vnode, in PBS's order."""
    out = []
    for name, n in _load(text, "nodes", "nodes").items():
        state = n.get("state")
        if not isinstance(state, str) or not state:
            raise Unreadable(f"node {name!r} has no state")
        avail = n.get("resources_available") or {}
        jobs = n.get("jobs") or []
        if isinstance(jobs, str):
            jobs = [j for j in jobs.split(",")]
        ids = tuple(dict.fromkeys(str(j).strip().split("/")[0] for j in jobs if str(j).strip()))
        out.append(PbsNode(name=name, states=tuple(s.strip() for s in state.split(",") if s.strip()), jobs=ids,
                           ncpus=_whole(avail.get("ncpus")), ngpus=_whole(avail.get("ngpus")),
                           address=str(avail.get("host") or n.get("Mom") or ""), queue=str(n.get("queue") or "")))
    return out


def parse_jobs(text: str) -> list[PbsJob]:
    """`qstat -f -F json [ids]`: the jobs it lists."""
    out = []
    for jid, j in _load(text, "Jobs", "jobs").items():
        state = j.get("job_state")
        if not isinstance(state, str) or len(state) != 1:
            raise Unreadable(f"job {jid!r} has no job_state")
        m = EXEC_VNODE.search(str(j.get("exec_vnode") or ""))
        exit_status = j.get("Exit_status")
        out.append(PbsJob(id=jid, name=str(j.get("Job_Name", "")), job_state=state, vnode=m[1] if m else "",
                          queue=str(j.get("queue", "")), user=str(j.get("Job_Owner", "")).split("@")[0],
                          reason=str(j.get("comment", "")), run_count=_whole(j.get("run_count")),
                          exit_status=_whole(exit_status) if exit_status is not None else None))
    return out
