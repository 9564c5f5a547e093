"""`python -m app check --nodes FILE`: the checks a harvester makes of its ssh nodes before it
trusts them, from the command line, before a first job (see README, "Three machines")."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from core.assemble import check_inventory
from core.errors import InputError


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app check", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", required=True, metavar="FILE", help="the inventory: one 'name [ssh-target [slots]]' a line")
    ap.add_argument("--ssh-config", type=Path, default=None, metavar="FILE", help="ssh's config (-F)")
    ap.add_argument("--workdir", default="", metavar="DIR", help="the jobs' working folder: it must exist on every node")
    ap.add_argument("--command", default="", metavar="PROGRAM",
                    help="a job's interpreter (e.g. .venv/bin/python, relative to --workdir): it must exist there")
    ap.add_argument("--advertise", default="", metavar="HOST",
                    help="the address nodes dial the harvester at: a port is opened there and dialled from each node")
    ap.add_argument("--bind", default="", metavar="HOST", help="where that port listens (default: --advertise)")
    args = ap.parse_args(argv)
    try:
        checks = check_inventory(Path(args.nodes), args.ssh_config, args.workdir, args.command, args.advertise,
                                 args.bind)
    except (InputError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    width = max((len(n) for n in checks), default=4)
    for name, c in checks.items():
        print(f"{name:<{width}}  {'ok  ' if c.ok else 'FAIL'}  {c.line()}")
    bad = [n for n, c in checks.items() if not c.ok]
    print(f"{len(checks) - len(bad)} of {len(checks)} nodes passed" + (f"; not used: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0
