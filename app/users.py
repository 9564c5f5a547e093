"""Manage the users file: `python -m app.users add NAME [--role staff|user] [--file users.json]`.

The password is read from the terminal (or one line of stdin with --password-stdin) and only
its hash is written.
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path
from typing import Optional

from werkzeug.security import generate_password_hash

from .auth import ROLES, Users


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.users", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    add = sub.add_parser("add", help="add a user or change their password/role")
    add.add_argument("name")
    add.add_argument("--role", choices=ROLES, default="user")
    add.add_argument("--file", type=Path, default=Path("users.json"))
    add.add_argument("--password-stdin", action="store_true")
    rm = sub.add_parser("remove", help="remove a user")
    rm.add_argument("name")
    rm.add_argument("--file", type=Path, default=Path("users.json"))
    args = ap.parse_args(argv)
    rows = []
    if args.file.exists():
        try:
            Users.parse(args.file.read_text(), str(args.file))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        rows = json.loads(args.file.read_text())["users"]
    rows = [r for r in rows if r["name"] != args.name]
    if args.cmd == "add":
        if not args.name.strip() or not args.name.isprintable():
            print("error: the name must be printable text", file=sys.stderr)
            return 2
        pw = sys.stdin.readline().rstrip("\n") if args.password_stdin else getpass.getpass()
        if len(pw) < 8:
            print("error: the password needs at least 8 characters", file=sys.stderr)
            return 2
        rows.append({"name": args.name, "role": args.role, "password_hash": generate_password_hash(pw)})
    tmp = args.file.with_suffix(args.file.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"users": rows}, fh, indent=2)
    os.replace(tmp, args.file)
    print(f"{args.cmd}: {args.name} ({args.file})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
