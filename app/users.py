"""Manage the users file: `python -m app.users add|passwd|remove NAME [--file users.json]`
(`add ... --unix ACCOUNT`: the Unix account the user's jobs run as, see `python -m app --run-as`;
`--account NAME`: the account or project their usage is reported under, `GET /api/usage?by=account`;
`--max-nodes N`, `--node-hours-per-day H`, `--node-hours-per-week H`: the user's quota, and
`--share S`: their fair share, see docs/operators/quotas.md; the file's `quota_defaults` and
`accounts` are kept as they are).

The password is read from the terminal (or one line of stdin with --password-stdin) and only
its hash is written. A running server re-reads the file within a second: `passwd` revokes the
user's API tokens and logs out their browsers.
"""
from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import Optional

from werkzeug.security import generate_password_hash

from core.privatefiles import write_private
from core.quotas import parse_share
from core.settings import UNIX_NAME

from .auth import ACCOUNT_MAX, ROLES, Users

MIN_PASSWORD = 8


class Refusal(Exception):
    """A command refused, with the message for the user."""


def read_password(from_stdin: bool) -> str:
    pw = sys.stdin.readline().rstrip("\n") if from_stdin else getpass.getpass()
    if len(pw) < MIN_PASSWORD:
        raise Refusal(f"the password needs at least {MIN_PASSWORD} characters")
    return pw


def read_file(path: Path) -> dict:
    """The users file as it stands (its quota defaults and accounts with the users)."""
    if not path.exists():
        return {"users": []}
    try:
        Users.parse(path.read_text(), str(path))
    except ValueError as e:
        raise Refusal(str(e))
    return json.loads(path.read_text())


def apply(args: argparse.Namespace, rows: list[dict]) -> list[dict]:
    """The users file's rows after the command."""
    others = [r for r in rows if r["name"] != args.name]
    mine = next((r for r in rows if r["name"] == args.name), None)
    if args.cmd == "remove":
        if mine is None:
            raise Refusal(f"no user {args.name} in {args.file}")
        return others
    if args.cmd == "passwd":
        if mine is None:
            raise Refusal(f"no user {args.name} in {args.file}; add them with: python -m app.users add {args.name}")
        return others + [{**mine, "password_hash": generate_password_hash(read_password(args.password_stdin))}]
    if not args.name.strip() or not args.name.isprintable():
        raise Refusal("the name must be printable text")
    if args.unix and not UNIX_NAME.match(args.unix):
        raise Refusal(f"--unix: {args.unix!r} is not a Unix account name (lower case, at most 32 characters)")
    account = args.account.strip()
    if not account.isprintable() or len(account) > ACCOUNT_MAX:
        raise Refusal(f"--account: give printable text of at most {ACCOUNT_MAX} characters")
    row = {"name": args.name, "role": args.role,
           "password_hash": generate_password_hash(read_password(args.password_stdin))}
    if args.unix:
        row["unix"] = args.unix
    if account:
        row["account"] = account
    quota = {k: v for k, v in (("max_nodes", args.max_nodes), ("node_hours_per_day", args.node_hours_per_day),
                                 ("node_hours_per_week", args.node_hours_per_week)) if v is not None}
    if any(v < 0 for v in quota.values()):
        raise Refusal("--max-nodes, --node-hours-per-day and --node-hours-per-week take numbers of at least 0")
    if quota:
        row["quota"] = quota
    if args.share is not None:
        try:
            row["share"] = parse_share(args.share, "--share")    # the users file's own rule
        except ValueError:
            raise Refusal("--share takes a positive number") from None
    return others + [row]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.users", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    add = sub.add_parser("add", help="add a user or change their password/role")
    add.add_argument("--role", choices=ROLES, default="user")
    add.add_argument("--unix", default="", metavar="ACCOUNT",
                     help="the Unix account this user's jobs run as (with python -m app --run-as); add "
                          "replaces the user's entry, so leaving it out removes a mapping")
    add.add_argument("--account", default="", metavar="NAME",
                     help="the account or project this user's usage is reported under (GET /api/usage?by=account)")
    add.add_argument("--max-nodes", type=int, metavar="N",
                     help="the most nodes this user's jobs may hold at once (else the file's quota_defaults)")
    add.add_argument("--node-hours-per-day", type=float, metavar="H",
                     help="node-hours this user's jobs may use per UTC day (else the file's quota_defaults)")
    add.add_argument("--node-hours-per-week", type=float, metavar="H",
                     help="node-hours per week, from Monday 00:00 UTC (else the file's quota_defaults)")
    add.add_argument("--share", type=float, metavar="S",
                     help="this user's fair share when the allocator runs with --objective fairshare (default 1)")
    pw = sub.add_parser("passwd", help="change a user's password (their tokens and logins stop working)")
    rm = sub.add_parser("remove", help="remove a user")
    for p in (add, pw, rm):
        p.add_argument("name")
        p.add_argument("--file", type=Path, default=Path("users.json"))
    for p in (add, pw):
        p.add_argument("--password-stdin", action="store_true", help="read the password from one line of stdin")
    args = ap.parse_args(argv)
    try:
        doc = read_file(args.file)
        rows = apply(args, doc["users"])
    except Refusal as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_private(args.file, json.dumps({**doc, "users": rows}, indent=2))
    print(f"{args.cmd}: {args.name} ({args.file})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
