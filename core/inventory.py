"""The node inventory: which machines the harvester may run workers on, and how to reach them.

Plain format, one node per line (whitespace separated, `#` starts a comment, blank lines ok):

    # name      [ssh-target]        [slots]
    gpu01                                      # ssh to "gpu01", 1 slot
    gpu02       alice@gpu02.lab                # 1 slot
    gpu03       gpu03-via-bastion   4          # a Host alias of ~/.ssh/config, 4 slots
    gpu04       2                              # two fields, the second all digits: slots

CSV format: the same columns under a header line `name,target,slots` (target and slots may be
empty, or the columns left out). The target defaults to the name. Errors name the file and line.
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from .errors import InputError
from .transports.base import NodeSpec

#: node names end up in the store, URLs and log file names
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MAX_SLOTS = 1024


def _target_problem(target: str) -> str | None:
    if target.startswith("-"):
        return "an ssh target must not start with '-'"
    if any(c.isspace() or ord(c) < 32 or c in "'\"`$;&|<>\\" for c in target):
        return "an ssh target must not contain spaces, quotes or shell characters"
    return None


def _slots(text: str, path: str, line: int) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_SLOTS:
        raise InputError(path, line, f"slots must be a whole number from 1 to {MAX_SLOTS}, not {text!r}")
    return int(text)


def _node(path: str, line: int, name: str, target: str, slots: str) -> NodeSpec:
    if not NAME.match(name):
        raise InputError(path, line, f"bad node name {name!r} (letters, digits, '.', '_', '-')")
    target = target or name
    problem = _target_problem(target)
    if problem:
        raise InputError(path, line, f"{problem}: {target!r}")
    return NodeSpec(name, target, _slots(slots, path, line) if slots else 1)


def parse_inventory(text: str, path: str = "<inventory>") -> list[NodeSpec]:
    """Nodes in file order. InputError (file:line: message) on the first problem."""
    lines = text.splitlines()
    first = next((i for i, l in enumerate(lines) if l.strip() and not l.lstrip().startswith("#")), None)
    if first is None:
        raise InputError(path, None, "no nodes in the inventory")
    header = lines[first].strip().lower()
    rows: list[tuple[int, str, str, str]] = []
    if header.startswith("name,") or header == "name":
        cols = [c.strip() for c in next(csv.reader([header]))]
        unknown = [c for c in cols if c not in ("name", "target", "slots")]
        if unknown or len(set(cols)) != len(cols):
            raise InputError(path, first + 1, f"CSV header must be name,target,slots, not {lines[first].strip()!r}")
        reader = csv.reader(io.StringIO("\n".join(lines[first + 1:])))
        for rec in reader:
            n = first + 1 + reader.line_num
            if not rec or not "".join(rec).strip() or rec[0].lstrip().startswith("#"):
                continue
            if len(rec) > len(cols):
                raise InputError(path, n, f"{len(rec)} fields, the header has {len(cols)}")
            d = dict(zip(cols, (v.strip() for v in rec)))
            rows.append((n, d.get("name", ""), d.get("target", ""), d.get("slots", "")))
    else:
        for n, raw in enumerate(lines, start=1):
            fields = raw.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) > 3:
                raise InputError(path, n, f"expected 'name [ssh-target] [slots]', got {len(fields)} fields")
            if len(fields) == 2 and fields[1].isdigit():
                fields = [fields[0], "", fields[1]]
            fields += [""] * (3 - len(fields))
            rows.append((n, *fields))
    nodes: list[NodeSpec] = []
    seen: dict[str, int] = {}
    for n, name, target, slots in rows:
        if not name:
            raise InputError(path, n, "missing node name")
        if name in seen:
            raise InputError(path, n, f"node {name!r} is already on line {seen[name]}")
        seen[name] = n
        nodes.append(_node(path, n, name, target, slots))
    if not nodes:
        raise InputError(path, None, "no nodes in the inventory")
    return nodes


def load_inventory(path: str | Path) -> list[NodeSpec]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(str(p), None, f"cannot read the inventory: {e}") from e
    return parse_inventory(text, str(p))


def local_nodes(n: int, slots: int = 1, prefix: str = "local-") -> list[NodeSpec]:
    """`n` pretend nodes for local mode: local-0 .. local-{n-1}, no ssh target."""
    if n < 0 or slots < 1:
        raise ValueError("need n >= 0 and slots >= 1")
    return [NodeSpec(f"{prefix}{i}", "", slots) for i in range(n)]
